package egressgw

// The older SSE transport (MCP 2024-11-05): the client GETs a stream whose
// first event, endpoint, names the URL it then POSTs its messages to; the
// server answers each POST 202 and sends its answer on the stream. The
// gateway keeps each open stream by that URL (on the same host): a
// refused message's JSON-RPC errors go on its stream, where the client
// waits for them, and a call let through keeps its record until its
// answer came on the stream (or the stream ended, or maxAnswerWait).

import (
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"agentbox.dev/agentbox/internal/mcp"
)

const (
	// maxStreams bounds a sandbox's open SSE-transport streams the
	// gateway keeps; past it a stream still passes, and its refusals are
	// answered on the POST.
	maxStreams = 64
	// maxInjected bounds the gateway's own events waiting to be sent on
	// one stream.
	maxInjected = 64
	// maxAnswerWait bounds how long a call's record waits for its answer.
	maxAnswerWait = 2 * time.Minute
)

// sseStreams are a sandbox's open SSE-transport streams, by "HOST URI" of
// their endpoint.
type sseStreams struct {
	mu   sync.Mutex
	open map[string]*sseStream
}

// sseKey is the key of the URL uri on host (uri resolved against the
// stream's own URL base, when the endpoint event named it).
func sseKey(host string, u *url.URL) string { return host + " " + u.RequestURI() }

// register keeps s as the stream the endpoint data names; false when it
// names another host or the gateway keeps maxStreams already.
func (ss *sseStreams) register(host string, base *url.URL, data []byte, s *sseStream) bool {
	ref, err := url.Parse(strings.TrimSpace(string(data)))
	if err != nil {
		return false
	}
	u := base.ResolveReference(ref)
	if ref.Host != "" && !strings.EqualFold(u.Hostname(), host) {
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.open == nil {
		ss.open = map[string]*sseStream{}
	}
	if len(ss.open) >= maxStreams {
		return false
	}
	if s.key != "" {
		delete(ss.open, s.key)
	}
	s.key = sseKey(host, u)
	ss.open[s.key] = s
	return true
}

// lookup is the stream whose endpoint is u on host (nil: none).
func (ss *sseStreams) lookup(host string, u *url.URL) *sseStream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.open[sseKey(host, u)]
}

func (ss *sseStreams) remove(s *sseStream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.open[s.key] == s {
		delete(ss.open, s.key)
	}
}

// sseStream is one open stream: the events the gateway adds, and the calls
// sent through its endpoint that wait for their answers.
type sseStream struct {
	key    string // set by register, under sseStreams.mu
	inject chan []byte
	mu     sync.Mutex
	taps   []*mcpTap
	held   map[*mcpTap]func()
	closed bool
}

func newSSEStream() *sseStream {
	return &sseStream{inject: make(chan []byte, maxInjected), held: map[*mcpTap]func(){}}
}

// send queues JSON-RPC answers as one event of the stream; false when its
// queue is full.
func (s *sseStream) send(msg []byte) bool {
	select {
	case s.inject <- []byte("event: message\ndata: " + string(msg) + "\n\n"):
		return true
	default:
		return false
	}
}

// expect notes a POST's calls, answered on the stream.
func (s *sseStream) expect(t *mcpTap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.taps = append(s.taps, t)
	}
}

// answered notes answers that came on the stream; a POST's record whose
// calls are all answered now goes.
func (s *sseStream) answered(answers []mcp.Answer) {
	if len(answers) == 0 {
		return
	}
	var ready []func()
	s.mu.Lock()
	s.taps = slices.DeleteFunc(s.taps, func(t *mcpTap) bool {
		t.answered(answers)
		if !t.allAnswered() {
			return false
		}
		if f := s.held[t]; f != nil {
			ready = append(ready, f)
			delete(s.held, t)
		}
		return true
	})
	s.mu.Unlock()
	for _, f := range ready {
		f()
	}
}

// recordAnswered has record called with t's calls once the stream
// answered them all (or ended, or maxAnswerWait passed): at once when it
// did already. The calls are taken when record is called: an answer that
// came between the POST's response and now is in them.
func (s *sseStream) recordAnswered(t *mcpTap, record func([]MCPCallDone)) {
	if !s.hold(t, func() { record(t.callsNow()) }) {
		record(t.callsNow())
	}
}

// hold keeps a POST's record until its calls are answered; false when
// none waits (record it now).
func (s *sseStream) hold(t *mcpTap, record func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !slices.Contains(s.taps, t) {
		return false
	}
	s.held[t] = record
	time.AfterFunc(maxAnswerWait, func() { s.release(t) })
	return true
}

// release records a held POST now, answered or not.
func (s *sseStream) release(t *mcpTap) {
	s.mu.Lock()
	s.taps = slices.DeleteFunc(s.taps, func(x *mcpTap) bool { return x == t })
	f := s.held[t]
	delete(s.held, t)
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// end records every held POST: the stream that would answer them ended.
func (s *sseStream) end() {
	s.mu.Lock()
	s.closed = true
	held := s.held
	s.held, s.taps = map[*mcpTap]func(){}, nil
	s.mu.Unlock()
	for _, f := range held {
		f()
	}
}

// sseMerge is a stream's body as the client gets it: the server's events
// (read by pump, each whole) with the gateway's own between them.
type sseMerge struct {
	events chan sseItem
	inject <-chan []byte
	stop   chan struct{}
	once   sync.Once
	body   io.Closer
	ended  func()
	buf    []byte
	err    error
}

type sseItem struct {
	b   []byte
	err error
}

func newSSEMerge(src *mcp.SSE, body io.Closer, s *sseStream, ended func()) *sseMerge {
	m := &sseMerge{events: make(chan sseItem), inject: s.inject, stop: make(chan struct{}), body: body, ended: ended}
	go func() {
		for {
			b, err := src.Event()
			select {
			case m.events <- sseItem{b, err}:
			case <-m.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return m
}

func (m *sseMerge) Read(p []byte) (int, error) {
	for len(m.buf) == 0 {
		if m.err != nil {
			return 0, m.err
		}
		select {
		case it := <-m.events:
			m.buf, m.err = it.b, it.err
		case b := <-m.inject:
			m.buf = b
		}
	}
	n := copy(p, m.buf)
	m.buf = m.buf[n:]
	return n, nil
}

func (m *sseMerge) Close() error {
	var err error
	m.once.Do(func() {
		close(m.stop)
		err = m.body.Close()
		m.ended()
	})
	return err
}

// sseRefusal answers a refused POST to a stream's endpoint on the stream
// (its body: the JSON-RPC errors); the POST itself gets 202, as the
// server's would. False when the stream's queue is full.
func sseRefusal(cw *countingWriter, s *sseStream, body []byte) bool {
	if body != nil && !s.send(body) {
		return false
	}
	cw.WriteHeader(202)
	return true
}

func (t *mcpTap) allAnswered() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.calls {
		if !c.Answered {
			return false
		}
	}
	return true
}
