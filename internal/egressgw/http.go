package egressgw

// The HTTP front: each plain HTTP request, and each request of a TLS
// connection the gateway terminated for an inspected rule, decided by its
// Host and forwarded, or refused.

import (
	"bufio"
	"compress/gzip"
	"compress/zlib"
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
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// bufferPool lends the HTTP fronts their copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

func (bufferPool) Get() []byte { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) {
	if cap(b) >= 128<<10 {
		copyBuffers.Put(&b)
	}
}

// prefixConn is a connection whose first bytes were read into r; done
// runs once, at its first Close.
type prefixConn struct {
	net.Conn
	r    *bufio.Reader
	once sync.Once
	done func()
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *prefixConn) Close() error {
	c.once.Do(c.done)
	return nil
}

// handoff is a net.Listener whose connections are handed to it.
type handoff struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func (h *handoff) hand(c net.Conn) bool {
	select {
	case h.ch <- c:
		return true
	case <-h.done:
		return false
	}
}

func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.ch:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoff) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func (h *handoff) Addr() net.Addr { return h.addr }

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
	// forms are the spellings of the secrets injected toward the name,
	// scanned for in the response (none: the response is not scanned).
	forms []secretForm
	found reflections
	// opened is set when a WebSocket's 101 was let through.
	opened func()
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
			if terminated {
				for _, sec := range g.cfg.Secrets {
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
			if ev, _ := r.Context().Value(eventKey).(*Event); ev != nil {
				ev.Kind = Refused
				switch {
				case errors.Is(err, errSlowBody):
					ev.Reason, status = errSlowBody.Error(), http.StatusRequestTimeout
				case ev.Reason == "":
					ev.Reason = err.Error()
				}
			}
			http.Error(w, "agentbox egress gateway: "+err.Error(), status)
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

// splitHost takes the port off an HTTP Host.
func splitHost(hostport string) (string, string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	return hostport, ""
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
	defer func() {
		ev.Status, ev.Received, ev.Duration = cw.status, cw.n, time.Since(start)
		if d, ok := dialled.Load().(string); ok {
			ev.Dialled = d
		}
		if tun != nil {
			// The 101 was recorded when it opened; this is its end.
			ev.Kind, ev.Status, ev.Reason = WebSocketClosed, http.StatusSwitchingProtocols, tun.reason()
			ev.Sent, ev.Received = tun.sent.Load(), tun.received.Load()
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
	rule, why := Decide(g.plan(), name, port)
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
	x := &exchange{websocket: websocket}
	if r.TLS != nil {
		for _, sec := range g.cfg.Secrets {
			if sec.Host == name {
				ev.Injected = append(ev.Injected, sec.Header)
				x.forms = append(x.forms, sec.forms...)
			}
		}
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
	body := &countingBody{ReadCloser: r.Body, rc: cw.rc, start: time.Now(), grace: g.cfg.BodyGrace, rate: g.cfg.BodyMinRate}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
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
	ev.Sent = body.n
	ev.Reflected = x.found
}

// requestRefusal says why the front refuses r before deciding its name
// ("" when it does not): what would let the agent past the decision or
// take a secret back.
func requestRefusal(r *http.Request, hostPort string, port int) string {
	switch {
	case r.Method == http.MethodConnect:
		return "CONNECT is not served: connect to the name itself (the pod's resolver answers it with the gateway)"
	case r.Method == "TRACE" || r.Method == "TRACK":
		return r.Method + " is not served: it echoes the request back, with any secret the gateway injected"
	case hostPort != "" && hostPort != strconv.Itoa(port):
		// Only this connection's own port: "a.example:b.example" or
		// another port would reach the origin as the agent spelled it.
		return fmt.Sprintf("Host port %q is not this connection's port %d", clipName(hostPort), port)
	case r.URL.Opaque != "" || strings.HasPrefix(r.URL.Path, "//") || strings.HasPrefix(r.RequestURI, "//"):
		// Some origins read "//other.example/x" as another host.
		return "the request target " + ScrubPath(r.RequestURI) + " starts with '//' or is opaque: some origins read it as another host"
	}
	return ""
}

// checkResponse is the front's ModifyResponse: it refuses a switch of
// protocols the gateway did not allow, and scrubs the injected secrets
// out of a response of their host.
func (g *Gateway) checkResponse(res *http.Response) error {
	x, _ := res.Request.Context().Value(exchangeKey).(*exchange)
	if x == nil {
		return errors.New("internal error: a response without its exchange")
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		up := responseUpgrade(res.Header)
		if !x.websocket || !strings.EqualFold(up, "websocket") {
			return fmt.Errorf("the origin switched protocols to %q, which the gateway did not allow", clipName(up))
		}
		if len(x.forms) > 0 {
			res.Header = scrubHeader(x.forms, res.Header, "header", &x.found)
		}
		x.opened()
		return nil
	}
	if len(x.forms) == 0 {
		return nil
	}
	res.Header = scrubHeader(x.forms, res.Header, "header", &x.found)
	if res.Body == nil || res.Body == http.NoBody {
		return nil
	}
	body, err := decoded(res)
	if err != nil {
		return err
	}
	res.Body = readCloser{newScrubReader(body, x.forms, &x.found, func() {
		if len(res.Trailer) > 0 {
			res.Trailer = scrubHeader(x.forms, res.Trailer, "trailer", &x.found)
		}
	}), res.Body}
	return nil
}

// scrubHeader is h with every form of the secrets replaced in its values.
func scrubHeader(forms []secretForm, h http.Header, where string, found *reflections) http.Header {
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = replaceForms(forms, v, where+" "+k, found)
		}
	}
	return h
}

// decoded is res's body without its content coding, for the scan: gzip
// and deflate are undone (the agent gets the body as identity), any other
// coding is refused: the gateway asked for none.
func decoded(res *http.Response) (io.Reader, error) {
	ce := strings.ToLower(strings.TrimSpace(res.Header.Get("Content-Encoding")))
	body := res.Body
	switch ce {
	case "", "identity":
		// A body's replacements keep its length.
		return body, nil
	}
	// Decoded, the body has another length.
	res.Header.Del("Content-Encoding")
	res.Header.Del("Content-Length")
	res.ContentLength = -1
	switch ce {
	case "gzip", "x-gzip":
		return &lazyReader{open: func() (io.Reader, error) { return gzip.NewReader(body) }}, nil
	case "deflate":
		return &lazyReader{open: func() (io.Reader, error) { return zlib.NewReader(body) }}, nil
	}
	return nil, fmt.Errorf("the response is %s-encoded, which the gateway cannot scan for the injected secret (it asked for no encoding)", clipName(ce))
}

// lazyReader opens its reader at the first Read (a gzip reader reads its
// header when made: the response must not wait for the body).
type lazyReader struct {
	open func() (io.Reader, error)
	r    io.Reader
	err  error
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil && l.err == nil {
		l.r, l.err = l.open()
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.r.Read(p)
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// inspect checks what an allowed name's request carries: on a terminated
// connection its Host against the SNI (fronting), the rule's methods and
// paths, and the secrets' placeholders. It says why it refuses, or "".
func (g *Gateway) inspect(r *http.Request, rule netpolicy.Rule, name string) string {
	if r.TLS != nil {
		sni, err := HostName(r.TLS.ServerName)
		if err != nil || sni != name {
			return fmt.Sprintf("Host %s differs from the TLS server name %s (fronting)", name, clipName(r.TLS.ServerName))
		}
	}
	if len(rule.Methods) > 0 && !contains(rule.Methods, r.Method) {
		return fmt.Sprintf("method %s is not allowed by %s (it allows %s)", clipName(r.Method), rule.Name, strings.Join(rule.Methods, ", "))
	}
	if len(rule.Paths) > 0 {
		raw := strings.ToLower(r.URL.EscapedPath())
		switch {
		case strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") || strings.Contains(r.URL.Path, "\\"):
			return "path " + ScrubPath(r.RequestURI) + " holds an encoded '/' or a '\\': a rule with paths refuses it"
		case r.URL.Path == "" || !policy.CanonicalPath(r.URL.Path):
			return "path " + ScrubPath(r.RequestURI) + " is not a clean absolute path ('.', '..' or empty segments): a rule with paths refuses it"
		case !policy.PathAllowed(rule.Paths, r.URL.Path):
			return fmt.Sprintf("path %s is not allowed by %s", clipName(r.URL.Path), rule.Name)
		}
	}
	for _, sec := range g.cfg.Secrets {
		if sec.Placeholder == "" {
			continue
		}
		if targetHolds(r.RequestURI, sec.Placeholder) {
			return fmt.Sprintf("the placeholder of the secret for %s was sent to %s in the URL", sec.Host, name)
		}
		for k, vs := range r.Header {
			if k == sec.Header && sec.Host == name && r.TLS != nil {
				continue // replaced with the secret
			}
			for _, v := range vs {
				if strings.Contains(v, sec.Placeholder) {
					return fmt.Sprintf("the placeholder of the secret for %s was sent to %s in header %s", sec.Host, name, clipName(k))
				}
			}
		}
	}
	if r.TLS == nil {
		for _, sec := range g.cfg.Secrets {
			if sec.Host == name {
				return "the secret for " + name + " is injected over TLS only: use https"
			}
		}
	}
	return ""
}

// targetHolds says whether a request target holds s, as sent or
// percent-decoded (once, and as a query decodes '+').
func targetHolds(target, s string) bool {
	if strings.Contains(target, s) {
		return true
	}
	for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
		if d, err := unescape(target); err == nil && strings.Contains(d, s) {
			return true
		}
	}
	// A target that does not decode as a whole: decode what does.
	return strings.Contains(hexEscapes.ReplaceAllStringFunc(target, func(e string) string {
		d, _ := url.PathUnescape(e)
		return d
	}), s)
}

var hexEscapes = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func addrPortString(s string) netip.AddrPort {
	ap, _ := netip.ParseAddrPort(s)
	return ap
}

// ScrubPath keeps a request target's path and its query's keys; values
// (tokens, search terms) are replaced. At most 512 bytes are kept.
func ScrubPath(uri string) string {
	path, query, ok := strings.Cut(uri, "?")
	if ok {
		parts := strings.Split(query, "&")
		for i, p := range parts {
			if k, _, has := strings.Cut(p, "="); has {
				parts[i] = k + "=..."
			}
		}
		path += "?" + strings.Join(parts, "&")
	}
	if len(path) > 512 {
		path = path[:512] + "...(truncated)"
	}
	return path
}

type countingWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	// idle bounds each write: an agent that stops reading frees its
	// connection.
	idle   time.Duration
	status int
	n      int64
	// tunnel, for an allowed WebSocket, wraps the hijacked connection.
	tunnel func(net.Conn) net.Conn
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.rc != nil {
		w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errSlowBody refuses a request whose body trickles.
var errSlowBody = errors.New("the request body arrived too slowly (a body must keep coming after its grace)")

// countingBody counts a request body and bounds its upload: each read must
// come by grace plus what has arrived at rate.
type countingBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int
	n     int64
	slow  bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.rc != nil {
		b.rc.SetReadDeadline(b.start.Add(b.grace + time.Duration(b.n)*time.Second/time.Duration(b.rate)))
	}
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		b.slow = true
		return n, fmt.Errorf("%w: %d bytes in %s", errSlowBody, b.n, time.Since(b.start).Round(time.Millisecond))
	}
	if err != nil && b.rc != nil {
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
