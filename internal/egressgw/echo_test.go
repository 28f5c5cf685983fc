package egressgw

// The injected secret echoed back by its host: every echo replaced and
// recorded, a rotated secret, a body the scan cannot decode.

import (
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func reflectFixture(t testing.TB) (*fixture, *x509.CertPool) {
	t.Helper()
	ca, err := NewCA("sandbox-1", []string{"a.test", "b.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{CA: ca, Secrets: []Secret{{Host: "b.test", Header: "Authorization", Value: "Bearer " + reflectSecret, Secret: reflectSecret, Placeholder: placeholder}}}
	f := newFixtureWith(t, true, cfg, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{
			Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
				{Host: "a.test", Ports: []int{port}}, {Host: "b.test", Ports: []int{port}, WebSocket: true},
			}},
			Credentials: policy.CredentialsProfile{Secrets: []policy.Secret{{Env: "TOKEN", File: "/f", Inject: &policy.Inject{Host: "b.test", Header: "authorization", Format: "Bearer {secret}"}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	roots := f.pool.Clone()
	roots.AddCert(ca.Certificate())
	return f, roots
}

// The secret comes back from an echoing host in every form tried, and the
// agent never reads it: each is replaced and recorded; the host's ordinary
// responses are untouched.
func TestSecretNeverComesBack(t *testing.T) {
	f, roots := reflectFixture(t)
	forms := secretForms(reflectSecret, "")
	for _, tc := range []struct {
		req      string
		status   string
		encoding string
	}{
		{"GET /api/echo HTTP/1.1\r\nHost: b.test\r\n\r\n", "200", "raw"},
		{"GET /api/echo HTTP/1.1\r\nHost: b.test\r\nAccept-Encoding: gzip\r\n\r\n", "200", "raw"},
		{"GET /api/echo-gzip HTTP/1.1\r\nHost: b.test\r\n\r\n", "200", "raw"},
		{"GET /api/echo-base64 HTTP/1.1\r\nHost: b.test\r\n\r\n", "200", "base64"},
		{"GET /api/echo-json HTTP/1.1\r\nHost: b.test\r\n\r\n", "200", "json"},
		{"GET /api/echo-header HTTP/1.1\r\nHost: b.test\r\n\r\n", "200", "url"},
		{"TRACE / HTTP/1.1\r\nHost: b.test\r\n\r\n", "403", ""},
		{"GET /api/echo-br HTTP/1.1\r\nHost: b.test\r\n\r\n", "502", ""},
	} {
		raw := f.tlsRaw(t, roots, "b.test", tc.req)
		if !strings.HasPrefix(raw, "HTTP/1.1 "+tc.status) {
			t.Errorf("%q: %q", tc.req, raw)
			continue
		}
		for _, form := range forms {
			if strings.Contains(raw, string(form.find)) {
				t.Errorf("%q: the response holds the secret (%s): %q", tc.req, form.Encoding, raw)
			}
		}
		e := f.event(t)
		if tc.encoding == "" {
			if e.Kind != Refused {
				t.Errorf("%q: event %+v", tc.req, e)
			}
			continue
		}
		if e.Kind != Request || len(e.Reflected) == 0 {
			t.Errorf("%q: nothing recorded as reflected: %+v", tc.req, e)
			continue
		}
		encodings := map[string]bool{}
		for _, r := range e.Reflected {
			encodings[r.Encoding] = true
			if r.Count < 1 || r.Where == "" {
				t.Errorf("%q: reflection %+v", tc.req, r)
			}
		}
		if !encodings[tc.encoding] {
			t.Errorf("%q: reflected %+v, want %s", tc.req, e.Reflected, tc.encoding)
		}
		if tc.encoding != "base64" && !strings.Contains(raw, placeholder[:len(reflectSecret)]) {
			t.Errorf("%q: the placeholder did not take the secret's place: %q", tc.req, raw)
		}
	}
	// A WebSocket's messages are not scanned: none toward the secret's
	// host, even under a rule with websocket: true.
	if got := f.tlsDo(t, roots, "b.test", "GET /api/ws HTTP/1.1\r\nHost: b.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"); !strings.HasPrefix(got, "403 ") || !strings.Contains(got, "not scanned") {
		t.Errorf("websocket to the secret's host: %q", got)
	}
	f.event(t)
	// The origin received the secret itself, every time it was forwarded.
	// The header echo's trailer and X-Echo are scrubbed too.
	raw := f.tlsRaw(t, roots, "b.test", "GET /api/echo-header HTTP/1.1\r\nHost: b.test\r\n\r\n")
	if !strings.Contains(raw, "X-Echo: Bearer "+placeholder) || !strings.Contains(raw, "X-Trailer-Echo: Bearer "+placeholder) {
		t.Errorf("headers and trailers: %q", raw)
	}
	f.event(t)
	// The twin: an ordinary response of the host comes as the origin sent
	// it, but for the secret the site's line echoes.
	// (In a body, the placeholder is cut to the secret's length.)
	if got := f.tlsDo(t, roots, "b.test", "GET /plain HTTP/1.1\r\nHost: b.test\r\n\r\n"); got != `200 site=b.test method=GET path=/plain auth="Bearer `+placeholder[:len(strconv.Quote(reflectSecret))-2]+`"` {
		t.Errorf("plain: %q", got)
	}
	// (%q escapes the secret's quotes as JSON does.)
	if e := f.event(t); e.Status != 200 || len(e.Reflected) != 1 || e.Reflected[0].Encoding != "json" {
		t.Errorf("plain: %+v", e)
	}
	if got := f.site.authOf("b.test /plain"); got != "Bearer "+reflectSecret {
		t.Errorf("the origin received %q", got)
	}
}

// tlsRaw makes one request over TLS and returns the response's status,
// headers, trailers and body.
func (f *fixture) tlsRaw(t *testing.T, roots *x509.CertPool, sni, raw string) string {
	t.Helper()
	resp, b, why := f.tlsRoundTrip(t, roots, sni, raw)
	if resp == nil {
		return why
	}
	var h strings.Builder
	resp.Header.Write(&h)
	resp.Trailer.Write(&h)
	return fmt.Sprintf("HTTP/1.1 %d\n%s\n%s", resp.StatusCode, h.String(), b)
}

// A rotated secret: the next request carries the new value, and a
// response echoing either the new or the old one is scrubbed.
func TestSecretRotation(t *testing.T) {
	f, roots := reflectFixture(t)
	const rotated = `n3w-s3cr/t+k="v2"`
	f.gw.SetSecrets([]Secret{{Host: "b.test", Header: "Authorization", Value: "Bearer " + rotated, Secret: rotated, Placeholder: placeholder}})
	raw := f.tlsRaw(t, roots, "b.test", "GET /api/echo HTTP/1.1\r\nHost: b.test\r\n\r\n")
	if !strings.HasPrefix(raw, "HTTP/1.1 200") {
		t.Fatalf("after rotation: %q", raw)
	}
	for _, s := range []string{rotated, reflectSecret} {
		for _, form := range secretForms(s, "") {
			if strings.Contains(raw, string(form.find)) {
				t.Errorf("the response holds a secret (%s): %q", form.Encoding, raw)
			}
		}
	}
	if e := f.event(t); e.Kind != Request || len(e.Reflected) == 0 {
		t.Errorf("the echoed new secret was not recorded: %+v", e)
	}
	if got := f.site.authOf("b.test /api/echo"); got != "Bearer "+rotated {
		t.Errorf("the origin got %q, want the rotated secret", got)
	}
}

// A body that says gzip but is not, from the secret's host: it cannot be
// scanned, so the agent gets its header and no more, and the record says
// why.
func TestUndecodableBodyIsCutAndRecorded(t *testing.T) {
	f, roots := reflectFixture(t)
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/bad-gzip" {
			return false
		}
		w.Header().Set("Content-Encoding", "gzip")
		// The header first: the agent has it before the body fails
		// (else whether it was flushed before the abort is a race).
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		time.Sleep(100 * time.Millisecond)
		io.WriteString(w, "not gzip at all")
		return true
	}
	raw := f.tlsRaw(t, roots, "b.test", "GET /bad-gzip HTTP/1.1\r\nHost: b.test\r\n\r\n")
	if !strings.HasPrefix(raw, "HTTP/1.1 200") || strings.Contains(raw, "not gzip") {
		t.Errorf("the agent got %q", raw)
	}
	if e := f.event(t); e.Kind != Request || !strings.Contains(e.Reason, "the response was cut short: reading it from the site: gzip: invalid header") {
		t.Errorf("event: kind %v reason %q", e.Kind, e.Reason)
	}
}
