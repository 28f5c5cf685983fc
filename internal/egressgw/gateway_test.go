package egressgw

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func TestHTTPByHost(t *testing.T) {
	f := newFixture(t, false, Config{})
	got := f.rawHTTP(t,
		"GET /x?token=abc HTTP/1.1\r\nHost: a.test\r\n\r\n",
		fmt.Sprintf("GET /y HTTP/1.1\r\nHost: B.TEST:%d\r\n\r\n", f.port),
		// The same connection, another site on the same address.
		"GET /z HTTP/1.1\r\nHost: other.test\r\n\r\n",
	)
	if len(got) != 3 || !strings.HasPrefix(got[0], "200 site=a.test method=GET path=/x") || !strings.HasPrefix(got[1], "200 site=b.test") ||
		!strings.HasPrefix(got[2], "403 agentbox egress gateway: refused: no host rule matches other.test") {
		t.Fatalf("responses: %q", got)
	}
	if f.site.count("other.test") != 0 {
		t.Fatal("the other site was reached")
	}
	e := f.event(t)
	if e.Kind != Request || e.Host != "a.test" || e.Method != "GET" || e.Path != "/x?token=..." || e.Status != 200 ||
		e.Rule == "" || e.Dialled != fmt.Sprintf("127.0.0.2:%d", f.port) || e.Received == 0 {
		t.Fatalf("first event: %+v", e)
	}
	if e := f.event(t); e.Kind != Request || e.Host != "b.test" {
		t.Fatalf("second event: %+v", e)
	}
	if e := f.event(t); e.Kind != Refused || e.Host != "other.test" || e.Status != 403 || !strings.Contains(e.Reason, "no host rule matches") {
		t.Fatalf("third event: %+v", e)
	}
}

func TestHTTPRefusals(t *testing.T) {
	f := newFixture(t, false, Config{})
	for _, tc := range []struct{ req, want string }{
		{"GET / HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n", "is an address, not a name"},
		{"GET / HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n", "port"},
		{"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", "CONNECT is not served"},
	} {
		got := f.rawHTTP(t, tc.req)
		if len(got) != 1 || !strings.HasPrefix(got[0], "403 ") || !strings.Contains(got[0], tc.want) {
			t.Errorf("%q: %q", tc.req, got)
		}
		if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, tc.want) {
			t.Errorf("%q: event %+v", tc.req, e)
		}
	}
	if n := f.site.count("127.0.0.2") + f.site.count("elsewhere.test") + f.site.count("a.test"); n != 0 {
		t.Fatalf("the site saw %d refused requests", n)
	}
}

func TestHTTPLookupFailureIsRefused(t *testing.T) {
	f := newFixture(t, false, Config{Lookup: func(context.Context, netpolicy.Rule, string) ([]netip.Addr, error) {
		return nil, errors.New("upstream down")
	}})
	got := f.rawHTTP(t, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "502 ") {
		t.Fatalf("got %q", got)
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "upstream down") || e.Rule == "" {
		t.Fatalf("event %+v", e)
	}
}

func TestTLSBySNI(t *testing.T) {
	f := newFixture(t, true, Config{})
	get := func(sni, host string) (string, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
			},
			TLSClientConfig:   &tls.Config{RootCAs: f.pool, ServerName: sni},
			DisableKeepAlives: true,
		}}
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://%s:%d/p", host, f.port), nil)
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b)), nil
	}
	// The allowed name: the client verifies the real server itself.
	if body, err := get("a.test", "a.test"); err != nil || !strings.HasPrefix(body, "site=a.test") {
		t.Fatalf("allowed: %q, %v", body, err)
	}
	e := f.event(t)
	if e.Kind != Passthrough || e.SNI != "a.test" || e.Sent == 0 || e.Received == 0 || e.Dialled != fmt.Sprintf("127.0.0.2:%d", f.port) {
		t.Fatalf("passthrough event: %+v", e)
	}
	// Another site on the same address, by its own SNI: refused.
	if body, err := get("other.test", "other.test"); err == nil {
		t.Fatalf("other SNI reached %q", body)
	}
	if e := f.event(t); e.Kind != Refused || e.SNI != "other.test" || !strings.Contains(e.Reason, "no host rule matches") {
		t.Fatalf("refused event: %+v", e)
	}
	if f.site.count("other.test") != 0 {
		t.Fatal("the other site was reached")
	}
	// No SNI (a client dialling an address): refused.
	c, err := tls.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port), &tls.Config{InsecureSkipVerify: true})
	if err == nil {
		c.Close()
		t.Fatal("a hello without SNI was spliced")
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "no SNI") {
		t.Fatalf("no-SNI event: %+v", e)
	}
}

func TestNeitherTLSNorHTTPAndSilence(t *testing.T) {
	f := newFixture(t, false, Config{HelloTimeout: 300 * time.Millisecond})
	c, _ := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	c.Write([]byte("SSH-2.0-OpenSSH\r\n"[:0]))
	c.Write([]byte{0, 1, 2})
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := c.Read(make([]byte, 10)); err == nil {
		t.Fatalf("binary protocol got %d bytes", n)
	}
	c.Close()
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "neither TLS nor HTTP") {
		t.Fatalf("event %+v", e)
	}
	silent, _ := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	defer silent.Close()
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "nothing sent within 300ms") {
		t.Fatalf("event %+v", e)
	}
}

// TestFloodIsBounded: a pod holding more connections than allowed gets the
// extra ones closed at accept; once they go, requests work again.
func TestFloodIsBounded(t *testing.T) {
	f := newFixture(t, false, Config{MaxConns: 8, HelloTimeout: 500 * time.Millisecond})
	var held []net.Conn
	for i := 0; i < 40; i++ {
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	deadline := time.Now().Add(3 * time.Second)
	for f.gw.Rejected() < 32 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.gw.Rejected(); n < 32 {
		t.Fatalf("rejected %d of 40 with 8 slots", n)
	}
	for _, c := range held {
		c.Close()
	}
	// Drain the silent connections' refusals; then a request works.
	for i := 0; i < 8; i++ {
		f.event(t)
	}
	if got := f.rawHTTP(t, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 site=a.test") {
		t.Fatalf("after the flood: %q", got)
	}
}

func TestPorts(t *testing.T) {
	pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
		{Host: "a.test", Ports: []int{443, 80}}, {CIDR: "10.0.0.0/8", Ports: []int{22}}, {Host: "*.b.test", Ports: []int{443, 8443}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(pl.HostPorts()); got != "[80 443 8443]" {
		t.Fatalf("ports %s", got)
	}
	if _, why := Decide(pl, "x.b.test", 80); !strings.Contains(why, "port 80 is not allowed") {
		t.Fatalf("decide: %q", why)
	}
	if r, why := Decide(pl, "a.test", 80); why != "" || r.Host != "a.test" {
		t.Fatalf("decide: %+v %q", r, why)
	}
}

// TestHTTPHalfClose: a client that shuts its side after the request (nc,
// HTTP/1.0 tools) still gets the response.
func TestHTTPHalfClose(t *testing.T) {
	f := newFixture(t, false, Config{})
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /hc HTTP/1.0\r\nHost: a.test\r\n\r\n")
	c.(*net.TCPConn).CloseWrite()
	b, _ := io.ReadAll(c)
	if !strings.Contains(string(b), "200 OK") || !strings.Contains(string(b), "site=a.test") {
		t.Fatalf("response: %q", b)
	}
}

// Suspended, the gateway closes a download in progress and refuses new
// connections, with the reason; resumed, the rules decide again.
func TestSuspendAndResume(t *testing.T) {
	f := newFixture(t, false, Config{})
	// A kept-alive connection that has made one request.
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: a.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	f.event(t)
	if n := f.gw.Suspend("quarantined: exfiltration"); n != 1 {
		t.Fatalf("suspend closed %d connections, want 1", n)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Fatal("the open connection still carries requests")
	}
	got := f.rawHTTP(t, "GET /3 HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "read:") && !strings.HasPrefix(got[0], "write:") {
		t.Fatalf("a new connection while suspended: %q", got)
	}
	for e := f.event(t); ; e = f.event(t) {
		if e.Kind == Refused {
			if !strings.Contains(e.Reason, "suspended: quarantined: exfiltration") {
				t.Fatalf("refusal %+v", e)
			}
			break
		}
	}
	if f.site.count("a.test") != 1 {
		t.Fatalf("the site saw %d requests, want 1", f.site.count("a.test"))
	}
	f.gw.Resume()
	if got := f.rawHTTP(t, "GET /4 HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 site=a.test") {
		t.Fatalf("after resume: %q", got)
	}
}

// A role that drops a host while the sandbox runs: the gateway closes the
// TLS connections it allowed by that name, and keeps the others.
func TestRevalidateClosesDroppedNames(t *testing.T) {
	var live atomic.Pointer[netpolicy.Plan]
	f := newFixture(t, true, Config{Live: &live})
	dial := func(name string) (*tls.Conn, *bufio.Reader) {
		c, err := tls.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port), &tls.Config{ServerName: name, RootCAs: f.pool})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", name)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return c, br
	}
	a, abr := dial("a.test")
	b, bbr := dial("b.test")
	if n := f.gw.Revalidate(); n != 0 {
		t.Fatalf("nothing changed, and %d connections were closed", n)
	}
	pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
		{Host: "b.test", Ports: []int{f.port}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	live.Store(pl)
	if n := f.gw.Revalidate(); n != 1 {
		t.Fatalf("revalidate closed %d connections, want 1 (a.test's)", n)
	}
	a.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(a, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if _, err := http.ReadResponse(abr, nil); err == nil {
		t.Fatal("a.test's connection still carries requests")
	}
	b.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(b, "GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
	if resp, err := http.ReadResponse(bbr, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("b.test's connection: %v %v", resp, err)
	}
}

// A response the site cuts short: the agent's connection is aborted (it
// cannot be told otherwise mid-body), and the request's record says why,
// with the bytes the agent sent.
func TestCutResponseIsRecorded(t *testing.T) {
	f := newFixture(t, false, Config{})
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/cut" {
			return false
		}
		io.Copy(io.Discard, r.Body)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return true
		}
		brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")
		brw.Flush()
		c.Close()
		return true
	}
	got := f.rawHTTP(t, "POST /cut HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello")
	if len(got) != 1 || !strings.HasPrefix(got[0], "200 half") {
		t.Errorf("the agent got %q, want the 200 and its first bytes, then the cut", got)
	}
	e := f.event(t)
	if e.Kind != Request || e.Status != 200 || e.Sent != 5 || !strings.Contains(e.Reason, "the response was cut short: reading it from the site: unexpected EOF") {
		t.Errorf("event: kind %v status %d sent %d reason %q", e.Kind, e.Status, e.Sent, e.Reason)
	}
	// A whole response has no reason.
	if got := f.rawHTTP(t, "GET /whole HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 site=a.test") {
		t.Errorf("whole: %q", got)
	}
	if e := f.event(t); e.Reason != "" {
		t.Errorf("a whole response's reason: %q", e.Reason)
	}
}

// serverBody reads like net/http's request body: its last bytes come with
// io.EOF, and a read after Close fails.
type serverBody struct {
	r      io.Reader
	closed bool
}

func (b *serverBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.r.Read(p)
	if err == nil && b.r.(*io.LimitedReader).N == 0 {
		err = io.EOF
	}
	return n, err
}

func (b *serverBody) Close() error { b.closed = true; return nil }

// Read to its end, a request body answers io.EOF again even after net/http
// closed it: the transport's check for more after Content-Length bytes
// must not fail, which would close the site's connection mid-response.
func TestCountingBodyEndsOnce(t *testing.T) {
	sb := &serverBody{r: io.LimitReader(strings.NewReader("hello, and more"), 5)}
	b := &countingBody{ReadCloser: sb, start: time.Now(), grace: time.Second, rate: 1}
	got, err := io.ReadAll(io.LimitReader(b, 5))
	if string(got) != "hello" || err != nil || b.n != 5 {
		t.Fatalf("read %q, %v, counted %d", got, err, b.n)
	}
	sb.Close() // as net/http does once the response's header is written
	if n, err := b.Read(make([]byte, 8)); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("a read after the end and the close: %d, %v; want 0, io.EOF", n, err)
	}
	// One that was not read to its end still reports the close.
	sb2 := &serverBody{r: io.LimitReader(strings.NewReader("hello"), 5)}
	b2 := &countingBody{ReadCloser: sb2, start: time.Now(), grace: time.Second, rate: 1}
	sb2.Close()
	if _, err := b2.Read(make([]byte, 8)); !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Errorf("a read of an unfinished body after close: %v", err)
	}
}
