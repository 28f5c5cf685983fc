package egressgw

// The gateway's unit-test fixture: a CA, a test site, a gateway in front
// of it on loopback, and what it records.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"

	//lint:ignore SA1019 the deprecated h2c package is what still answers an HTTP/1.1 Upgrade: h2c, as origins do
	"golang.org/x/net/http2/h2c"
)

// testCA makes a CA and a server certificate for names, the way a test web
// host that serves several names on one address has one.
func testCA(t testing.TB, names ...string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// site is a test web host: several names on one address (as a CDN), each
// answered with its name, over HTTP on one listener and HTTPS on another.
type site struct {
	mu   sync.Mutex
	hits map[string]int
	// auth is the Authorization each "host path" last received.
	auth map[string]string
	// check, when set, sees every request the site receives (set before
	// any is sent).
	check func(*http.Request)
	// serve, when set, answers a request first (true: it did).
	serve func(http.ResponseWriter, *http.Request) bool
}

func (s *site) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _ := splitHost(r.Host)
		s.mu.Lock()
		s.hits[host]++
		if s.auth != nil {
			s.auth[host+" "+r.URL.Path] = r.Header.Get("Authorization")
		}
		s.mu.Unlock()
		if s.check != nil {
			s.check(r)
		}
		if s.serve != nil && s.serve(w, r) {
			return
		}
		if originEdge(w, r) {
			return
		}
		io.Copy(io.Discard, r.Body)
		if n, ok := strings.CutPrefix(r.URL.Path, "/api/bytes/"); ok {
			// A download of n zero bytes (the benchmarks).
			k, _ := strconv.ParseInt(n, 10, 64)
			w.Header().Set("Content-Length", n)
			io.CopyN(w, zeroes{}, k)
			return
		}
		fmt.Fprintf(w, "site=%s method=%s path=%s auth=%q\n", host, r.Method, r.URL.Path, r.Header.Get("Authorization"))
	})
}

// zeroes reads as endless zero bytes.
type zeroes struct{}

func (zeroes) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// authOf is the Authorization the site last received for host and path.
func (s *site) authOf(hostPath string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.auth[hostPath]
}

func (s *site) count(host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[host]
}

// fixture: a gateway on 127.0.0.1:P and the site on 127.0.0.2:P (the same
// port: the gateway dials the port the agent connected to), for a plan
// allowing a.test and b.test on P.
type fixture struct {
	gw     *Gateway
	port   int
	site   *site
	events chan Event
	pool   *x509.CertPool
}

func listenPair(t testing.TB) (gw, up net.Listener) {
	t.Helper()
	for i := 0; i < 20; i++ {
		g, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		u, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.2:%d", g.Addr().(*net.TCPAddr).Port))
		if err == nil {
			return g, u
		}
		g.Close()
	}
	t.Skip("no port free on both 127.0.0.1 and 127.0.0.2")
	return nil, nil
}

func newFixture(t *testing.T, useTLS bool, cfg Config) *fixture {
	t.Helper()
	return newFixtureWith(t, useTLS, cfg, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
			{Host: "a.test", Ports: []int{port}}, {Host: "b.test", Ports: []int{port}}, {Host: "elsewhere.test", Ports: []int{1}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
}

// newFixtureWith is newFixture with the plan made for the port.
func newFixtureWith(t testing.TB, useTLS bool, cfg Config, plan func(port int) netpolicy.Plan) *fixture {
	t.Helper()
	gln, uln := listenPair(t)
	port := gln.Addr().(*net.TCPAddr).Port
	f := &fixture{port: port, site: &site{hits: map[string]int{}, auth: map[string]string{}}, events: make(chan Event, 100)}
	// The site honours h2c upgrades, as real origins (and CDN edges) do.
	//lint:ignore SA1019 see the import
	srv := &http.Server{Handler: h2c.NewHandler(f.site.handler(), &http2.Server{})}
	if useTLS {
		var cert tls.Certificate
		f.pool, cert = testCA(t, "a.test", "b.test", "other.test")
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
		go srv.ServeTLS(uln, "", "")
	} else {
		go srv.Serve(uln)
	}
	t.Cleanup(func() { srv.Close() })
	pl := plan(port)
	cfg.Plan = &pl
	if cfg.CA != nil && cfg.UpstreamRoots == nil {
		cfg.UpstreamRoots = f.pool
	}
	if cfg.Lookup == nil {
		cfg.Lookup = func(_ context.Context, r netpolicy.Rule, name string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.2")}, nil
		}
	}
	cfg.Record = func(e Event) { f.events <- e }
	f.gw = New(cfg)
	if err := f.gw.Serve(gln, port); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.gw.Close() })
	return f
}

func (f *fixture) event(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-f.events:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
		return Event{}
	}
}

// rawHTTP sends requests on one connection to the gateway and returns each
// response's status and body.
func (f *fixture) rawHTTP(t *testing.T, reqs ...string) []string {
	t.Helper()
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	var out []string
	for _, r := range reqs {
		if _, err := io.WriteString(c, r); err != nil {
			out = append(out, "write: "+err.Error())
			break
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			out = append(out, "read: "+err.Error())
			break
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out = append(out, fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b))))
	}
	return out
}
