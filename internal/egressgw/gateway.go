package egressgw

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/egressev"
	"agentbox.dev/agentbox/internal/netpolicy"
)

// The gateway's records are egressev's: a record builder reads them
// without importing the gateway.
type (
	Kind        = egressev.Kind
	Event       = egressev.Event
	Reflection  = egressev.Reflection
	ModelCall   = egressev.ModelCall
	MCPEvent    = egressev.MCPEvent
	MCPCallDone = egressev.MCPCallDone
)

const (
	Passthrough     = egressev.Passthrough
	WebSocketClosed = egressev.WebSocketClosed
	Request         = egressev.Request
	Refused         = egressev.Refused
)

// Config is one pod's gateway.
type Config struct {
	Plan *netpolicy.Plan
	// Live, when set and holding a plan, replaces Plan: the plan a running
	// sandbox was narrowed to (its role tightened while it ran).
	Live *atomic.Pointer[netpolicy.Plan]
	// Lookup resolves name for rule r, without the addresses r may not
	// reach (the resolver's upstreams and withholding).
	Lookup func(ctx context.Context, r netpolicy.Rule, name string) ([]netip.Addr, error)
	// Refuse, when set, says why rule r may not open an address (""
	// when it may), asked just before each dial: whatever answer a lookup
	// kept, an address that became the node's own since is not dialled.
	Refuse func(r netpolicy.Rule, a netip.Addr) string
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
	// BodyGrace and BodyMinRate bound a request body's upload: after the
	// grace, its bytes must keep arriving at the rate (bytes a second) on
	// average, or the request is refused, so a trickled upload cannot
	// hold one of the pod's connections for ever.
	BodyGrace   time.Duration
	BodyMinRate int
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
	// Secret is the secret itself, which the responses of Host are
	// scanned for, in its common encodings ("" : Value is).
	Secret string
	// Placeholder is what the sandbox holds instead ("" for none); sent
	// anywhere but Header to Host, it is refused.
	Placeholder string
	// forms are its spellings the responses of Host are scrubbed of.
	forms []secretForm
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
	DefaultBodyGrace    = 10 * time.Second
	DefaultBodyMinRate  = 1024
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
	conns map[net.Conn]decided
	// tunnels are the open WebSockets.
	tunnels map[*tunnel]struct{}
	fronts  []*httpFront
	closed  bool
	// suspended, when set, is why every connection is refused
	// (Suspend).
	suspended string
	// secrets are what the gateway injects now (SetSecrets); hold the
	// hosts whose key is awaited (HoldFor, hold.go).
	secrets atomic.Pointer[[]Secret]
	hold    atomic.Pointer[holdState]
	// usage counts the model calls against the plan's budget; mcpUsed
	// the MCP calls.
	usage   usage
	mcpUsed mcpUsage
	// sse are the open streams of MCP's older SSE transport (mcpsse.go).
	sse sseStreams
}

// raw is the secret a response is scanned for.
func (s Secret) raw() string {
	if s.Secret != "" {
		return s.Secret
	}
	return s.Value
}

// SetSecrets replaces the secrets the gateway injects (a rotated secret):
// a request takes them whole when it starts. A response is scanned for a
// secret's new value and for the one it replaced, which an origin may
// still echo.
func (g *Gateway) SetSecrets(secs []Secret) {
	secs = slices.Clone(secs)
	var old []Secret
	if p := g.secrets.Load(); p != nil {
		old = *p
	}
	for i, sec := range secs {
		secs[i].forms = secretForms(sec.raw(), sec.Placeholder)
		for _, o := range old {
			if o.Host == sec.Host && o.Header == sec.Header && o.raw() != sec.raw() {
				secs[i].forms = append(secs[i].forms, secretForms(o.raw(), sec.Placeholder)...)
			}
		}
	}
	g.secrets.Store(&secs)
}

// Done is closed when the gateway is closed.
func (g *Gateway) Done() <-chan struct{} { return g.ctx.Done() }

// secretsNow are the secrets the gateway injects now.
func (g *Gateway) secretsNow() []Secret {
	if p := g.secrets.Load(); p != nil {
		return *p
	}
	return nil
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
	if cfg.BodyGrace <= 0 {
		cfg.BodyGrace = DefaultBodyGrace
	}
	if cfg.BodyMinRate <= 0 {
		cfg.BodyMinRate = DefaultBodyMinRate
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.Record == nil {
		cfg.Record = func(Event) {}
	}
	g := &Gateway{cfg: cfg, slots: make(chan struct{}, cfg.MaxConns), conns: map[net.Conn]decided{}, tunnels: map[*tunnel]struct{}{}}
	g.SetSecrets(cfg.Secrets)
	g.cfg.Secrets = nil // secretsNow holds them
	g.ctx, g.stop = context.WithCancel(context.Background())
	return g
}

// Rejected is how many connections were closed at accept because the pod
// held MaxConns already.
func (g *Gateway) Rejected() int64 { return g.rejected.Load() }

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
// allows on its port (the role dropped the host while it ran), and every
// WebSocket whose rule no longer allows it, and says how many. An HTTP
// request is decided on its own, each time.
func (g *Gateway) Revalidate() int {
	pl := g.plan()
	g.mu.Lock()
	var cut []*tunnel
	defer func() { g.mu.Unlock(); closeTunnels(cut) }()
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
	for t := range g.tunnels {
		rule, why := Decide(pl, t.name, t.port)
		if why == "" && !rule.WebSocket {
			why = rule.Name + " no longer allows websocket"
		}
		if why != "" {
			t.mark("the role changed: " + why)
			cut = append(cut, t)
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
	tunnels := g.markTunnelsLocked("the gateway stopped")
	fronts := g.fronts
	g.mu.Unlock()
	closeTunnels(tunnels)
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
	// The tunnels' own connections are among conns: closing those ends
	// them, for the reason marked.
	g.markTunnelsLocked("the gateway is suspended: " + reason)
	for c := range g.conns {
		c.Close()
	}
	return len(g.conns)
}

// markTunnelsLocked gives every open tunnel why it is closing and returns
// them; the caller closes them after g.mu (a tunnel's Close releases its
// connection, which takes g.mu).
//
// Preconditions: g.mu is locked.
func (g *Gateway) markTunnelsLocked(why string) []*tunnel {
	var out []*tunnel
	for t := range g.tunnels {
		t.mark(why)
		out = append(out, t)
	}
	return out
}

func closeTunnels(ts []*tunnel) {
	for _, t := range ts {
		t.Close()
	}
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
