package egressgw

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
)

// Every spelling an echo gives the secret in is among its forms: the raw
// secret, URL- and JSON-escaped, and base64 at whatever offset it starts
// in the encoded text (an echo that encodes all its headers), in either
// alphabet.
func TestSecretFormsCoverEchoes(t *testing.T) {
	for _, secret := range []string{reflectSecret, "sk-ant-api03-AbCdEf0123456789_xyz", "p@ss w/rd?&=é"} {
		forms := secretForms(secret, placeholder)
		covered := func(text string) bool {
			for _, f := range forms {
				if strings.Contains(text, string(f.find)) {
					return true
				}
			}
			return false
		}
		html, _ := json.Marshal(map[string]string{"authorization": "Bearer " + secret})
		var plain bytes.Buffer
		enc := json.NewEncoder(&plain)
		enc.SetEscapeHTML(false)
		enc.Encode(map[string]string{"authorization": "Bearer " + secret})
		echoes := []string{
			"Authorization: Bearer " + secret,
			"?auth=" + url.QueryEscape("Bearer "+secret),
			"/" + url.PathEscape(secret) + "/x",
			regexp.MustCompile(`%[0-9A-F]{2}`).ReplaceAllStringFunc(url.QueryEscape(secret), strings.ToLower),
			string(html), plain.String(), strings.ReplaceAll(plain.String(), "/", `\/`),
		}
		for pre := 0; pre < 6; pre++ {
			for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
				echoes = append(echoes, e.EncodeToString([]byte(strings.Repeat("h", pre)+"Authorization: Bearer "+secret+"\nAccept: */*\n")))
			}
		}
		for _, echo := range echoes {
			if !covered(echo) {
				t.Errorf("secret %q: no form found in %q", secret, echo)
			}
		}
		// Ordinary text is not touched.
		if covered("HTTP/1.1 200 OK\nContent-Type: application/json\n{\"ok\":true}") {
			t.Errorf("secret %q: a form matches ordinary text", secret)
		}
	}
	// A Basic credential's secret is base64: it may come back decoded.
	basic := base64.StdEncoding.EncodeToString([]byte("agent:hunter2-very-secret"))
	found := false
	for _, f := range secretForms(basic, "") {
		if f.Encoding == "base64-decoded" && string(f.find) == "agent:hunter2-very-secret" && string(f.repl) == removedSecret {
			found = true
		}
	}
	if !found {
		t.Errorf("the decoded Basic credential is not a form: %+v", secretForms(basic, ""))
	}
}

// The scrub finds a form however the body is cut into reads, and passes on
// at once what cannot begin one (a stream is not held back).
func TestScrubReader(t *testing.T) {
	forms := secretForms("TOPSECRET-123456", "PLACEHOLDER")
	body := "a TOPSECRET-123456 b TOPSECRET-12345 c TOPSECRET-123456TOPSECRET-123456 " + base64.StdEncoding.EncodeToString([]byte("xTOPSECRET-123456")) + " TOPSECRET-"
	want := "a PLACEHOLDERxxxxx b TOPSECRET-12345 c PLACEHOLDERxxxxxPLACEHOLDERxxxxx "
	for name, wrap := range map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
		"data+err": iotest.DataErrReader,
	} {
		var found reflections
		got, err := io.ReadAll(newScrubReader(wrap(strings.NewReader(body)), forms, &found, nil))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.HasPrefix(string(got), want) || strings.Contains(string(got), "TOPSECRET-123456") || !strings.HasSuffix(string(got), " TOPSECRET-") {
			t.Errorf("%s: %q", name, got)
		}
		n := map[string]int{}
		for _, r := range found {
			n[r.Encoding] += r.Count
		}
		if n["raw"] != 3 || n["base64"] != 1 {
			t.Errorf("%s: found %+v", name, found)
		}
	}
	// What cannot begin a form comes out of the read it arrived in: only
	// a tail that may begin one waits.
	pr, pw := io.Pipe()
	var found reflections
	r := newScrubReader(pr, forms, &found, nil)
	go pw.Write([]byte("data: {\"delta\":\"hi\"}\n\n"))
	buf := make([]byte, 100)
	if n, _ := r.Read(buf); string(buf[:n]) != "data: {\"delta\":\"hi\"}\n\n" {
		t.Fatalf("a streamed event was held back: %q", buf[:n])
	}
	go pw.Write([]byte("event TOPSE"))
	if n, _ := r.Read(buf); string(buf[:n]) != "event " {
		t.Fatalf("got %q, want the part before a form's possible start", buf[:n])
	}
	go func() { pw.Write([]byte("CRET-123456!")); pw.Close() }()
	rest, _ := io.ReadAll(r)
	if string(rest) != "PLACEHOLDERxxxxx!" {
		t.Fatalf("a form split across reads: %q", rest)
	}
}

// replaceForms counts each header's replacements by name.
func TestReplaceFormsInHeaders(t *testing.T) {
	forms := secretForms(reflectSecret, placeholder)
	var found reflections
	got := replaceForms(forms, "Bearer "+reflectSecret+" and "+url.QueryEscape(reflectSecret), "header X-Echo", &found)
	if got != "Bearer "+placeholder+" and "+placeholder || len(found) != 2 || found[0].Where != "header X-Echo" {
		t.Fatalf("%q %+v", got, found)
	}
}

// FuzzScrubReader: whatever the body and however it is read, the scrubbed
// output holds no raw form of the secret, and a body without one comes
// out as it went in.
func FuzzScrubReader(f *testing.F) {
	f.Add([]byte("x TOPSECRET-123456 y"), uint8(3))
	f.Add([]byte("TOPSECRET-TOPSECRET-123456"), uint8(1))
	f.Add([]byte("plain body"), uint8(7))
	forms := secretForms("TOPSECRET-123456", "PLACEHOLDER")
	f.Fuzz(func(t *testing.T, body []byte, chunk uint8) {
		var found reflections
		got, err := io.ReadAll(newScrubReader(&chunked{b: body, n: int(chunk%16) + 1}, forms, &found, nil))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(got, []byte("TOPSECRET-123456")) {
			t.Fatalf("the secret got through: %q", got)
		}
		if len(found) == 0 && !bytes.Equal(got, body) {
			t.Fatalf("nothing found, yet the body changed: %q -> %q", body, got)
		}
	})
}

// chunked reads b n bytes at a time.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[k:]
	return k, nil
}
