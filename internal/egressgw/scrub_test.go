package egressgw

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tlsBytes makes one request over TLS with Connection: close and returns
// every byte the agent read: interim responses included.
func (f *fixture) tlsBytes(t *testing.T, roots *x509.CertPool, sni, raw string) string {
	t.Helper()
	tc := f.tlsConn(t, roots, sni)
	defer tc.Close()
	if _, err := io.WriteString(tc, raw); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(tc)
	return string(b)
}

// mimeBase64 is s in base64 as MIME writes it: 76 columns, CRLF.
func mimeBase64(s string) string {
	enc := base64.StdEncoding.EncodeToString([]byte(s))
	var b strings.Builder
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\r\n")
		enc = enc[76:]
	}
	b.WriteString(enc)
	return b.String()
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// The side doors of issue 47, each tried against the host the secret is
// injected for, beside its twin: an interim response's headers, stacked
// content codings, MIME's line-wrapped base64, a folded header, a
// transfer coding the gateway cannot read.
func TestScrubSideDoors(t *testing.T) {
	f, roots := reflectFixture(t)
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		auth := r.Header.Get("Authorization")
		// Each line of the echo wraps the key at a different column.
		echo := strings.Repeat("Authorization: "+auth+"\r\n", 3) + "pad-" + auth + "\r\n"
		switch r.URL.Path {
		case "/gzip-comma":
			w.Header().Set("Content-Encoding", "gzip, gzip")
			w.Write(gzipped(gzipped([]byte(echo))))
		case "/gzip-br":
			w.Header().Set("Content-Encoding", "gzip, br")
			w.Write(gzipped([]byte(echo)))
		case "/mime":
			w.Header().Set("Content-Type", "message/rfc822")
			io.WriteString(w, "Content-Transfer-Encoding: base64\r\n\r\n")
			for pre := 0; pre < 3; pre++ {
				io.WriteString(w, mimeBase64(strings.Repeat("h", 50+pre)+echo)+"\r\n\r\n")
			}
		case "/mime-honest":
			io.WriteString(w, mimeBase64(strings.Repeat("ordinary attachment text ", 20)))
		case "/encoded-word":
			w.Header().Set("X-Subject", "=?utf-8?b?"+base64.StdEncoding.EncodeToString([]byte("key: "+auth))+"?=")
		default:
			return false
		}
		return true
	}
	forms := secretForms(reflectSecret, "")
	leaks := func(got string) string {
		squeezed := strings.NewReplacer("\r", "", "\n", "", " ", "").Replace(got)
		for _, form := range forms {
			if strings.Contains(squeezed, string(form.find)) {
				return form.Encoding
			}
		}
		return ""
	}
	for _, tc := range []struct {
		path, want, encoding string
		reflected            bool
	}{
		{"/api/echo-hints", "HTTP/1.1 103 Early Hints", "raw", true},
		{"/api/echo-stacked", "HTTP/1.1 200", "raw", true},
		{"/api/echo-gzip-twice", "HTTP/1.1 200", "raw", true},
		{"/api/echo-mime", "HTTP/1.1 200", "base64", true},
		{"/gzip-comma", "HTTP/1.1 200", "raw", true},
		{"/mime", "HTTP/1.1 200", "base64", true},
		{"/encoded-word", "HTTP/1.1 200", "base64", true},
		// Refused: br is not decoded, so it is not scanned.
		{"/gzip-br", "HTTP/1.1 502", "", false},
	} {
		got := f.tlsBytes(t, roots, "b.test", "GET "+tc.path+" HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q", tc.path, got)
		}
		if enc := leaks(got); enc != "" {
			t.Errorf("%s: the secret (%s) reached the agent: %q", tc.path, enc, got)
		}
		e := f.event(t)
		if !tc.reflected {
			if e.Kind != Refused || !strings.Contains(e.Reason, "br-encoded") {
				t.Errorf("%s: event %v %q", tc.path, e.Kind, e.Reason)
			}
			continue
		}
		var found bool
		for _, r := range e.Reflected {
			found = found || r.Encoding == tc.encoding
		}
		if !found {
			t.Errorf("%s: reflected %+v, want %s", tc.path, e.Reflected, tc.encoding)
		}
		if tc.path == "/api/echo-hints" && (!strings.Contains(got, "Link: </style.css?auth=Bearer agentbox-") || !strings.HasSuffix(got, "after the hints\n")) {
			t.Errorf("the early hint's Link was not scrubbed in place: %q", got)
		}
	}
	// The twins: an honest 103 passes through with its Link, toward the
	// secret's host and toward another; an honest MIME body is as sent.
	for _, host := range []string{"b.test", "a.test"} {
		got := f.tlsBytes(t, roots, host, "GET /api/hints HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(got, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200") || !strings.HasSuffix(got, "after the hints\n") {
			t.Errorf("honest 103 from %s: %q", host, got)
		}
		// (a.test's TLS is spliced: its event has no status.)
		if e := f.event(t); e.Kind == Refused || len(e.Reflected) != 0 {
			t.Errorf("honest 103 from %s: status %d reflected %+v", host, e.Status, e.Reflected)
		}
	}
	honest := mimeBase64(strings.Repeat("ordinary attachment text ", 20))
	if got := f.tlsBytes(t, roots, "b.test", "GET /mime-honest HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n"); !strings.HasSuffix(got, "\r\n\r\n"+honest) {
		t.Errorf("an honest MIME body changed: %q", got)
	}
	f.event(t)
}

// A transfer coding other than chunked is refused by the transport: the
// agent gets a 502, never the bytes as they came.
func TestOddTransferCodingRefused(t *testing.T) {
	f, roots := reflectFixture(t)
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/te-gzip" {
			return false
		}
		c, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return true
		}
		defer c.Close()
		body := gzipped([]byte("Authorization: " + r.Header.Get("Authorization")))
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		buf.Flush()
		return true
	}
	got := f.tlsBytes(t, roots, "b.test", "GET /te-gzip HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 502") || strings.Contains(got, "\x1f\x8b") {
		t.Errorf("the agent got %q", got)
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "transfer encoding") {
		t.Errorf("event %v %q", e.Kind, e.Reason)
	}
}

// The matcher: a form parted by whitespace is found, and replaced with
// the whitespace (the body keeps its length); a run longer than maxGap
// parts it for good; what is held back is bounded.
func TestMatcherWhitespace(t *testing.T) {
	forms := secretForms("TOPSECRET-123456", "PLACEHOLDER")
	m := newMatcher(forms)
	for _, tc := range []struct{ in, want string }{
		{"a TOPSECRET-123456 b", "a PLACEHOLDERxxxxx b"},
		{"a TOPSE\r\nCRET-123456 b", "a PLACE\r\nHOLDERxxxxx b"},
		// Spaces alone do not part a form in a body (prose is full of
		// them); a line break does.
		{"a T O P S E C R E T - 1 2 3 4 5 6 b", "a T O P S E C R E T - 1 2 3 4 5 6 b"},
		{"a TOP\nSEC\r\n RET\n-12\n3456 b", "a PLA\nCEH\r\n OLD\nERx\nxxxx b"},
		{"a TOPSE\r\n\r\n CRET-123456 b", "a TOPSE\r\n\r\n CRET-123456 b"},
		{"a TOPSECRET-12345 b", "a TOPSECRET-12345 b"},
	} {
		var found reflections
		got, hold := m.scan(nil, []byte(tc.in), true, true, "body", &found)
		if string(got) != tc.want || hold != 0 || len(got) != len(tc.in) {
			t.Errorf("%q: %q (hold %d), want %q", tc.in, got, hold, tc.want)
		}
	}
	var found reflections
	got, hold := m.scan(nil, []byte("data TOPSE\r\n"), false, true, "body", &found)
	if string(got) != "data " || hold != len("TOPSE\r\n") {
		t.Errorf("held back: %q %d", got, hold)
	}
	in := []byte("x" + strings.Repeat("T\r\n\t ", 15))
	if _, hold := m.scan(nil, in, false, true, "body", &found); hold > m.maxHold {
		t.Errorf("held %d, more than %d", hold, m.maxHold)
	}
	for _, h := range []string{"Bearer TOPSECRET-\r\n 123456", "Bearer TOPSECRET- 123456", "Bearer T O P S E C R E T - 1 2 3 4 5 6"} {
		if got := replaceForms(forms, h, "header X", &found); got != "Bearer PLACEHOLDER" {
			t.Errorf("a folded header: %q", got)
		}
	}
}

// FuzzResponsePath: whatever the origin a secret is injected for answers
// (interim responses, headers, content and transfer codings, trailers,
// the secret anywhere in any of them, "SECRET" standing for it), the
// agent reads no form of the secret the scrub matches, in any response's
// header, body or trailer; and the gateway neither crashes nor hangs.
func FuzzResponsePath(f *testing.F) {
	gz := string(gzipped([]byte("echo SECRET end")))
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
		"HTTP/1.1 103 Early Hints\r\nLink: </x?k=SECRET>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\nContent-Encoding: gzip\r\nContent-Length: " + fmt.Sprint(len(gz)) + "\r\n\r\n" + gz,
		"HTTP/1.1 200 OK\r\nContent-Encoding: gzip, gzip\r\n\r\n" + string(gzipped([]byte(gz))),
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5\r\nSECRE\r\n1\r\nT\r\n0\r\nX-T: SECRET\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Folded: Bear\r\n er SECRET\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n" + mimeBase64("xx Authorization: SECRET and more text to wrap the line at seventy-six"),
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\nSECRET",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX: SECRET\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	fx, roots := reflectFixture(f)
	var answer sync.Map // the answer each request's id gets
	fx.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		raw, ok := answer.Load(r.URL.Path)
		if !ok {
			return false
		}
		c, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return true
		}
		defer c.Close()
		buf.Write(raw.([]byte))
		buf.Flush()
		return true
	}
	forms := secretForms(reflectSecret, "")
	m := newMatcher(forms)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, resp []byte) {
		path := fmt.Sprintf("/fuzz/%d", n.Add(1))
		answer.Store(path, bytes.ReplaceAll(resp, []byte("SECRET"), []byte(reflectSecret)))
		defer answer.Delete(path)
		got := fx.tlsBytes(t, roots, "b.test", "GET "+path+" HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
		br := bufio.NewReader(strings.NewReader(got))
		for {
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				break
			}
			body, _ := io.ReadAll(res.Body)
			var text bytes.Buffer
			res.Header.Write(&text)
			res.Trailer.Write(&text)
			m.squeeze(body, false)
			text.Write(m.sq)
			for _, form := range m.finds {
				if bytes.Contains(text.Bytes(), form) {
					t.Fatalf("the secret reached the agent (%q): %q", form, got)
				}
			}
			if res.StatusCode >= 200 {
				break
			}
		}
		select {
		case <-fx.events:
		case <-time.After(10 * time.Second):
			t.Fatalf("no event: the gateway hung on %q", resp)
		}
	})
}
