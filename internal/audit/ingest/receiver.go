// Package ingest receives what gVisor's Sentry reports about a sandbox,
// over the per-sandbox socket runsc's trace session writes to, and turns
// each event into an audit record for the sandbox's trail. Everything it
// reads comes from the sandbox and is untrusted: a malformed message, a
// flood or a forged field is a recorded anomaly or gap, never a crash. It
// is the only package that reads gVisor's seccheck protos.
package ingest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"

	"agentbox.dev/agentbox/internal/audit"
)

// MaxAnomalyRecords bounds how many anomalies get a record of their own;
// the rest are counted (the end record has the total).
const MaxAnomalyRecords = 100

// The session reader takes events in batches: after reading, it pauses
// while more queue on the socket (gVisor's end holds about 160 events,
// measured, and retries a full socket before it drops one), so that each
// gVisor write finds no reader waiting to be woken. Waking the shim once
// per event was most of what auditing cost a busy sandbox: per event, about
// 60µs of the shim's CPU and 70µs of the Sentry's (hack/bench.sh, an
// `ls -la` loop, 29k events). The pause adapts to the rate, aiming at
// batchLow..batchHigh events per read, within pauseBounds.
const (
	batchLow, batchHigh = 16, 64
	firstPause          = time.Millisecond
	longestPause        = 4 * time.Millisecond
)

// pauseBounds is the range of the reader's pause when gVisor retries a
// full socket retries times (backing off from 25µs, doubling, at most
// 10ms apart): at most a quarter of the time gVisor keeps retrying, so
// that a sandbox that fills its socket during a pause is slowed down,
// not cut short. With no retries there is no pause.
func pauseBounds(retries int) (lo, hi time.Duration) {
	var budget time.Duration
	for i, step := 0, 25*time.Microsecond; i < retries; i++ {
		budget += step
		if step *= 2; step > 10*time.Millisecond {
			step = 10 * time.Millisecond
		}
	}
	hi = min(budget/4, longestPause)
	if hi < 100*time.Microsecond {
		return 0, 0
	}
	return min(hi, 500*time.Microsecond), hi
}

// nextPause adapts the pause to the last read's n events: longer while
// reads find few, shorter when they find many.
func nextPause(cur time.Duration, n int, lo, hi time.Duration) time.Duration {
	switch {
	case n < batchLow:
		cur *= 2
	case n > batchHigh:
		cur /= 2
	}
	return max(lo, min(cur, hi))
}

// outOfOrderSlack is how far an event's time may go back before it counts
// as out of order (threads report concurrently).
const outOfOrderSlack = time.Second

// Receiver serves one sandbox's gVisor trace session on its own
// SOCK_SEQPACKET socket: the connection, not what the sandbox says,
// identifies the sandbox. Everything read is untrusted: malformed,
// oversized or out-of-order messages become anomaly records, never a crash
// or a stall of the shim.
type Receiver struct {
	// opts is the configuration Listen was given: read-only after.
	opts ReceiverOptions

	path  string
	ln    *net.UnixListener
	trail *audit.Trail
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
	// wake (an eventfd) becomes readable when Close wants the session
	// drained until drainUntil (Unix nanoseconds).
	wake       int
	drainUntil atomic.Int64
	// pauseLo and pauseHi bound the reader's pause (SentryRetries):
	// read-only after Listen.
	pauseLo, pauseHi time.Duration

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

// ReceiverOptions is a receiver's whole configuration, fixed at Listen:
// nothing is set on a receiver that serves.
type ReceiverOptions struct {
	// SentryRetries is how often gVisor retries a full socket (the pod
	// init config's sink "retries"): it bounds how long the reader may
	// pause between reads.
	SentryRetries int
	// MaxEventsPerSecond bounds the events taken from the sandbox (0: no
	// bound). Past it the receiver reads more slowly: gVisor's sink then
	// retries a full socket, which slows the sandbox down.
	MaxEventsPerSecond int
	// Annotate, when set, may add to each event record before it is
	// sealed (the shim adds egress decisions).
	Annotate func(*audit.Record)
	// Emitted, when set, sees each event record once it is in the trail
	// (its Seq set; 0 if it was lost).
	Emitted func(*audit.Record)
}

// Listen creates the socket (mode 0600) and serves it, configured by opts.
func Listen(path string, trail *audit.Trail, scrub Scrubber, opts ReceiverOptions) (*Receiver, error) {
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
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("audit socket %s: eventfd: %w", path, err)
	}
	r := &Receiver{opts: opts, path: path, ln: ln, trail: trail, scrub: scrub, wake: wake, done: make(chan struct{}), handled: make(chan struct{})}
	r.pauseLo, r.pauseHi = pauseBounds(opts.SentryRetries)
	r.rate.Store(int64(opts.MaxEventsPerSecond))
	go r.serve()
	return r, nil
}

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
	sb, err := newSessionBuffer()
	if err != nil {
		r.anomaly(err.Error(), nil)
		return
	}
	defer sb.free()
	n, _, flags, _, err := c.ReadMsgUnix(sb.b, nil)
	if err != nil {
		r.anomaly(fmt.Sprintf("handshake: %v", err), nil)
		return
	}
	var hs pb.Handshake
	if flags&unix.MSG_TRUNC != 0 || proto.Unmarshal(sb.b[:n], &hs) != nil || hs.GetVersion() < 1 {
		r.anomaly("handshake: not a gVisor handshake", nil)
		return
	}
	out, _ := proto.Marshal(&pb.Handshake{Version: wire.CurrentVersion})
	if _, err := c.Write(out); err != nil {
		r.anomaly(fmt.Sprintf("handshake reply: %v", err), nil)
		return
	}
	r.connected.Store(true)
	fd, err := detach(c)
	if err != nil {
		r.anomaly(fmt.Sprintf("audit session: %v", err), nil)
		return
	}
	defer unix.Close(fd)
	r.readLoop(fd, sb)
}

// detach takes the session's descriptor out of Go's network poller: a
// descriptor in the poller's epoll set wakes a shim thread on every event
// gVisor writes, however the shim reads it.
func detach(c *net.UnixConn) (int, error) {
	sc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := sc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("dup: %w", derr)
	}
	c.Close() // the poller forgets it; fd (non-blocking, like c) stays open
	return fd, nil
}

// readLoop reads the session until the sandbox closes its end, or Close
// has drained it. It reads what is queued, pauses while more queues, and
// blocks in poll(2) only once a read found nothing.
func (r *Receiver) readLoop(fd int, sb *sessionBuffer) {
	var deadline time.Time // set once Close asked for the rest
	var yielded time.Time  // when the reader last yielded its P
	pause, paused := max(r.pauseLo, min(firstPause, r.pauseHi)), false
	for {
		n, end := r.readQueued(fd, sb)
		if end {
			return
		}
		if paused {
			pause, paused = nextPause(pause, n, r.pauseLo, r.pauseHi), false
		}
		if deadline.IsZero() {
			if at := r.drainUntil.Load(); at != 0 {
				deadline = time.Unix(0, at)
			}
		}
		if n > 0 {
			if deadline.IsZero() && pause > 0 {
				// The pause is a blocking ppoll(2) on the wake descriptor,
				// not time.Sleep, whose timer wakes more threads than this
				// one. A goroutine that stays in syscalls on one scheduler
				// tick for 10ms makes the runtime's monitor take its P and
				// go back to polling every 20µs; yielding every few
				// milliseconds keeps the monitor asleep. Measured on an
				// event storm: 4500 context switches a second with
				// time.Sleep, 1600 now.
				if now := time.Now(); now.Sub(yielded) > 4*time.Millisecond {
					runtime.Gosched()
					yielded = now
				}
				ts := unix.NsecToTimespec(int64(pause))
				unix.Ppoll([]unix.PollFd{{Fd: int32(r.wake), Events: unix.POLLIN}}, &ts, nil)
				paused = true
			}
			continue // after the pause, or draining, or no pause
		}
		timeout := -1
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(r.wake), Events: unix.POLLIN}}
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return
			}
			timeout = int((left + time.Millisecond - 1) / time.Millisecond)
			fds = fds[:1]
		}
		if _, err := unix.Poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
			r.anomaly(fmt.Sprintf("audit session ended: poll: %v", err), nil)
			return
		}
	}
}

// readQueued processes the messages queued on fd, without waiting; n is
// how many, end whether the session is over.
func (r *Receiver) readQueued(fd int, sb *sessionBuffer) (n int, end bool) {
	for {
		m, _, flags, _, err := unix.Recvmsg(fd, sb.b, nil, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return n, false
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			r.anomaly(fmt.Sprintf("audit session ended: %v", err), nil)
			return n, true
		case m == 0:
			// gVisor never sends an empty message (its header alone is
			// 8 bytes): this is the sandbox's end closing.
			return n, true
		}
		n++
		if r.drainUntil.Load() == 0 {
			// Once Close drains, what is queued is taken at once: the
			// sandbox is gone, and its socket may hold thousands of events.
			r.throttle()
		}
		r.trail.Count(func(c *audit.Counters) { c.Received++ })
		if flags&unix.MSG_TRUNC != 0 {
			r.anomaly(fmt.Sprintf("oversized message (more than %d bytes) discarded", MaxMessageSize), nil)
		} else {
			r.Process(sb.b[:m])
		}
		sb.release(m)
		if at := r.drainUntil.Load(); at != 0 && time.Now().UnixNano() > at {
			return n, true // Close's drain is over, however much still comes
		}
	}
}

// Process handles one message from the sandbox.
func (r *Receiver) Process(b []byte) {
	m, err := r.dec.Decode(b)
	if len(b) >= wire.HeaderStructSize {
		// The dropped count is cumulative and wraps at 2^32.
		if d := m.Dropped - r.lastDropped; d != 0 && d < 1<<31 {
			r.lastDropped = m.Dropped
			r.trail.Count(func(c *audit.Counters) { c.SentryDropped += uint64(d) })
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
	if t := rec.At(); !t.IsZero() {
		if !r.lastTime.IsZero() && t.Before(r.lastTime.Add(-outOfOrderSlack)) {
			r.anomaly(fmt.Sprintf("out of order: %s event at %s, after one at %s", rec.Event, rec.Time, r.lastTime.UTC().Format(time.RFC3339Nano)), nil)
		}
		if t.After(r.lastTime) {
			r.lastTime = t
		}
	}
	if r.opts.Annotate != nil {
		r.opts.Annotate(rec)
	}
	r.trail.Emit(rec, false)
	if r.opts.Emitted != nil {
		r.opts.Emitted(rec)
	}
}

func (r *Receiver) anomaly(msg string, detail map[string]string) {
	r.trail.Count(func(c *audit.Counters) { c.Anomalies++ })
	r.anomalies++
	if r.anomalies > MaxAnomalyRecords {
		return
	}
	a := audit.TypeAnomaly.New("Failure", msg, detail)
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
		at := time.Now().Add(drain)
		r.drainUntil.Store(at.UnixNano())
		c.SetReadDeadline(at) // a session still in its handshake
		var one [8]byte
		one[0] = 1 // an eventfd counter increment (little-endian)
		unix.Write(r.wake, one[:])
		<-r.handled
	}
	unix.Close(r.wake)
	os.Remove(r.path)
}
