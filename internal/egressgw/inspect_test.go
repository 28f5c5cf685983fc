package egressgw

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

const placeholder = "agentbox-placeholder-0123456789abcdef"

// inspectFixture: a.test restricted to GET under /api/, b.test with a
// secret injected as Authorization, other.test passthrough; the site
// behind them on TLS.
func inspectFixture(t testing.TB) (*fixture, *CA) {
	t.Helper()
	ca, err := NewCA("sandbox-1", []string{"a.test", "b.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{CA: ca, Secrets: []Secret{{Host: "b.test", Header: "Authorization", Value: "Bearer s3cret-value", Secret: "s3cret-value", Placeholder: placeholder}}}
	f := newFixtureWith(t, true, cfg, func(port int) netpolicy.Plan {
		p := &policy.Profile{
			Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
				{Host: "a.test", Ports: []int{port}, HTTP: &policy.HTTPRule{Methods: []string{"GET"}, Paths: []string{"/api/*", "/exact"}}},
				{Host: "b.test", Ports: []int{port}},
				{Host: "other.test", Ports: []int{port}},
			}},
			Credentials: policy.CredentialsProfile{Secrets: []policy.Secret{{Env: "TOKEN", File: "/f", Inject: &policy.Inject{Host: "b.test", Header: "authorization", Format: "Bearer {secret}"}}}},
		}
		pl, err := netpolicy.Compile(p)
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	return f, ca
}

// tlsRoundTrip makes one request over TLS to the gateway with sni,
// trusting roots: the response with its body read, or why there is none.
func (f *fixture) tlsRoundTrip(t *testing.T, roots *x509.CertPool, sni, raw string) (*http.Response, []byte, string) {
	t.Helper()
	tc := f.tlsConn(t, roots, sni).(*tls.Conn)
	defer tc.Close()
	if err := tc.Handshake(); err != nil {
		return nil, nil, "handshake: " + err.Error()
	}
	if _, err := io.WriteString(tc, raw); err != nil {
		return nil, nil, "write: " + err.Error()
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return nil, nil, "read: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b, ""
}

// tlsDo makes one request over TLS and returns "status body" or the error.
func (f *fixture) tlsDo(t *testing.T, roots *x509.CertPool, sni, raw string) string {
	t.Helper()
	resp, b, why := f.tlsRoundTrip(t, roots, sni, raw)
	if resp == nil {
		return why
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

func TestInspectedRules(t *testing.T) {
	f, ca := inspectFixture(t)
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AddCert(ca.Certificate())
	cases := []struct {
		name, sni, req, want, reason string
	}{
		{"allowed method and path", "a.test", "GET /api/v1?q=secret HTTP/1.1\r\nHost: a.test\r\n\r\n", "200 site=a.test method=GET path=/api/v1", ""},
		{"exact path", "a.test", "GET /exact HTTP/1.1\r\nHost: a.test\r\n\r\n", "200 site=a.test method=GET path=/exact", ""},
		{"method refused", "a.test", "POST /api/v1 HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\n\r\n", "403 ", "method POST is not allowed"},
		{"path refused", "a.test", "GET /admin HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "path /admin is not allowed"},
		{"exact is not a prefix", "a.test", "GET /exact/more HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "is not allowed"},
		{"dot-dot out of the prefix", "a.test", "GET /api/../admin HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "not a clean absolute path"},
		{"encoded dot-dot", "a.test", "GET /api/%2e%2e/admin HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "not a clean absolute path"},
		{"encoded slash", "a.test", "GET /api%2f..%2fadmin HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "encoded '/'"},
		{"double slash", "a.test", "GET /api//x HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "not a clean absolute path"},
		{"fronted: SNI allowed, Host another", "a.test", "GET /api/x HTTP/1.1\r\nHost: b.test\r\n\r\n", "403 ", "differs from the TLS server name a.test (fronting)"},
		{"secret injected, agent's value replaced", "b.test", "GET /x HTTP/1.1\r\nHost: b.test\r\nAuthorization: Bearer " + placeholder + "\r\n\r\n", `200 site=b.test method=GET path=/x auth="Bearer agentbox-pla"`, ""},
		{"secret injected without a header sent", "b.test", "GET /y HTTP/1.1\r\nHost: b.test\r\n\r\n", `200 site=b.test method=GET path=/y auth="Bearer agentbox-pla"`, ""},
		{"placeholder in another header of its host", "b.test", "GET /x HTTP/1.1\r\nHost: b.test\r\nX-Token: " + placeholder + "\r\n\r\n", "403 ", "in header X-Token"},
		{"placeholder replayed to another host", "a.test", "GET /api/x HTTP/1.1\r\nHost: a.test\r\nAuthorization: Bearer " + placeholder + "\r\n\r\n", "403 ", "secret for b.test was sent to a.test in header Authorization"},
		{"placeholder in the URL", "a.test", "GET /api/x?k=" + placeholder + " HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "in the URL"},
		{"placeholder percent-encoded in the URL", "a.test", "GET /api/x?k=" + strings.ReplaceAll(placeholder, "-", "%2D") + " HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "in the URL"},
		{"placeholder partly encoded in the path", "a.test", "GET /api/" + strings.Replace(placeholder, "p", "%70", 1) + " HTTP/1.1\r\nHost: a.test\r\n\r\n", "403 ", "in the URL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := f.tlsDo(t, sandboxRoots, c.sni, c.req)
			if !strings.HasPrefix(got, c.want) {
				t.Fatalf("got %q, want %q...", got, c.want)
			}
			e := f.event(t)
			if c.reason == "" {
				if e.Kind != Request || e.Proto != "https" || e.SNI != c.sni || e.Status != 200 {
					t.Fatalf("event %+v", e)
				}
				if c.sni == "b.test" && (len(e.Injected) != 1 || e.Injected[0] != "Authorization") {
					t.Fatalf("event does not say what was injected: %+v", e)
				}
			} else if e.Kind != Refused || !strings.Contains(e.Reason, c.reason) {
				t.Fatalf("event %+v, want a refusal with %q", e, c.reason)
			}
			if strings.Contains(fmt.Sprintf("%+v", e), "s3cret") {
				t.Fatalf("the secret is in the event: %+v", e)
			}
		})
	}
	if n := f.site.count("b.test"); n != 2 {
		t.Fatalf("b.test saw %d requests, want the 2 allowed", n)
	}
	// The origin got the secret itself; the agent read the placeholder
	// where the origin echoed it.
	for _, path := range []string{"b.test /x", "b.test /y"} {
		if got := f.site.authOf(path); got != "Bearer s3cret-value" {
			t.Errorf("%s received %q", path, got)
		}
	}
}

func TestInspectedPassthroughAndTrust(t *testing.T) {
	f, ca := inspectFixture(t)
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AddCert(ca.Certificate())
	// A passthrough rule: the agent verifies the real server, so the
	// sandbox's CA alone does not do, the site's own does.
	if got := f.tlsDo(t, sandboxRoots, "other.test", "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"); !strings.Contains(got, "certificate signed by unknown authority") {
		t.Fatalf("passthrough with only the sandbox CA: %q", got)
	}
	f.event(t)
	if got := f.tlsDo(t, f.pool, "other.test", "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"); !strings.HasPrefix(got, "200 site=other.test") {
		t.Fatalf("passthrough: %q", got)
	}
	if e := f.event(t); e.Kind != Passthrough {
		t.Fatalf("event %+v", e)
	}
	// An inspected rule with a client that does not trust the sandbox CA:
	// refused at the handshake, recorded.
	if got := f.tlsDo(t, f.pool, "a.test", "GET /api/x HTTP/1.1\r\nHost: a.test\r\n\r\n"); !strings.HasPrefix(got, "handshake:") {
		t.Fatalf("untrusting client: %q", got)
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "TLS handshake with the gateway") {
		t.Fatalf("event %+v", e)
	}
	// The CA's name constraints: it cannot vouch for a name outside its
	// rules even if its key were used.
	leaf, err := ca.Leaf("evil.test")
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: sandboxRoots, DNSName: "evil.test"}); err == nil {
		t.Fatal("the CA vouched for a name outside its constraints")
	}
	leaf, _ = ca.Leaf("a.test")
	cert, _ = x509.ParseCertificate(leaf.Certificate[0])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: sandboxRoots, DNSName: "a.test"}); err != nil {
		t.Fatalf("a.test: %v", err)
	}
}

func TestInspectedUpstreamVerified(t *testing.T) {
	// The gateway verifies the upstream against its roots: a server whose
	// CA it does not know is a 502, not a silent pass.
	ca, _ := NewCA("s", []string{"b.test"}, time.Hour)
	f := newFixtureWith(t, true, Config{CA: ca, UpstreamRoots: x509.NewCertPool()}, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
			{Host: "b.test", Ports: []int{port}, HTTP: &policy.HTTPRule{Methods: []string{"GET"}}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	if got := f.tlsDo(t, roots, "b.test", "GET / HTTP/1.1\r\nHost: b.test\r\n\r\n"); !strings.HasPrefix(got, "502 ") || !strings.Contains(got, "certificate") {
		t.Fatalf("got %q", got)
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "certificate") {
		t.Fatalf("event %+v", e)
	}
}

func TestInjectOverPlainHTTPRefused(t *testing.T) {
	f, _ := inspectFixture(t)
	// The site listens on TLS; the refusal comes before any dial.
	got := f.rawHTTP(t, "GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
	if len(got) != 1 || !strings.Contains(got[0], "injected over TLS only") {
		t.Fatalf("got %q", got)
	}
}
