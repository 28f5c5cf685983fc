package egressgw

// A secret the gateway injects must not come back into the sandbox: a host
// that echoes request headers (an /echo endpoint, an error page, TRACE)
// would hand the agent the value it was never given. The responses of a
// host a secret is injected for are scanned, headers and body, for the
// secret and its common encodings, and each is replaced before the agent
// reads it. What no scan can stop, a host returning the secret transformed
// some other way (hashed, split, encrypted), is said in docs/egress.md.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/url"
	"regexp"
	"sort"
	"strings"
)

// secretForm is one spelling of a secret a response may carry.
type secretForm struct {
	// Encoding names the spelling in records ("raw", "base64", "url",
	// "json", "base64-decoded").
	Encoding string
	find     []byte
	// repl replaces it in a header: the placeholder (a mask of X for a
	// base64 spelling).
	repl []byte
	// bodyRepl replaces it in a body: repl cut or padded with 'x' to the
	// found spelling's length, so the body keeps its length and framing
	// (Content-Length, length-prefixed formats) as the origin sent them.
	bodyRepl []byte
}

// minFormLen is the shortest spelling scanned for: shorter ones (the
// base64 of a tiny secret) would match ordinary text.
const minFormLen = 6

// removedSecret replaces a secret whose sandbox holds no placeholder.
const removedSecret = "agentbox-secret-removed"

// secretForms lists the spellings of secret a response may carry back,
// each with what replaces it, longest first (a longer spelling wins over a
// shorter one at the same place).
func secretForms(secret, placeholder string) []secretForm {
	if placeholder == "" {
		placeholder = removedSecret
	}
	var forms []secretForm
	seen := map[string]bool{}
	add := func(enc, find, repl string) {
		if len(find) < minFormLen || seen[find] {
			return
		}
		seen[find] = true
		body := (repl + strings.Repeat("x", len(find)))[:len(find)]
		forms = append(forms, secretForm{Encoding: enc, find: []byte(find), repl: []byte(repl), bodyRepl: []byte(body)})
	}
	add("raw", secret, placeholder)
	// URL-encoded (a query string, a form body, a redirect's Location),
	// with upper- and lower-case hex digits.
	for _, esc := range []string{url.QueryEscape(secret), url.PathEscape(secret)} {
		add("url", esc, placeholder)
		add("url", lowerHex(esc), placeholder)
	}
	// JSON-escaped: Go's default (HTML characters as \u003c), plain, and
	// with '/' as '\/' (PHP's default).
	for _, esc := range jsonEscapes(secret) {
		add("json", esc, placeholder)
	}
	// Base64 of the secret wherever it starts within the encoded text: at
	// each of the three alignments, the characters that only the secret's
	// bits decide (an echo that encodes all the headers puts the secret at
	// any offset).
	for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := 0; k < 3; k++ {
			find := alignedBase64(e, secret, k)
			add("base64", find, strings.Repeat("X", len(find)))
		}
	}
	// A secret that is itself base64 (a Basic credential) may come back
	// decoded ("user:password").
	for _, e := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := e.DecodeString(secret); err == nil && printable(b) {
			add("base64-decoded", string(b), placeholder)
			break
		}
	}
	sort.SliceStable(forms, func(i, j int) bool { return len(forms[i].find) > len(forms[j].find) })
	return forms
}

// hexEscapes are percent-escapes, in either case of hex.
var hexEscapes = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)

// lowerHex spells s's percent-escapes in lower-case hex.
func lowerHex(s string) string { return hexEscapes.ReplaceAllStringFunc(s, strings.ToLower) }

// jsonEscapes are the ways JSON encoders escape s (without the quotes).
func jsonEscapes(s string) []string {
	html, _ := json.Marshal(s)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	plain := strings.TrimSuffix(b.String(), "\n")
	trim := func(q string) string { return q[1 : len(q)-1] }
	return []string{trim(string(html)), trim(plain), strings.ReplaceAll(trim(plain), "/", `\/`)}
}

// alignedBase64 is the part of the base64 of secret, preceded by k other
// bytes, that only the secret's bits decide.
func alignedBase64(e *base64.Encoding, secret string, k int) string {
	enc := e.WithPadding(base64.NoPadding).EncodeToString(append(make([]byte, k), secret...))
	first := (8*k + 5) / 6            // the first character wholly inside the secret
	last := 8 * (k + len(secret)) / 6 // one past the last
	if last > len(enc) {
		last = len(enc)
	}
	if first >= last {
		return ""
	}
	return enc[first:last]
}

func printable(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// Reflection counts the replacements of one spelling in one place.
type Reflection struct {
	// Where is "header NAME", "body" or "trailer NAME".
	Where string
	// Encoding is the spelling found (secretForm.Encoding).
	Encoding string
	Count    int
}

// reflections gathers the replacements of one response.
type reflections []Reflection

func (rs *reflections) add(where, encoding string, n int) {
	for i := range *rs {
		if (*rs)[i].Where == where && (*rs)[i].Encoding == encoding {
			(*rs)[i].Count += n
			return
		}
	}
	*rs = append(*rs, Reflection{Where: where, Encoding: encoding, Count: n})
}

// replaceForms replaces every form in s, counting each in rs under where.
func replaceForms(forms []secretForm, s, where string, rs *reflections) string {
	for _, f := range forms {
		if n := strings.Count(s, string(f.find)); n > 0 {
			s = strings.ReplaceAll(s, string(f.find), string(f.repl))
			rs.add(where, f.Encoding, n)
		}
	}
	return s
}

// scrubReader reads src with every form replaced, as it streams: it holds
// back only the bytes that could begin a form (never a whole read), so a
// stream (server-sent events) is not buffered, and a form split across
// reads is still found. Its buffers are made once: a read of src goes
// after the held-back tail, and what is scanned out is copied to the
// caller from out.
type scrubReader struct {
	src   io.Reader
	forms []secretForm
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
	longest := 0
	for _, f := range forms {
		longest = max(longest, len(f.find))
	}
	return &scrubReader{src: src, forms: forms, found: found, onEOF: onEOF,
		buf: make([]byte, scrubReadSize+longest), out: make([]byte, 0, scrubReadSize+longest)}
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
		r.scan(r.buf[:r.held+n], r.err != nil)
	}
	n := copy(p, r.out[r.pos:])
	r.pos += n
	return n, nil
}

// scan moves what of in can no longer change into out: all of it at the
// end, else all but the longest tail that begins a form, which it keeps at
// the start of buf.
func (r *scrubReader) scan(in []byte, final bool) {
	r.out, r.pos = r.out[:0], 0
	pos := 0
	for {
		at, f := -1, -1
		for i := range r.forms {
			j := bytes.Index(in[pos:], r.forms[i].find)
			if j >= 0 && (at < 0 || j < at) {
				at, f = j, i // forms are longest first: a tie keeps the longer
			}
		}
		if at < 0 {
			break
		}
		r.out = append(r.out, in[pos:pos+at]...)
		r.out = append(r.out, r.forms[f].bodyRepl...)
		r.found.add("body", r.forms[f].Encoding, 1)
		pos += at + len(r.forms[f].find)
	}
	rest := in[pos:]
	hold := 0
	if !final {
		hold = r.partial(rest)
	}
	r.out = append(r.out, rest[:len(rest)-hold]...)
	r.held = copy(r.buf, rest[len(rest)-hold:])
}

// partial is the length of the longest tail of b that is a proper prefix
// of a form.
func (r *scrubReader) partial(b []byte) int {
	hold := 0
	for _, f := range r.forms {
		from := len(b) - (len(f.find) - 1)
		if from < 0 {
			from = 0
		}
		for j := from; j < len(b) && len(b)-j > hold; j++ {
			if b[j] == f.find[0] && bytes.HasPrefix(f.find, b[j:]) {
				hold = len(b) - j
				break
			}
		}
	}
	return hold
}
