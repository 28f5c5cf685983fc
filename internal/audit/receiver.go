package audit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"
)

// MaxAnomalyRecords bounds how many anomalies get a record of their own;
// the rest are counted (the end record has the total).
const MaxAnomalyRecords = 100

// SocketBuffer is the receive buffer of an audit socket.
const SocketBuffer = 8 << 20

// outOfOrderSlack is how far an event's time may go back before it counts
// as out of order (threads report concurrently).
const outOfOrderSlack = time.Second

// Receiver serves one sandbox's gVisor trace session on its own
// SOCK_SEQPACKET socket: the connection, not what the sandbox says,
// identifies the sandbox. Everything read is untrusted: malformed,
// oversized or out-of-order messages become anomaly records, never a crash
// or a stall of the shim.
type Receiver struct {
	// Annotate, when set, may add to each event record before it is
	// sealed (the shim adds egress decisions). Set it before the sandbox
	// connects.
	Annotate func(*Record)

	path  string
	ln    *net.UnixListener
	trail *Trail
	scrub Scrubber

	mu   sync.Mutex
	conn *net.UnixConn
	// done closes when the accept loop ends; handled when the session's
	// reader ends.
	done    chan struct{}
	handled chan struct{}

	// connected is set once the handshake completed; ended once the
	// session's reader returned.
	connected, ended atomic.Bool

	// Owned by the serving goroutine.
	// rate is the most events per second taken from the sandbox (0: no
	// bound). Past it the receiver reads more slowly: gVisor's sink then
	// retries a full socket, which slows the sandbox down.
	rate     atomic.Int64
	tokens   float64
	lastFill time.Time

	dec         Decoder
	lastDropped uint32
	lastTime    time.Time
	anomalies   int
}

// Listen creates the socket (mode 0600) and serves it.
func Listen(path string, trail *Trail, scrub Scrubber) (*Receiver, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit socket dir: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stale audit socket: %w", err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("audit socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	r := &Receiver{path: path, ln: ln, trail: trail, scrub: scrub, done: make(chan struct{}), handled: make(chan struct{})}
	go r.serve()
	return r, nil
}

// SetRate bounds the events per second taken from the sandbox (0: none).
func (r *Receiver) SetRate(perSecond int) { r.rate.Store(int64(perSecond)) }

// throttle waits, when the sandbox is over its rate, until the next event
// may be taken (a token bucket holding one second's worth).
func (r *Receiver) throttle() {
	rate := float64(r.rate.Load())
	if rate <= 0 {
		return
	}
	now := time.Now()
	if r.lastFill.IsZero() {
		r.lastFill, r.tokens = now, rate
	}
	r.tokens += now.Sub(r.lastFill).Seconds() * rate
	if r.tokens > rate {
		r.tokens = rate
	}
	r.lastFill = now
	if r.tokens < 1 {
		wait := time.Duration((1 - r.tokens) / rate * float64(time.Second))
		time.Sleep(wait)
		r.tokens, r.lastFill = 0, time.Now()
		return
	}
	r.tokens--
}

// Live reports whether gVisor's session is established and still open.
func (r *Receiver) Live() bool { return r.connected.Load() && !r.ended.Load() }

// Path is the socket the sandbox connects to.
func (r *Receiver) Path() string { return r.path }

func (r *Receiver) serve() {
	defer close(r.done)
	first := true
	for {
		c, err := r.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		if !first {
			// One session per sandbox: a second connection is not gVisor's.
			r.anomaly("second connection to the audit socket refused", nil)
			c.Close()
			continue
		}
		first = false
		r.mu.Lock()
		r.conn = c
		r.mu.Unlock()
		go func() {
			defer close(r.handled)
			defer r.ended.Store(true)
			r.handle(c)
			c.Close()
		}()
	}
}

func (r *Receiver) handle(c *net.UnixConn) {
	buf := make([]byte, MaxMessageSize+1)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		r.anomaly(fmt.Sprintf("handshake: %v", err), nil)
		return
	}
	var hs pb.Handshake
	if flags&unix.MSG_TRUNC != 0 || proto.Unmarshal(buf[:n], &hs) != nil || hs.GetVersion() < 1 {
		r.anomaly("handshake: not a gVisor handshake", nil)
		return
	}
	out, _ := proto.Marshal(&pb.Handshake{Version: wire.CurrentVersion})
	if _, err := c.Write(out); err != nil {
		r.anomaly(fmt.Sprintf("handshake reply: %v", err), nil)
		return
	}
	r.connected.Store(true)
	// A large receive buffer lets events queue while the shim is busy
	// (gVisor never blocks: a full buffer means dropped events).
	c.SetReadBuffer(SocketBuffer)
	for {
		n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) {
				r.anomaly(fmt.Sprintf("audit session ended: %v", err), nil)
			}
			return // the sandbox closed its end, or Close cut us off
		}
		if n == 0 {
			r.anomaly("audit session ended: empty message (peer closed)", nil)
			return
		}
		r.throttle()
		r.trail.Count(func(c *Counters) { c.Received++ })
		if flags&unix.MSG_TRUNC != 0 {
			r.anomaly(fmt.Sprintf("oversized message (more than %d bytes) discarded", MaxMessageSize), nil)
			continue
		}
		r.Process(buf[:n])
	}
}

// Process handles one message from the sandbox.
func (r *Receiver) Process(b []byte) {
	m, err := r.dec.Decode(b)
	if len(b) >= wire.HeaderStructSize {
		// The dropped count is cumulative and wraps at 2^32.
		if d := m.Dropped - r.lastDropped; d != 0 && d < 1<<31 {
			r.lastDropped = m.Dropped
			r.trail.Count(func(c *Counters) { c.SentryDropped += uint64(d) })
			r.trail.Gap("gVisor dropped events (its socket to the shim was full)", uint64(d))
		}
	}
	if err != nil {
		r.anomaly(err.Error(), map[string]string{"message_type": fmt.Sprint(int(m.Type)), "bytes": fmt.Sprint(len(b))})
		return
	}
	rec := ToRecord(m, r.scrub)
	if rec == nil {
		return
	}
	if t := rec.at; !t.IsZero() {
		if !r.lastTime.IsZero() && t.Before(r.lastTime.Add(-outOfOrderSlack)) {
			r.anomaly(fmt.Sprintf("out of order: %s event at %s, after one at %s", rec.Event, rec.Time, r.lastTime.UTC().Format(time.RFC3339Nano)), nil)
		}
		if t.After(r.lastTime) {
			r.lastTime = t
		}
	}
	if r.Annotate != nil {
		r.Annotate(rec)
	}
	r.trail.Emit(rec, false)
}

func (r *Receiver) anomaly(msg string, detail map[string]string) {
	r.trail.Count(func(c *Counters) { c.Anomalies++ })
	r.anomalies++
	if r.anomalies > MaxAnomalyRecords {
		return
	}
	a := TypeAnomaly.New("Failure", msg, detail)
	if r.anomalies == MaxAnomalyRecords {
		a.Message += fmt.Sprintf(" (anomaly %d: further ones are only counted)", MaxAnomalyRecords)
	}
	r.trail.Emit(a, false)
}

// Close stops listening, drains what the sandbox already sent (for up to
// drain), and removes the socket.
func (r *Receiver) Close(drain time.Duration) {
	r.ln.Close()
	<-r.done
	r.mu.Lock()
	c := r.conn
	r.mu.Unlock()
	if c != nil {
		c.SetReadDeadline(time.Now().Add(drain))
		<-r.handled
	}
	os.Remove(r.path)
}
