package egressgw

// Plumbing for the HTTP front: pooled copy buffers, connections handed to
// net/http, and counting what a request and a response carried.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
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

func addrPortString(s string) netip.AddrPort {
	ap, _ := netip.ParseAddrPort(s)
	return ap
}

type countingWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	// idle bounds each write: an agent that stops reading frees its
	// connection.
	idle   time.Duration
	status int
	n      int64
	// err is the first write that failed.
	err error
	// tunnel, for an allowed WebSocket, wraps the hijacked connection.
	tunnel func(net.Conn) net.Conn
	// interim, when set, is given the header of each interim (1xx)
	// response the proxy passes on, before it goes: the scrub's.
	interim func(http.Header)
}

func (w *countingWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An interim response (103 Early Hints): the final one follows.
		if w.interim != nil {
			w.interim(w.Header())
		}
		w.ResponseWriter.WriteHeader(code)
		return
	}
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
	if err != nil && w.err == nil {
		w.err = err
	}
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
//
// Once it has read the body's end it answers io.EOF, without asking the
// body again. The transport reads a body with a Content-Length once more
// after its last byte, to check there is no more, and by then net/http may
// have closed the body (it does when the response's header is written to
// the agent, once the body was read): that read would fail with "read
// after close", and the transport would close the site's connection while
// the response still streams.
type countingBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int
	n     int64
	slow  bool
	eof   bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
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
	b.eof = err == io.EOF
	return n, err
}
