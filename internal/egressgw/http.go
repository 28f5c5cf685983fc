package egressgw

// The HTTP front: each plain HTTP request, and each request of a TLS
// connection the gateway terminated for an inspected rule, decided by its
// Host and forwarded, or refused.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"strconv"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/modelapi"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// httpFront serves the HTTP connections of one gateway port.
type httpFront struct {
	ln  *handoff
	srv *http.Server
}

type ctxKey int

const (
	ruleKey ctxKey = iota
	eventKey
	dialledKey
	nameKey
	// exchangeKey holds the *exchange of the request.
	exchangeKey
)

// exchange is what the front knows of one forwarded request, beyond its
// Event: whether it may upgrade, and what its response must be scrubbed
// of.
type exchange struct {
	websocket bool
	// secrets are the gateway's when the request came: what is injected
	// and what the response is scanned for are of the same version.
	secrets []Secret
	// forms are the spellings of the secrets injected toward the name,
	// scanned for in the response (none: the response is not scanned).
	forms []secretForm
	found reflections
	// opened is set when a WebSocket's 101 was let through.
	opened func()
	// model reads a model host's call (nil: the rule names no API); mcp
	// an MCP server's exchange (nil: the rule is not api: mcp).
	model *modelTap
	mcp   *mcpTap
	// readErr is the error that cut the site's response short, if one did.
	readErr error
}

// cutBody keeps the error that ends a response's body other than at its
// end: the proxy only aborts the agent's connection then, and the record
// says why.
type cutBody struct {
	io.ReadCloser
	x *exchange
}

func (b cutBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && b.x.readErr == nil {
		b.x.readErr = err
	}
	return n, err
}

// modelTap reads a model call on its way: the request's body as it goes
// up, the response's as it comes down. Its parts run on the request's
// goroutines, one after the other; result is read once the proxy is done.
type modelTap struct {
	call  ModelCall
	start time.Time
	req   *modelapi.RequestTap
	res   *modelapi.ResponseTap
	// status is the model host's (0: it did not answer).
	status int
	// complete: the response body was read to its end.
	complete bool
}

func (m *modelTap) result() *ModelCall {
	c := m.call
	if m.req != nil {
		c.Request = m.req.Request()
		if c.Keep == policy.ModelContent {
			c.Request.Content, c.Request.ContentCut = m.req.Content()
		}
	}
	if m.res != nil {
		c.Answered = true
		c.Response = m.res.Close(m.complete)
	}
	return &c
}

// modelBody passes a model host's response to the agent as it comes,
// and a copy of each piece to the model call's reader.
type modelBody struct {
	io.ReadCloser
	m *modelTap
}

func (b modelBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		if b.m.call.FirstByte == 0 {
			b.m.call.FirstByte = time.Since(b.m.start)
		}
		_, _ = b.m.res.Write(p[:n])
	}
	if err == io.EOF {
		b.m.complete = true
	}
	return n, err
}

// newHTTPFront makes the server of a port's plain HTTP connections, or
// (terminated) of its inspected TLS ones, which go on over TLS to the
// upstream, verified against UpstreamRoots.
func (g *Gateway) newHTTPFront(port int, terminated bool) *httpFront {
	f := &httpFront{ln: &handoff{ch: make(chan net.Conn), done: make(chan struct{}), addr: &net.TCPAddr{Port: port}}}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		rule, _ := ctx.Value(ruleKey).(netpolicy.Rule)
		host, _, _ := net.SplitHostPort(addr)
		c, dialled, err := g.dial(ctx, rule, host, port)
		if d, _ := ctx.Value(dialledKey).(*atomic.Value); d != nil && err != nil {
			d.Store(dialled) // the address that failed (GotConn names the one used)
		}
		return c, err
	}
	scheme := "http"
	tr := &http.Transport{
		Proxy:                 nil, // never the node's proxy variables
		DialContext:           dial,
		MaxIdleConns:          16,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       httpIdle,
		ResponseHeaderTimeout: g.cfg.IdleTimeout,
		DisableCompression:    true,
	}
	if terminated {
		scheme = "https"
		tr.DialContext = nil
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			host, _, _ := net.SplitHostPort(addr)
			tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: g.cfg.UpstreamRoots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, fmt.Errorf("TLS to %s: %w", host, err)
			}
			return tc, nil
		}
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The upstream is told the name that was decided on.
			name := pr.In.Context().Value(nameKey).(string)
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = net.JoinHostPort(name, strconv.Itoa(port))
			pr.Out.Host = name
			if _, p := splitHost(pr.In.Host); p != "" {
				pr.Out.Host = net.JoinHostPort(name, p)
			}
			x, _ := pr.In.Context().Value(exchangeKey).(*exchange)
			if x != nil && (x.model != nil || x.mcp != nil) {
				// Its response is read on the way: not compressed.
				pr.Out.Header.Del("Accept-Encoding")
			}
			if terminated {
				if x == nil {
					return
				}
				for _, sec := range x.secrets {
					if sec.Host == name {
						pr.Out.Header.Set(sec.Header, sec.Value)
						// A compressed response would hide a secret it
						// echoes from the scan.
						pr.Out.Header.Del("Accept-Encoding")
					}
				}
			}
		},
		ModifyResponse: g.checkResponse,
		Transport:      tr,
		FlushInterval:  -1,
		// Larger copies than the default 32 KiB: fewer reads and writes
		// (and, terminated, TLS records) per byte; taken only while a
		// response streams.
		BufferPool: bufferPool{},
		ErrorLog:   log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := http.StatusBadGateway
			// The error may quote what the site sent (a malformed
			// response's line): scrubbed like a response.
			msg := err.Error()
			if x, _ := r.Context().Value(exchangeKey).(*exchange); x != nil && len(x.forms) > 0 {
				msg = replaceForms(x.forms, msg, "error", &x.found)
			}
			if ev, _ := r.Context().Value(eventKey).(*Event); ev != nil {
				ev.Kind = Refused
				switch {
				case errors.Is(err, errSlowBody):
					ev.Reason, status = errSlowBody.Error(), http.StatusRequestTimeout
				case ev.Reason == "":
					ev.Reason = msg
				}
			}
			http.Error(w, "agentbox egress gateway: "+msg, status)
		},
	}
	f.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serveHTTP(w, r, port, proxy) }),
		ReadHeaderTimeout: g.cfg.HelloTimeout,
		IdleTimeout:       httpIdle,
		MaxHeaderBytes:    MaxHello,
		ErrorLog:          log.New(io.Discard, "", 0),
		BaseContext:       func(net.Listener) context.Context { return g.ctx },
	}
	return f
}

// serveHTTP decides one request by its Host and forwards it, or refuses
// it with 403. Each request is one Event; an allowed WebSocket is two,
// when it opens and when it closes.
func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request, port int, proxy *httputil.ReverseProxy) {
	start := time.Now()
	ev := &Event{Client: addrPortString(r.RemoteAddr), Port: port, Proto: "http", Method: clipName(r.Method), Path: ScrubPath(r.RequestURI)}
	if r.TLS != nil {
		ev.Proto, ev.SNI = "https", r.TLS.ServerName
	}
	cw := &countingWriter{ResponseWriter: w, rc: http.NewResponseController(w), idle: g.cfg.IdleTimeout}
	refuse := func(reason string) {
		ev.Kind, ev.Reason = Refused, reason
		cw.Header().Set("Connection", "close")
		http.Error(cw, "agentbox egress gateway: refused: "+reason, http.StatusForbidden)
	}
	var dialled atomic.Value
	var tun *tunnel
	var x *exchange
	var body *countingBody
	defer func() {
		ev.Status, ev.Received, ev.Duration = cw.status, cw.n, time.Since(start)
		// Also when the proxy aborted the response (it panics then).
		if body != nil {
			ev.Sent = body.n
		}
		if x != nil {
			if x.mcp != nil {
				ev.MCP.Hidden, ev.MCP.Asked = x.mcp.seenNow()
				ev.MCP.Each = x.mcp.callsNow()
			}
			if ev.Kind == Request && ev.Reason == "" {
				ev.Reason = cutReason(x.readErr, cw.err)
				if len(x.forms) > 0 {
					ev.Reason = replaceForms(x.forms, ev.Reason, "error", &x.found)
				}
			}
			ev.Reflected = x.found
		}
		if d, ok := dialled.Load().(string); ok {
			ev.Dialled = d
		}
		if tun != nil {
			// The 101 was recorded when it opened; this is its end.
			ev.Kind, ev.Status, ev.Reason = WebSocketClosed, http.StatusSwitchingProtocols, tun.reason()
			ev.Sent, ev.Received = tun.sent.Load(), tun.received.Load()
		}
		if x != nil && x.mcp != nil && x.mcp.stream != nil && ev.Status/100 == 2 {
			// Its calls are answered on an SSE-transport stream: the
			// record waits for the answers. A POST the server did not
			// take (not 2xx) gets none: recorded at once.
			e := *ev
			x.mcp.stream.recordAnswered(x.mcp, func(calls []MCPCallDone) { e.MCP.Each = calls; g.cfg.Record(e) })
			return
		}
		g.cfg.Record(*ev)
	}()
	host, hostPort := splitHost(r.Host)
	ev.Host = clipName(host)
	if why := requestRefusal(r, hostPort, port); why != "" {
		refuse(why)
		return
	}
	websocket, why := upgradeRequest(r.Header)
	if why != "" {
		refuse(why)
		return
	}
	name, err := HostName(host)
	if err != nil {
		refuse("Host: " + err.Error())
		return
	}
	ev.Host = name
	// One plan decides the request, and bounds and records its model call.
	pl := g.plan()
	rule, why := Decide(pl, name, port)
	ev.Rule = rule.Name
	if why != "" {
		refuse(why)
		return
	}
	if websocket && !rule.WebSocket {
		refuse("websocket is not allowed by " + rule.Name + " (a host rule allows it with websocket: true)")
		return
	}
	if why := g.inspect(r, rule, name); why != "" {
		refuse(why)
		return
	}
	if r.TLS != nil {
		ev.KeyWait, ev.KeyNotGiven = g.awaitKey(r.Context(), name)
	}
	x = &exchange{websocket: websocket, secrets: g.secretsNow()}
	if r.TLS != nil {
		for _, sec := range x.secrets {
			if sec.Host == name {
				ev.Injected = append(ev.Injected, sec.Header)
				x.forms = append(x.forms, sec.forms...)
			}
		}
	}
	if len(x.forms) > 0 {
		cw.interim = func(h http.Header) { scrubHeader(x.forms, h, "interim header", &x.found) }
	}
	if websocket && len(x.forms) > 0 {
		// Its messages are not scanned: the secret could come back.
		refuse("websocket to " + name + " is not served: a secret is injected toward it, and a WebSocket's messages are not scanned for it")
		return
	}
	if websocket {
		cw.tunnel = func(c net.Conn) net.Conn {
			tun = g.openTunnel(c, name, port)
			return tun
		}
		x.opened = func() {
			open := *ev
			open.Kind, open.Status, open.Duration = Request, http.StatusSwitchingProtocols, time.Since(start)
			if d, ok := dialled.Load().(string); ok {
				open.Dialled = d
			}
			g.cfg.Record(open)
		}
	}
	body = &countingBody{ReadCloser: r.Body, rc: cw.rc, start: time.Now(), grace: g.cfg.BodyGrace, rate: g.cfg.BodyMinRate}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
	}
	if rule.Tools != nil && !websocket {
		if !g.admitMCP(cw, r, rule, pl.MCPBudget, name, ev, x) {
			return
		}
	}
	if api := modelapi.API(rule.API); api.Valid() {
		settle, ok := g.admitModel(cw, r, api, pl.Budget, pl.ModelAudit, x, ev, websocket, start)
		if !ok {
			return
		}
		defer settle()
	}
	// A client that half-closes after its request (HTTP/1.0 tools, nc)
	// must still get the response: net/http cancels the request's context
	// at the client's EOF, so the forwarded request runs on its own,
	// bounded by the transport's timeouts and ended with the gateway.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	for k, v := range map[ctxKey]any{ruleKey: rule, eventKey: ev, dialledKey: &dialled, nameKey: name, exchangeKey: x} {
		ctx = context.WithValue(ctx, k, v)
	}
	// The address of the connection the request went out on, new or
	// pooled.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		dialled.Store(ci.Conn.RemoteAddr().String())
	}})
	ev.Kind = Request
	proxy.ServeHTTP(cw, r.WithContext(ctx))
}

// cutReason says why a response was cut short: reading the site
// (readErr) or writing to the agent (writeErr); "" when it was not.
func cutReason(readErr, writeErr error) string {
	switch {
	case readErr != nil:
		return "the response was cut short: reading it from the site: " + readErr.Error()
	case writeErr != nil:
		return "the response was cut short: writing it to the agent: " + writeErr.Error()
	}
	return ""
}
