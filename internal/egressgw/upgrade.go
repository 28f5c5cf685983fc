package egressgw

// Upgrades. After a 101 the gateway can no longer see requests: every byte
// is the agent's, to whatever the origin routes it to. An h2c upgrade
// would let the agent open HTTP/2 streams for any :authority the origin
// serves (a CDN edge serves thousands) and any method and path, past the
// name and the rule's methods and paths. So the gateway forwards an
// Upgrade to websocket only, under a rule that says websocket: true, and
// refuses a 101 it did not ask for. An open WebSocket is a tunnel the
// gateway holds: it is closed when idle, when the role no longer allows
// it (live tightening), when the sandbox is quarantined, and recorded when
// it opens and when it closes.

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// upgradeRequest says what Upgrade r asks for: "" for none, "websocket",
// or why the gateway refuses it.
func upgradeRequest(h http.Header) (websocket bool, refusal string) {
	ups := h.Values("Upgrade")
	if len(ups) == 0 {
		return false, ""
	}
	if len(ups) == 1 && strings.EqualFold(strings.TrimSpace(ups[0]), "websocket") &&
		httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return true, ""
	}
	return false, "Upgrade " + clipName(strings.Join(ups, ", ")) + " is not served: after a switch of protocols the gateway sees no request (only websocket, under a rule with websocket: true)"
}

// responseUpgrade is the protocol a response switches to.
func responseUpgrade(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// tunnel is an open WebSocket: the agent's connection, after the 101.
type tunnel struct {
	net.Conn
	name string
	port int
	// last is when a byte last moved either way (Unix nanoseconds).
	last           atomic.Int64
	sent, received atomic.Int64
	once           sync.Once
	// why it was closed, by the gateway ("" when an end closed it).
	why  atomic.Pointer[string]
	done chan struct{}
}

func (t *tunnel) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	if n > 0 {
		t.sent.Add(int64(n))
		t.last.Store(time.Now().UnixNano())
	}
	return n, err
}

func (t *tunnel) Write(p []byte) (int, error) {
	n, err := t.Conn.Write(p)
	if n > 0 {
		t.received.Add(int64(n))
		t.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// mark gives the tunnel why it is closing (the first reason stays).
func (t *tunnel) mark(why string) { t.why.CompareAndSwap(nil, &why) }

// cut closes the tunnel for why.
func (t *tunnel) cut(why string) {
	t.mark(why)
	t.Close()
}

func (t *tunnel) Close() error {
	t.once.Do(func() { close(t.done) })
	return t.Conn.Close()
}

// reason says why the tunnel closed.
func (t *tunnel) reason() string {
	if w := t.why.Load(); w != nil {
		return *w
	}
	return "closed by the agent or the origin"
}

// openTunnel wraps the agent's hijacked connection c, allowed as name on
// port, and watches it: idle for the gateway's idle timeout, it is closed.
func (g *Gateway) openTunnel(c net.Conn, name string, port int) *tunnel {
	t := &tunnel{Conn: c, name: name, port: port, done: make(chan struct{})}
	t.last.Store(time.Now().UnixNano())
	// Deadlines the HTTP front set for requests do not bound a tunnel;
	// the watch below does.
	c.SetDeadline(time.Time{})
	g.mu.Lock()
	if g.closed || g.suspended != "" {
		why := "the gateway is closing"
		if g.suspended != "" {
			why = "the gateway is suspended: " + g.suspended
		}
		g.mu.Unlock()
		t.cut(why)
		return t
	}
	g.tunnels[t] = struct{}{}
	g.mu.Unlock()
	idle := g.cfg.IdleTimeout
	go func() {
		tick := time.NewTicker(min(idle/4, time.Second))
		defer tick.Stop()
		for {
			select {
			case <-t.done:
				g.mu.Lock()
				delete(g.tunnels, t)
				g.mu.Unlock()
				return
			case <-tick.C:
				if time.Since(time.Unix(0, t.last.Load())) >= idle {
					t.cut("idle for " + idle.String())
				}
			}
		}
	}()
	return t
}

// hijacker is the front's ResponseWriter's Hijack, wrapping the agent's
// connection in a tunnel when the request was an allowed WebSocket.
func (w *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil || w.tunnel == nil {
		return c, brw, err
	}
	t := w.tunnel(c)
	// The 101's head goes through brw, to the tunnel.
	brw.Writer.Reset(t)
	return t, brw, nil
}
