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
