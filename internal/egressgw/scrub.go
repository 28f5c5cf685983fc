package egressgw

// The scan of a response for the injected secrets' forms: headers and
// trailers whole, a body as it streams. A form is matched with whitespace
// between any of its characters (MIME wraps base64 at 76 columns with
// CRLF; an obsolete folded header line joins with a space), so a line
// break is no side door.

import (
	"bytes"
	"io"
	"net/http"
	"sort"
	"strings"
)

// maxGap is the longest run of whitespace a form is matched across: a
// MIME line break (CRLF), a folded header's (CRLF and a space or tab), and
// room. A longer run parts what is on either side of it: the bytes held
// back while a form may still be completing stay bounded.
const maxGap = 4

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// matcher finds forms in text whose characters short runs of whitespace
// may part: in a header any run, in a body a run that breaks the line
// (holds a LF). Prose is full of spaces and a body streams: a body's scan
// squeezes only where a line breaks, and a chunk with no line break is
// scanned as it is. Its buffers are reused: one matcher per stream, never
// shared.
type matcher struct {
	forms []secretForm
	// finds are the forms without their whitespace.
	finds [][]byte
	// sep stands in sq for a run of whitespace longer than maxGap: a
	// byte no find holds.
	sep byte
	// maxHold bounds what scan holds back.
	maxHold int
	// sq is the text scanned, without the runs that may part a form;
	// gaps say where they were.
	sq   []byte
	gaps []gap
	buf  []byte
}

// gap: from sq[at] on, skip bytes of the text were left out of sq.
type gap struct{ at, skip int }

func newMatcher(forms []secretForm) *matcher {
	m := &matcher{forms: forms}
	var used [256]bool
	longest := 0
	for _, f := range forms {
		find := bytes.Map(func(r rune) rune {
			if r < 0x80 && isSpace(byte(r)) {
				return -1
			}
			return r
		}, f.find)
		m.finds = append(m.finds, find)
		longest = max(longest, len(find))
		for _, c := range find {
			used[c] = true
		}
	}
	for c := range used {
		if !used[c] {
			m.sep = byte(c)
			break
		}
	}
	// A tail that may begin a form: its characters, each followed by a
	// run of whitespace.
	m.maxHold = longest * (1 + maxGap)
	return m
}

// squeeze sets sq and gaps from in: every run of whitespace that holds a
// LF (any run, when anySpace) is left out, or, when longer than maxGap,
// becomes sep.
func (m *matcher) squeeze(in []byte, anySpace bool) {
	m.gaps = m.gaps[:0]
	next := func(from int) int {
		if anySpace {
			for i := from; i < len(in); i++ {
				if isSpace(in[i]) {
					return i
				}
			}
			return -1
		}
		if j := bytes.IndexByte(in[from:], '\n'); j >= 0 {
			return from + j
		}
		return -1
	}
	i := next(0)
	if i < 0 {
		m.sq = in
		return
	}
	sq, last, skip := m.buf[:0], 0, 0
	for i >= 0 {
		a, b := i, i+1
		for a > last && isSpace(in[a-1]) {
			a--
		}
		for b < len(in) && isSpace(in[b]) {
			b++
		}
		sq = append(sq, in[last:a]...)
		if b-a > maxGap {
			sq = append(sq, m.sep)
			skip += b - a - 1
		} else {
			skip += b - a
		}
		m.gaps = append(m.gaps, gap{len(sq), skip})
		last = b
		if b >= len(in) {
			break
		}
		i = next(b)
	}
	sq = append(sq, in[last:]...)
	m.sq, m.buf = sq, sq
}

// at is where sq[k] is in the text.
func (m *matcher) at(k int) int {
	i := sort.Search(len(m.gaps), func(i int) bool { return m.gaps[i].at > k })
	if i == 0 {
		return k
	}
	return k + m.gaps[i-1].skip
}

// scan appends to out what of in can no longer change, each form in it
// replaced (in a body by its bodyRepl, in the places of the form's
// characters, so the body keeps its length and its line breaks; in a
// header by its repl), counting each under where. Unless final, it
// holds back the longest tail of in that may begin a form, and says how
// long that tail is: it is to be scanned again with what follows.
func (m *matcher) scan(out, in []byte, final, body bool, where string, found *reflections) ([]byte, int) {
	m.squeeze(in, !body)
	sq := m.sq
	last, p := 0, 0
	for {
		at, f := -1, -1
		for i, find := range m.finds {
			j := bytes.Index(sq[p:], find)
			if j >= 0 && (at < 0 || j < at) {
				at, f = j, i // forms are longest first: a tie keeps the longer
			}
		}
		if at < 0 {
			break
		}
		start, end := m.at(p+at), m.at(p+at+len(m.finds[f])-1)+1
		out = append(out, in[last:start]...)
		if body {
			// The replacement takes the form's characters' places; the
			// whitespace between them stays (a MIME body keeps its
			// lines, its base64 its alignment).
			repl, k := m.forms[f].bodyRepl, 0
			for _, c := range in[start:end] {
				switch {
				case isSpace(c):
				case k < len(repl):
					c, k = repl[k], k+1
				default:
					c = 'x'
				}
				out = append(out, c)
			}
		} else {
			out = append(out, m.forms[f].repl...)
		}
		found.add(where, m.forms[f].Encoding, 1)
		last, p = end, p+at+len(m.finds[f])
	}
	hold := 0
	if h := m.partial(sq[p:]); !final && h > 0 {
		hold = len(in) - m.at(len(sq)-h)
	}
	return append(out, in[last:len(in)-hold]...), hold
}

// partial is the length of the longest tail of b that is a proper prefix
// of a find.
func (m *matcher) partial(b []byte) int {
	hold := 0
	for _, find := range m.finds {
		from := max(len(b)-(len(find)-1), 0)
		for j := from; j < len(b) && len(b)-j > hold; j++ {
			if b[j] == find[0] && bytes.HasPrefix(find, b[j:]) {
				hold = len(b) - j
				break
			}
		}
	}
	return hold
}

// replaceForms replaces every form in s, counting each in rs under where.
func replaceForms(forms []secretForm, s, where string, rs *reflections) string {
	out, _ := newMatcher(forms).scan(nil, []byte(s), true, false, where, rs)
	return string(out)
}

// scrubHeader is h with every form of the secrets replaced in its values;
// a field whose name holds one is dropped.
func scrubHeader(forms []secretForm, h http.Header, where string, found *reflections) http.Header {
	m := newMatcher(forms)
	for k, vs := range h {
		if enc, ok := m.inName(k); ok {
			found.add(where+" name", enc, 1)
			delete(h, k)
			continue
		}
		for i, v := range vs {
			out, _ := m.scan(nil, []byte(v), true, false, where+" "+k, found)
			vs[i] = string(out)
		}
	}
	return h
}

// inName says whether a header's name holds a form, in any case (names
// are canonicalized), and which.
func (m *matcher) inName(name string) (string, bool) {
	lower := strings.ToLower(name)
	for i, find := range m.finds {
		if strings.Contains(lower, strings.ToLower(string(find))) {
			return m.forms[i].Encoding, true
		}
	}
	return "", false
}

// scrubReader reads src with every form replaced, as it streams: it holds
// back only the bytes that could begin a form (never a whole read), so a
// stream (server-sent events) is not buffered, and a form split across
// reads is still found. Its buffers are made once: a read of src goes
// after the held-back tail, and what is scanned out is copied to the
// caller from out.
type scrubReader struct {
	src io.Reader
	m   *matcher
	// onEOF runs once, when src ends (trailers are scrubbed then).
	onEOF func()
	found *reflections
	// buf[:held] is the tail held back from the last scan.
	buf  []byte
	held int
	out  []byte
	pos  int // out[pos:] is not yet returned
	err  error
}

// scrubReadSize matches the HTTP front's copy buffer: a response is
// written to the agent in writes as large as unscanned.
const scrubReadSize = 128 << 10

func newScrubReader(src io.Reader, forms []secretForm, found *reflections, onEOF func()) *scrubReader {
	m := newMatcher(forms)
	return &scrubReader{src: src, m: m, found: found, onEOF: onEOF,
		buf: make([]byte, scrubReadSize+m.maxHold), out: make([]byte, 0, scrubReadSize+m.maxHold)}
}

func (r *scrubReader) Read(p []byte) (int, error) {
	for r.pos == len(r.out) {
		if r.err != nil {
			return 0, r.err
		}
		n, err := r.src.Read(r.buf[r.held:])
		if err != nil {
			r.err = err
			if r.onEOF != nil && err == io.EOF {
				r.onEOF()
			}
		}
		in := r.buf[:r.held+n]
		var hold int
		r.out, hold = r.m.scan(r.out[:0], in, r.err != nil, true, "body", r.found)
		r.pos = 0
		r.held = copy(r.buf, in[len(in)-hold:])
	}
	n := copy(p, r.out[r.pos:])
	r.pos += n
	return n, nil
}
