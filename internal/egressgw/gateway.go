package egressgw

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// Kind classifies an Event.
type Kind string

const (
	// Passthrough: a TLS connection allowed by its SNI and spliced to the
	// name's server; the agent verifies that server itself.
	Passthrough Kind = "passthrough"
	// Request: one HTTP request allowed by its Host and forwarded (plain
	// HTTP, or HTTPS the gateway terminated for an inspected rule).
	Request Kind = "request"
	// Refused: a connection or request the gateway did not forward.
	Refused Kind = "refused"
)

// Event is what the gateway did with one connection or request, for the
// trail. Names, paths and methods come from the sandbox: untrusted.
type Event struct {
	Kind Kind
	// Client is the agent's end of the connection.
	Client netip.AddrPort
	// Port is the gateway port the agent connected to: the port the
	// gateway dials.
	Port int
	// Proto is "tls" (passthrough), "http" or "https" (terminated).
	Proto string
	SNI   string
	// Host is an HTTP request's Host, without its port.
	Host string
	// Rule is the host rule that allowed it (or matched, for a refusal
	// after the rule: a failed lookup or dial).
	Rule string
	// Dialled is the address the gateway connected to.
	Dialled string
	// Method and Path of an HTTP request (the query's values scrubbed).
	Method, Path string
	// Status is the HTTP response status the agent got.
	Status int
	// Sent and Received count bytes from the agent and to it.
	Sent, Received int64
	Duration       time.Duration
	// Reason says why a refusal was one.
	Reason string
	// Injected names the headers the gateway set to a secret.
	Injected []string
}

// Config is one pod's gateway.
type Config struct {
	Plan *netpolicy.Plan
	// Live, when set and holding a plan, replaces Plan: the plan a running
	// sandbox was narrowed to (its role tightened while it ran).
	Live *atomic.Pointer[netpolicy.Plan]
	// Lookup resolves name for rule r, without the addresses r may not
	// reach (the resolver's upstreams and withholding).
	Lookup func(ctx context.Context, r netpolicy.Rule, name string) ([]netip.Addr, error)
	// Dial connects to an address from the node (net.Dialer if nil).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Record receives every Event.
	Record func(Event)
	// MaxConns bounds the pod's open connections to the gateway; more are
	// closed at accept and counted.
	MaxConns int
	// HelloTimeout bounds the time from accept to a decision (the
	// ClientHello, or an HTTP request's head).
	HelloTimeout time.Duration
	// IdleTimeout closes a connection that carries nothing either way.
	IdleTimeout time.Duration
	// DialTimeout bounds the connection to the upstream.
	DialTimeout time.Duration
	// CA signs the certificates the gateway presents for inspected rules
	// (the plan's rules with Inspect); without it they are refused.
	CA *CA
	// UpstreamRoots verify the servers behind inspected rules (nil: the
	// node's roots).
	UpstreamRoots *x509.CertPool
	// Secrets are what the gateway injects (Plan.Injects with their values).
	Secrets []Secret
}

// Secret is a credential the gateway sets on one host's requests.
type Secret struct {
	// Host is the exact name, lower case; Header is canonical.
	Host, Header string
	// Value is the header's whole value (the Format with the secret).
	Value string
	// Placeholder is what the sandbox holds instead ("" for none); sent
	// anywhere but Header to Host, it is refused.
	Placeholder string
}

// Defaults for what one pod can make the gateway hold (memory outside the
// pod's cgroup): at most MaxConns connections, each with its hello buffer
// (MaxHello) and, only while bytes move, copy buffers: two of 32 KiB
// spliced, one pooled 128 KiB buffer for a response's body forwarded.
const (
	DefaultMaxConns     = 64
	DefaultHelloTimeout = 5 * time.Second
	DefaultIdleTimeout  = 2 * time.Minute
	DefaultDialTimeout  = 5 * time.Second
	// httpIdle closes a kept-alive HTTP connection between requests.
	httpIdle = 30 * time.Second
)

// Gateway serves one pod.
type Gateway struct {
	cfg      Config
	slots    chan struct{}
	rejected atomic.Int64
	wg       sync.WaitGroup
	ctx      context.Context
	stop     context.CancelFunc

	mu  sync.Mutex
	lns []net.Listener
	// conns are the open connections, each with the name it was
	// allowed by (a TLS connection's SNI, once decided).
	conns  map[net.Conn]decided
	fronts []*httpFront
	closed bool
	// suspended, when set, is why every connection is refused
	// (Suspend).
	suspended string
}

// fronts of one port: plain HTTP, and HTTPS the gateway terminated.
type portFronts struct{ plain, tls *httpFront }

// New makes a gateway; Serve gives it listeners.
func New(cfg Config) *Gateway {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = DefaultHelloTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.Record == nil {
		cfg.Record = func(Event) {}
	}
	g := &Gateway{cfg: cfg, slots: make(chan struct{}, cfg.MaxConns), conns: map[net.Conn]decided{}}
	g.ctx, g.stop = context.WithCancel(context.Background())
	return g
}

// Rejected is how many connections were closed at accept because the pod
// held MaxConns already.
func (g *Gateway) Rejected() int64 { return g.rejected.Load() }

// Ports are the ports the plan's host rules name: the gateway listens on
// each.
func Ports(pl *netpolicy.Plan) []int {
	seen := map[int]bool{}
	var out []int
	for _, r := range pl.Hosts() {
		for _, p := range r.Ports {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// Decide says which host rule allows name on port, or why none does.
func Decide(pl *netpolicy.Plan, name string, port int) (netpolicy.Rule, string) {
	r, ok := pl.MatchHost(name)
	if !ok {
		return netpolicy.Rule{}, "no host rule matches " + name
	}
	for _, p := range r.Ports {
		if p == port {
			return r, ""
		}
	}
	return r, fmt.Sprintf("port %d is not allowed by %s", port, r.Name)
}

// Serve accepts connections on ln, a listener on port, until Close.
func (g *Gateway) Serve(ln net.Listener, port int) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		ln.Close()
		return net.ErrClosed
	}
	g.lns = append(g.lns, ln)
	front := portFronts{plain: g.newHTTPFront(port, false), tls: g.newHTTPFront(port, true)}
	g.fronts = append(g.fronts, front.plain, front.tls)
	g.mu.Unlock()
	g.wg.Add(3)
	for _, f := range []*httpFront{front.plain, front.tls} {
		go func() {
			defer g.wg.Done()
			f.srv.Serve(f.ln)
		}()
	}
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			select {
			case g.slots <- struct{}{}:
			default:
				g.rejected.Add(1)
				c.Close()
				continue
			}
			if !g.track(c) {
				<-g.slots
				c.Close()
				return
			}
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				g.handle(c, port, front)
			}()
		}
	}()
	return nil
}

func (g *Gateway) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[c] = decided{}
	return true
}

// decided is what a TLS connection was allowed as.
type decided struct {
	name string
	port int
}

// allowedAs notes the name a connection was allowed by.
func (g *Gateway) allowedAs(c net.Conn, name string, port int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.conns[c]; ok {
		g.conns[c] = decided{name, port}
	}
}

// Revalidate closes every TLS connection whose name the plan no longer
// allows on its port (the role dropped the host while it ran), and says
// how many. An HTTP request is decided on its own, each time.
func (g *Gateway) Revalidate() int {
	pl := g.plan()
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for c, d := range g.conns {
		if d.name == "" {
			continue
		}
		if _, why := Decide(pl, d.name, d.port); why != "" {
			c.Close()
			n++
		}
	}
	return n
}

// release forgets c and frees its slot; it runs once per accepted
// connection.
func (g *Gateway) release(c net.Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
	c.Close()
	<-g.slots
}

// Close stops accepting, closes every connection and waits for them.
func (g *Gateway) Close() error {
	g.mu.Lock()
	g.closed = true
	for _, ln := range g.lns {
		ln.Close()
	}
	for c := range g.conns {
		c.Close()
	}
	fronts := g.fronts
	g.mu.Unlock()
	g.stop()
	for _, f := range fronts {
		f.srv.Close()
	}
	g.wg.Wait()
	return nil
}

// plan is the plan connections are decided by now.
func (g *Gateway) plan() *netpolicy.Plan {
	if g.cfg.Live != nil {
		if pl := g.cfg.Live.Load(); pl != nil {
			return pl
		}
	}
	return g.cfg.Plan
}

// Suspend refuses every connection from now on, for reason, and closes
// those open (a download through the gateway stops at once), until Resume.
// It returns how many it closed.
func (g *Gateway) Suspend(reason string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.suspended = reason
	for c := range g.conns {
		c.Close()
	}
	return len(g.conns)
}

// Resume decides connections by the rules again.
func (g *Gateway) Resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.suspended = ""
}

// suspendedFor is why connections are refused ("" when they are not).
func (g *Gateway) suspendedFor() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.suspended
}

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// handle reads what a connection starts with and decides: TLS by its SNI
// (spliced), HTTP by each request's Host (forwarded), anything else
// refused.
func (g *Gateway) handle(c net.Conn, port int, front portFronts) {
	ev := Event{Client: addrPort(c.RemoteAddr()), Port: port}
	start := time.Now()
	if why := g.suspendedFor(); why != "" {
		g.refuse(c, &ev, start, "the gateway is suspended: "+why)
		return
	}
	br := bufio.NewReaderSize(c, MaxHello+64)
	c.SetReadDeadline(start.Add(g.cfg.HelloTimeout))
	first, err := br.Peek(1)
	if err != nil {
		g.refuse(c, &ev, start, "nothing sent within "+g.cfg.HelloTimeout.String()+": the gateway decides by a TLS ClientHello or an HTTP request")
		return
	}
	if IsTLS(first) {
		ev.Proto = "tls"
		g.passthrough(c, br, &ev, start, front.tls)
		return
	}
	if first[0] < 'A' || first[0] > 'Z' {
		g.refuse(c, &ev, start, fmt.Sprintf("neither TLS nor HTTP (first byte %#x): a host rule carries TLS or HTTP only", first[0]))
		return
	}
	c.SetReadDeadline(time.Time{})
	// HTTP: the front's server reads each request and this connection's
	// slot is freed when it closes the connection.
	if !front.plain.ln.hand(&prefixConn{Conn: c, r: br, done: func() { g.release(c) }}) {
		g.release(c)
	}
}

func (g *Gateway) refuse(c net.Conn, ev *Event, start time.Time, reason string) {
	ev.Kind, ev.Reason, ev.Duration = Refused, reason, time.Since(start)
	g.cfg.Record(*ev)
	g.release(c)
}

// passthrough decides a TLS connection by its ClientHello's SNI and
// splices it to the name's server: the gateway dials what it resolved. An
// inspected rule's connection is terminated instead, and its requests go
// to the TLS front.
func (g *Gateway) passthrough(c net.Conn, br *bufio.Reader, ev *Event, start time.Time, front *httpFront) {
	h, err := peekHello(br)
	if err != nil {
		g.refuse(c, ev, start, "ClientHello: "+err.Error())
		return
	}
	ev.SNI = h.SNI
	switch {
	case h.ECH:
		g.refuse(c, ev, start, "an encrypted ClientHello (ECH) hides the name")
		return
	case h.SNI == "":
		g.refuse(c, ev, start, "the ClientHello names no server (no SNI)")
		return
	}
	rule, why := Decide(g.plan(), h.SNI, ev.Port)
	ev.Rule = rule.Name
	if why != "" {
		g.refuse(c, ev, start, why)
		return
	}
	g.allowedAs(c, h.SNI, ev.Port)
	if rule.Inspect {
		g.terminate(c, br, ev, start, h.SNI, front)
		return
	}
	up, dialled, err := g.dial(g.ctx, rule, h.SNI, ev.Port)
	ev.Dialled = dialled
	if err != nil {
		g.refuse(c, ev, start, err.Error())
		return
	}
	c.SetReadDeadline(time.Time{})
	ev.Sent, ev.Received = splice(c, up, br, g.cfg.IdleTimeout)
	up.Close()
	ev.Kind, ev.Duration = Passthrough, time.Since(start)
	g.cfg.Record(*ev)
	g.release(c)
}

// terminate completes the agent's TLS handshake with a certificate for sni
// from the sandbox's CA, and hands the connection to the TLS front, which
// decides each request.
func (g *Gateway) terminate(c net.Conn, br *bufio.Reader, ev *Event, start time.Time, sni string, front *httpFront) {
	if g.cfg.CA == nil {
		g.refuse(c, ev, start, "the rule is inspected but the gateway has no CA")
		return
	}
	name, err := HostName(sni)
	if err != nil {
		g.refuse(c, ev, start, "SNI: "+err.Error())
		return
	}
	leaf, err := g.cfg.CA.Leaf(name)
	if err != nil {
		g.refuse(c, ev, start, err.Error())
		return
	}
	// The TLS connection owns c from here: closing it releases the slot.
	tc := tls.Server(&prefixConn{Conn: c, r: br, done: func() { g.release(c) }}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	tc.SetDeadline(start.Add(g.cfg.HelloTimeout))
	if err := tc.HandshakeContext(g.ctx); err != nil {
		ev.Kind, ev.Proto, ev.Duration = Refused, "https", time.Since(start)
		ev.Reason = "TLS handshake with the gateway (the client must trust the sandbox's CA): " + clipName(err.Error())
		g.cfg.Record(*ev)
		tc.Close()
		return
	}
	tc.SetDeadline(time.Time{})
	if !front.ln.hand(tc) {
		tc.Close()
	}
}

// peekHello reads until br holds a whole ClientHello (or too much).
func peekHello(br *bufio.Reader) (Hello, error) {
	for {
		b, _ := br.Peek(br.Buffered())
		h, err := ParseClientHello(b)
		if !errors.Is(err, ErrNeedMore) {
			return h, err
		}
		if br.Buffered() >= MaxHello {
			return Hello{}, fmt.Errorf("over %d bytes", MaxHello)
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return Hello{}, fmt.Errorf("incomplete: %w", err)
		}
	}
}

// dial resolves name for rule and connects to the first address that
// answers, on port.
func (g *Gateway) dial(ctx context.Context, rule netpolicy.Rule, name string, port int) (net.Conn, string, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.DialTimeout)
	defer cancel()
	addrs, err := g.cfg.Lookup(ctx, rule, name)
	if err != nil {
		return nil, "", fmt.Errorf("resolve %s: %w", name, err)
	}
	if len(addrs) == 0 {
		return nil, "", fmt.Errorf("resolve %s: no address the rule may reach", name)
	}
	var errs []error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(port)).String()
		c, err := g.cfg.Dial(ctx, "tcp", ap)
		if err == nil {
			return c, ap, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, netip.AddrPortFrom(addrs[0], uint16(port)).String(), fmt.Errorf("connect %s: %w", name, errors.Join(errs...))
}

// splice copies both ways until both ends are done or nothing moves for
// idle. The agent's bytes are read through br, which holds its first ones;
// sent counts them, received what went to the agent.
func splice(agent, up net.Conn, br *bufio.Reader, idle time.Duration) (sent, received int64) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	copyDir := func(dst, src net.Conn, r io.Reader, n *int64) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			src.SetReadDeadline(time.Now().Add(idle))
			k, err := r.Read(buf)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:k]); werr != nil {
					agent.Close()
					up.Close()
					return
				}
				*n += int64(k)
			}
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < idle {
					continue // the other direction is moving
				}
				if errors.Is(err, io.EOF) {
					if cw, ok := dst.(interface{ CloseWrite() error }); ok {
						cw.CloseWrite()
						return
					}
				}
				agent.Close()
				up.Close()
				return
			}
		}
	}
	wg.Add(2)
	go copyDir(up, agent, br, &sent)
	go copyDir(agent, up, up, &received)
	wg.Wait()
	return sent, received
}

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
)

// newHTTPFront makes the server of a port's plain HTTP connections, or
// (terminated) of its inspected TLS ones, which go on over TLS to the
// upstream, verified against UpstreamRoots.
func (g *Gateway) newHTTPFront(port int, terminated bool) *httpFront {
	f := &httpFront{ln: &handoff{ch: make(chan net.Conn), done: make(chan struct{}), addr: &net.TCPAddr{Port: port}}}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		rule, _ := ctx.Value(ruleKey).(netpolicy.Rule)
		host, _, _ := net.SplitHostPort(addr)
		c, dialled, err := g.dial(ctx, rule, host, port)
		if d, _ := ctx.Value(dialledKey).(*atomic.Value); d != nil {
			d.Store(dialled)
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
					}
				}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		// Larger copies than the default 32 KiB: fewer reads and writes
		// (and, terminated, TLS records) per byte; taken only while a
		// response streams.
		BufferPool: bufferPool{},
		ErrorLog:   log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if ev, _ := r.Context().Value(eventKey).(*Event); ev != nil {
				ev.Kind, ev.Reason = Refused, err.Error()
			}
			http.Error(w, "agentbox egress gateway: "+err.Error(), http.StatusBadGateway)
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
// it with 403. Each request is one Event.
func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request, port int, proxy *httputil.ReverseProxy) {
	start := time.Now()
	ev := &Event{Client: addrPortString(r.RemoteAddr), Port: port, Proto: "http", Method: clipName(r.Method), Path: ScrubPath(r.RequestURI)}
	if r.TLS != nil {
		ev.Proto, ev.SNI = "https", r.TLS.ServerName
	}
	cw := &countingWriter{ResponseWriter: w}
	refuse := func(reason string) {
		ev.Kind, ev.Reason = Refused, reason
		cw.Header().Set("Connection", "close")
		http.Error(cw, "agentbox egress gateway: refused: "+reason, http.StatusForbidden)
	}
	var dialled atomic.Value
	defer func() {
		ev.Status, ev.Received, ev.Duration = cw.status, cw.n, time.Since(start)
		if d, ok := dialled.Load().(string); ok {
			ev.Dialled = d
		}
		g.cfg.Record(*ev)
	}()
	host, _ := splitHost(r.Host)
	ev.Host = clipName(host)
	if r.Method == http.MethodConnect {
		refuse("CONNECT is not served: connect to the name itself (the pod's resolver answers it with the gateway)")
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
	if why := g.inspect(r, rule, name); why != "" {
		refuse(why)
		return
	}
	if r.TLS != nil {
		for _, sec := range g.cfg.Secrets {
			if sec.Host == name {
				ev.Injected = append(ev.Injected, sec.Header)
			}
		}
	}
	body := &countingBody{ReadCloser: r.Body}
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
	for k, v := range map[ctxKey]any{ruleKey: rule, eventKey: ev, dialledKey: &dialled, nameKey: name} {
		ctx = context.WithValue(ctx, k, v)
	}
	ev.Kind = Request
	proxy.ServeHTTP(cw, r.WithContext(ctx))
	ev.Sent = body.n
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
		if strings.Contains(r.RequestURI, sec.Placeholder) {
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
	status int
	n      int64
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

type countingBody struct {
	io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}
