package egressgw

import (
	"bufio"
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

// wsFixture: a.test with websocket: true, b.test without, on plain HTTP.
func wsFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	return newFixtureWith(t, false, cfg, func(port int) netpolicy.Plan {
		return wsPlan(t, port, true)
	})
}

func wsPlan(t testing.TB, port int, websocket bool) netpolicy.Plan {
	pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
		{Host: "a.test", Ports: []int{port}, WebSocket: websocket}, {Host: "b.test", Ports: []int{port}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return *pl
}

// An h2c upgrade would make an allowed connection a tunnel to whatever
// :authority the origin serves: refused before it is forwarded, whatever
// the rule, while the origin (which honours h2c) never sees it.
func TestUpgradeOtherThanWebSocketRefused(t *testing.T) {
	f := wsFixture(t, Config{})
	for _, tc := range []struct{ req, want string }{
		{"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n", "Upgrade h2c is not served"},
		{"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\r\n", "is not served"},
		{"GET /x HTTP/1.1\r\nHost: a.test\r\nUpgrade: h2c\r\n\r\n", "Upgrade h2c is not served"},
		{"GET /api/ws HTTP/1.1\r\nHost: b.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", "websocket is not allowed by allow[1] host b.test"},
		{"POST /admin HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n", "Upgrade h2c"},
	} {
		got := f.rawHTTP(t, tc.req)
		if len(got) != 1 || !strings.HasPrefix(got[0], "403 ") || !strings.Contains(got[0], tc.want) {
			t.Errorf("%q: %q", tc.req, got)
		}
		if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, tc.want) {
			t.Errorf("%q: event %+v", tc.req, e)
		}
	}
	if n := f.site.count("a.test") + f.site.count("b.test"); n != 0 {
		t.Fatalf("the origin saw %d refused upgrades", n)
	}
}

// The origin's h2c, reached by the agent's twin request without an
// Upgrade, answers as HTTP/1.1: the legitimate request works.
func TestPlainRequestBesideRefusedUpgrade(t *testing.T) {
	f := wsFixture(t, Config{})
	if got := f.rawHTTP(t, "GET /ok HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 site=a.test") {
		t.Fatalf("%q", got)
	}
}

// An origin that switches protocols unasked gets no tunnel: the agent gets
// 502 and the record says why.
func TestUnaskedSwitchRefused(t *testing.T) {
	f := wsFixture(t, Config{})
	got := f.rawHTTP(t, "GET /api/switch HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "502 ") || !strings.Contains(got[0], "switched protocols") {
		t.Fatalf("%q", got)
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, `switched protocols to "h2c"`) {
		t.Fatalf("event %+v", e)
	}
}

// wsOpen upgrades a connection to a.test's WebSocket and returns it.
func (f *fixture) wsOpen(t *testing.T, host string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /api/ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return c, br
}

// echo writes msg on a tunnel and reads it back.
func echo(c net.Conn, br *bufio.Reader, msg string) (string, error) {
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	b := make([]byte, len(msg))
	_, err := io.ReadFull(br, b)
	return string(b), err
}

// An allowed WebSocket works, and is recorded when it opens and when it
// closes, with its bytes and address.
func TestWebSocketAllowedAndRecorded(t *testing.T) {
	f := wsFixture(t, Config{})
	c, br := f.wsOpen(t, "a.test")
	open := f.event(t)
	if open.Kind != Request || open.Status != 101 || open.Host != "a.test" || open.Path != "/api/ws" || open.Dialled == "" {
		t.Fatalf("open event %+v", open)
	}
	if got, err := echo(c, br, "hello tunnel"); err != nil || got != "hello tunnel" {
		t.Fatalf("echo %q %v", got, err)
	}
	c.Close()
	e := f.event(t)
	if e.Kind != WebSocketClosed || e.Sent != int64(len("hello tunnel")) || e.Received < int64(len("hello tunnel")) ||
		e.Dialled != open.Dialled || !strings.Contains(e.Reason, "closed by the agent") {
		t.Fatalf("close event %+v", e)
	}
}

// A WebSocket that carries nothing for the idle timeout is closed; one the
// role stops allowing is closed by live tightening; a quarantine closes
// them all. Each close says why.
func TestWebSocketCut(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		f := wsFixture(t, Config{IdleTimeout: 300 * time.Millisecond})
		c, br := f.wsOpen(t, "a.test")
		f.event(t)
		if _, err := echo(c, br, "x"); err != nil {
			t.Fatal(err)
		}
		if e := f.event(t); e.Kind != WebSocketClosed || !strings.Contains(e.Reason, "idle for 300ms") {
			t.Fatalf("close event %+v", e)
		}
		if _, err := echo(c, br, "y"); err == nil {
			t.Fatal("the idle tunnel still carries bytes")
		}
	})
	t.Run("tightened", func(t *testing.T) {
		var live atomic.Pointer[netpolicy.Plan]
		f := wsFixture(t, Config{Live: &live})
		c, br := f.wsOpen(t, "a.test")
		f.event(t)
		if n := f.gw.Revalidate(); n != 0 {
			t.Fatalf("nothing changed and %d were closed", n)
		}
		pl := wsPlan(t, f.port, false)
		live.Store(&pl)
		if n := f.gw.Revalidate(); n != 1 {
			t.Fatalf("revalidate closed %d, want the tunnel", n)
		}
		if e := f.event(t); e.Kind != WebSocketClosed || !strings.Contains(e.Reason, "no longer allows websocket") {
			t.Fatalf("close event %+v", e)
		}
		if _, err := echo(c, br, "y"); err == nil {
			t.Fatal("the tunnel outlived its rule")
		}
		// Plain requests to the name still work.
		if got := f.rawHTTP(t, "GET /ok HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 ") {
			t.Fatalf("%q", got)
		}
	})
	t.Run("quarantined", func(t *testing.T) {
		f := wsFixture(t, Config{})
		c, br := f.wsOpen(t, "a.test")
		f.event(t)
		f.gw.Suspend("quarantined: exfiltration")
		if e := f.event(t); e.Kind != WebSocketClosed || !strings.Contains(e.Reason, "suspended: quarantined: exfiltration") {
			t.Fatalf("close event %+v", e)
		}
		if _, err := echo(c, br, "y"); err == nil {
			t.Fatal("the tunnel outlived the quarantine")
		}
	})
}

func TestRequestTargetsAndHostsRefused(t *testing.T) {
	f := newFixture(t, false, Config{})
	for _, tc := range []struct{ req, want string }{
		{"TRACE / HTTP/1.1\r\nHost: a.test\r\n\r\n", "TRACE is not served"},
		{"TRACK / HTTP/1.1\r\nHost: a.test\r\n\r\n", "TRACK is not served"},
		{"GET / HTTP/1.1\r\nHost: a.test:other.test\r\n\r\n", `Host port "other.test" is not this connection's port`},
		{"GET / HTTP/1.1\r\nHost: a.test:1\r\n\r\n", `Host port "1"`},
		{"GET //other.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", "starts with '//'"},
		{"GET http://a.test//other.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", "starts with '//'"},
		// Absolute form names the site: the URL's host decides.
		{"GET http://other.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", "no host rule matches other.test"},
	} {
		got := f.rawHTTP(t, tc.req)
		if len(got) != 1 || !strings.HasPrefix(got[0], "403 ") || !strings.Contains(got[0], tc.want) {
			t.Errorf("%q: %q", tc.req, got)
		}
		if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, tc.want) {
			t.Errorf("%q: event %+v", tc.req, e)
		}
	}
	if n := f.site.count("a.test") + f.site.count("other.test"); n != 0 {
		t.Fatalf("the origin saw %d refused requests", n)
	}
	// The twins: the connection's own port, an ordinary target.
	got := f.rawHTTP(t, fmt.Sprintf("GET /x/y HTTP/1.1\r\nHost: a.test:%d\r\n\r\n", f.port), "GET http://a.test/z HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], "200 site=a.test method=GET path=/x/y") || !strings.HasPrefix(got[1], "200 site=a.test method=GET path=/z") {
		t.Fatalf("twins: %q", got)
	}
}

// A request body that trickles is refused once it falls behind the
// minimum rate, freeing the connection; a body that keeps up is forwarded.
func TestTrickledBodyRefused(t *testing.T) {
	f := newFixture(t, false, Config{BodyGrace: 300 * time.Millisecond, BodyMinRate: 1000})
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: 100000\r\n\r\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 50; i++ {
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c.Close()
	<-done
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "arrived too slowly") {
		t.Fatalf("event %+v", e)
	}
	body := strings.Repeat("y", 50000)
	got := f.rawHTTP(t, fmt.Sprintf("POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	if len(got) != 1 || !strings.HasPrefix(got[0], "200 site=a.test method=POST") {
		t.Fatalf("a body that keeps up: %q", got)
	}
}

// Every forwarded request's record names the address it went to, on a new
// upstream connection or a pooled one.
func TestPooledRequestsNameTheirAddress(t *testing.T) {
	f := newFixture(t, false, Config{})
	for i := 0; i < 3; i++ {
		if got := f.rawHTTP(t, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 ") {
			t.Fatalf("%q", got)
		}
		if e := f.event(t); e.Dialled != fmt.Sprintf("127.0.0.2:%d", f.port) {
			t.Fatalf("request %d: dialled %q", i, e.Dialled)
		}
	}
}

// An address the lookup gave, which became refused since (the node gained
// it), is not dialled: the decision is made again at the dial.
func TestRefusedAtDial(t *testing.T) {
	var local atomic.Bool
	f := newFixture(t, false, Config{Refuse: func(r netpolicy.Rule, a netip.Addr) string {
		if local.Load() && a == netip.MustParseAddr("127.0.0.2") {
			return "the node's own address"
		}
		return ""
	}})
	if got := f.rawHTTP(t, "GET /before HTTP/1.1\r\nHost: a.test\r\n\r\n"); len(got) != 1 || !strings.HasPrefix(got[0], "200 ") {
		t.Fatalf("%q", got)
	}
	f.event(t)
	local.Store(true)
	// A new client connection: the pooled upstream one stays as dialled
	// (the shim's record of the address kept it), so close it first.
	f.gw.Close()
	f2 := newFixture(t, false, Config{Refuse: func(r netpolicy.Rule, a netip.Addr) string { return "the node's own address" }})
	got := f2.rawHTTP(t, "GET /after HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "502 ") || !strings.Contains(got[0], "127.0.0.2 withheld: the node's own address") {
		t.Fatalf("%q", got)
	}
	if e := f2.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "withheld") {
		t.Fatalf("event %+v", e)
	}
	if f2.site.count("a.test") != 0 {
		t.Fatal("the refused address was reached")
	}
}

// An encrypted ClientHello hides the name: refused where the rule passes
// TLS through, terminated for the outer name where it is inspected (a
// client using real ECH gives up then; nothing reaches its hidden name).
func TestECH(t *testing.T) {
	f, ca := inspectFixture(t)
	roots := f.pool.Clone()
	roots.AddCert(ca.Certificate())
	hs := func(outer, sni string) error {
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		return tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots, EncryptedClientHelloConfigList: echConfigList(t, outer), MinVersion: tls.VersionTLS13}).Handshake()
	}
	// Outer name other.test, passthrough: refused at the hello.
	if err := hs("other.test", "hidden.test"); err == nil {
		t.Fatal("an ECH hello to a passthrough rule was spliced")
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "ECH") || !strings.Contains(e.Reason, "EncryptedClientHelloEnabled=false") {
		t.Fatalf("event %+v", e)
	}
	// a.test (the outer name, inspected): the gateway answers for it and
	// rejects ECH; the client, wanting its hidden name, gives up.
	err := hs("a.test", "hidden.test")
	var rej *tls.ECHRejectionError
	if err == nil || !errors.As(err, &rej) {
		t.Fatalf("an inspected rule's ECH handshake: %v", err)
	}
	if n := f.site.count("hidden.test") + f.site.count("other.test"); n != 0 {
		t.Fatalf("the hidden names were reached %d times", n)
	}
}

// echConfigList is an ECHConfigList (draft-ietf-tls-esni) for an X25519
// key, with publicName as its outer name.
func echConfigList(t *testing.T, publicName string) []byte {
	t.Helper()
	pub := make([]byte, 32)
	for i := range pub {
		pub[i] = byte(9 + i)
	}
	var c []byte
	c = append(c, 7)                     // config_id
	c = append(c, 0x00, 0x20)            // KEM: DHKEM(X25519, HKDF-SHA256)
	c = append(c, 0x00, 32)              // public key
	c = append(c, pub...)                //
	c = append(c, 0x00, 4, 0, 1, 0, 1)   // cipher suites: HKDF-SHA256, AES-128-GCM
	c = append(c, 0)                     // maximum_name_length
	c = append(c, byte(len(publicName))) // public_name
	c = append(c, publicName...)         //
	c = append(c, 0, 0)                  // extensions
	cfg := append([]byte{0xfe, 0x0d, byte(len(c) >> 8), byte(len(c))}, c...)
	return append([]byte{byte(len(cfg) >> 8), byte(len(cfg))}, cfg...)
}

// reflectFixture: b.test's requests carry a secret with characters every
// encoding spells its own way; the origin echoes it back in each.
const reflectSecret = `s3cr/t+k="v"<&>=end-of-secret`
