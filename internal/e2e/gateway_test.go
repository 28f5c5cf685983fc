//go:build e2e

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"agentbox.dev/agentbox/internal/egressrec"
	"agentbox.dev/agentbox/internal/nsthread"

	//lint:ignore SA1019 the deprecated h2c package is what still answers an HTTP/1.1 Upgrade: h2c, as origins do
	"golang.org/x/net/http2/h2c"
)

// The test web host: one address, in a network namespace of its own on
// this machine (not the node's, not the pods' bridge), serving several
// names, as a CDN does. The node reaches it over a veth pair.
const (
	webNetns  = "abx-e2e-web"
	webLink   = "abx-web0"
	webNode   = "198.51.100.1" // the node's end
	webAddr   = "198.51.100.10"
	gwAllowA  = "a.gw.e2e.test"
	gwAllowB  = "b.gw.e2e.test"
	gwOther   = "other.gw.e2e.test" // same address, no rule
	gwAddress = "169.254.53.53"     // the pod's resolver and gateway
	// webFence is unreachable from the node while the suite runs (behind
	// the link's own route, by metric): if the web host's link is gone,
	// nothing sent to its range follows the default route off this
	// machine. (This machine's registries sit on TEST-NET-3, which is why
	// the suite does not use it; the special-purpose ranges are withheld
	// by the resolver, by design.)
	webFence = "198.51.100.0/24"
)

// webHost answers every request with the site (Host) it reached, over HTTP
// on :80 and HTTPS on :443 (one certificate for all its names, from a test
// CA), and counts requests by site and by the address they came from.
type webHost struct {
	caPEM string
	mu    sync.Mutex
	sites map[string]int
	from  map[string]int
	// auth is every Authorization and X-Token value received, by
	// "site path" (never echoed back to the client).
	auth map[string][]string
	// files are what the web host serves as a package index, an npm
	// registry and a git repository (realclients_test.go), by path.
	files map[string][]byte
	srv   []*http.Server
}

// authSeen is what the web host received as credentials for a site and path.
func (w *webHost) authSeen(site, path string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.auth[site+" "+path]...)
}

// allAuth is every credential the web host received, by "site path".
func (w *webHost) allAuth() map[string][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string][]string{}
	for k, v := range w.auth {
		out[k] = append([]string(nil), v...)
	}
	return out
}

var web *webHost

func (w *webHost) count(site string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sites[site]
}

func (w *webHost) clients() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.from {
		out[k] = v
	}
	return out
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// startWebHost creates the web host's namespace and link and serves it.
func startWebHost() error {
	stopWebHostNetns()
	for _, args := range [][]string{
		{"route", "add", "unreachable", webFence, "metric", "4000"},
		{"netns", "add", webNetns},
		{"link", "add", webLink, "type", "veth", "peer", "name", "eth0", "netns", webNetns},
		{"addr", "add", webNode + "/24", "dev", webLink},
		{"link", "set", webLink, "up"},
		{"-n", webNetns, "addr", "add", webAddr + "/24", "dev", "eth0"},
		{"-n", webNetns, "link", "set", "eth0", "up"},
		{"-n", webNetns, "link", "set", "lo", "up"},
		{"-n", webNetns, "route", "add", "default", "via", webNode},
	} {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	w := &webHost{sites: map[string]int{}, from: map[string]int{}, auth: map[string][]string{}}
	cert, caPEM, err := webCert(append([]string{gwAllowA, gwAllowB, gwOther, gwMCP, gwMCPPass}, modelHosts...)...)
	if err != nil {
		return err
	}
	w.caPEM = caPEM
	if w.files, err = packageFiles("https://" + gwAllowA); err != nil {
		return err
	}
	var plain, secure net.Listener
	err = nsthread.Run(nsthread.Path("/var/run/netns/"+webNetns), func() (err error) {
		if plain, err = net.Listen("tcp4", webAddr+":80"); err != nil {
			return err
		}
		secure, err = net.Listen("tcp4", webAddr+":443")
		return err
	})
	if err != nil {
		return err
	}
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		from, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.mu.Lock()
		w.sites[host]++
		w.from[from]++
		for _, k := range modelKeyHeaders {
			for _, v := range r.Header.Values(k) {
				w.auth[host+" "+r.URL.Path] = append(w.auth[host+" "+r.URL.Path], k+": "+v)
			}
		}
		w.mu.Unlock()
		if originEdge(rw, r) || serveBilled(rw, r) || serveModel(rw, r) || mcpServer.serve(rw, r) {
			return
		}
		io.Copy(io.Discard, r.Body)
		if b, ok := w.files[r.URL.Path]; ok {
			rw.Write(b)
			return
		}
		if i := strings.Index(r.URL.Path, "/slow/"); i >= 0 {
			// A slow download for n seconds: 64 KiB every 25 ms (quarantine
			// tests watch it stop).
			secs, _ := strconv.Atoi(r.URL.Path[i+len("/slow/"):])
			f, _ := rw.(http.Flusher)
			chunk := make([]byte, 64<<10)
			for end := time.Now().Add(time.Duration(secs) * time.Second); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
				if _, err := rw.Write(chunk); err != nil {
					return
				}
				if f != nil {
					f.Flush()
				}
			}
			return
		}
		if i := strings.Index(r.URL.Path, "/bytes/"); i >= 0 {
			n := r.URL.Path[i+len("/bytes/"):]
			// A download of n bytes (benchmarks).
			k, _ := strconv.ParseInt(n, 10, 64)
			rw.Header().Set("Content-Length", n)
			io.CopyN(rw, zeros{}, k)
			return
		}
		fmt.Fprintf(rw, "site=%s path=%s\n", host, r.URL.Path)
	})
	// Like real origins and CDN edges, it upgrades to h2c when asked.
	//lint:ignore SA1019 see the import
	hh := h2c.NewHandler(h, &http2.Server{})
	s1 := &http.Server{Handler: hh}
	s2 := &http.Server{Handler: hh, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go s1.Serve(plain)
	go s2.ServeTLS(secure, "", "")
	w.srv = []*http.Server{s1, s2}
	web = w
	return nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// stopWebHost stops the servers and removes the namespace and link.
func stopWebHost() {
	if web != nil {
		for _, s := range web.srv {
			s.Close()
		}
	}
	stopWebHostNetns()
}

func stopWebHostNetns() {
	exec.Command("ip", "link", "del", webLink).Run()
	exec.Command("ip", "netns", "del", webNetns).Run()
	exec.Command("ip", "route", "del", "unreachable", webFence, "metric", "4000").Run()
}

// webCert makes a test CA and a certificate for names signed by it.
func webCert(names ...string) (tls.Certificate, string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentbox e2e web CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), nil
}

// runProbes runs script in a probe-image container of p that trusts the
// web host's CA, and returns its logs once it says probes-done.
func (p *pod) runProbes(t *testing.T, script string) result {
	t.Helper()
	id := p.containerWith(t, "c", map[string]any{
		"image":   map[string]any{"image": probeImage},
		"command": []string{"sh", "-c", script},
		"envs":    []map[string]string{{"key": "AGENT_CA_PEM", "value": web.caPEM}},
	})
	return waitLogs(t, id, "probes-done")
}

// stepLines parses the "== step: output" lines gwStep and the real-agent
// scripts print, by step.
func stepLines(stdout string) map[string]string {
	lines := map[string]string{}
	for _, l := range strings.Split(stdout, "\n") {
		if rest, ok := strings.CutPrefix(l, "== "); ok {
			k, v, _ := strings.Cut(rest, ": ")
			lines[k] = v
		}
	}
	return lines
}

// expectStep checks that step printed want and, for a refusal, that it
// reached no site.
func expectStep(t *testing.T, lines map[string]string, step, want string, refused bool) {
	t.Helper()
	got, ok := lines[step]
	switch {
	case !ok:
		t.Errorf("%s: no output", step)
	case !strings.Contains(got, want):
		t.Errorf("%s: got %q, want %q", step, got, want)
	case refused && strings.Contains(got, "site="):
		t.Errorf("%s: reached a site: %q", step, got)
	}
}

// gwStep runs one probe in the pod and labels its output on one line.
func gwStep(label, cmd string) string {
	return fmt.Sprintf("echo \"== %s: $( (%s) 2>&1 | tr '\\n' ' ')\"", label, cmd)
}

// TestEgressGateway: under an allowlist of two names served, with a third,
// from one address, only the allowed names get through, decided by name at
// the gateway: another site by Host (on an allowed name's connection), by
// SNI, by a name off the list, and a direct connection to the address are
// refused, while the allowed names work over HTTP and HTTPS with the
// client's own verification of the real server. Every request and refusal
// is in the trail.
func TestEgressGateway(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	before := web.clients()
	// Other tests reach the web host by address (CIDR rules): only this
	// test's requests count.
	otherBefore, byAddrBefore := web.count(gwOther), web.count(webAddr)
	p := newPodIn(t, "gw", "e2e-gw", map[string]string{"agentbox.dev/role": "e2e-gw"})
	script := strings.Join([]string{
		gwStep("resolve", "nslookup "+gwAllowA),
		gwStep("hosts", "cat /etc/hosts"),
		gwStep("http-allowed", "abx-fetch http://"+gwAllowA+"/h1"),
		gwStep("http-other-host", "abx-fetch -host "+gwOther+" http://"+gwAllowA+"/h2"),
		gwStep("http-other-name", "abx-fetch http://"+gwOther+"/h3"),
		gwStep("https-allowed", "abx-fetch https://"+gwAllowB+"/t1"),
		gwStep("https-other-sni", "abx-fetch -connect "+gwAllowA+":443 https://"+gwOther+"/t2"),
		gwStep("https-no-sni", "abx-fetch -connect "+gwAllowA+":443 https://"+webAddr+"/t3"),
		gwStep("https-direct", "abx-fetch -connect "+webAddr+":443 https://"+gwAllowA+"/t4"),
		gwStep("http-direct", "abx-fetch -host "+gwAllowA+" http://"+webAddr+"/h4"),
		"echo probes-done", "sleep 600",
	}, "; ")
	logs := p.runProbes(t, script)
	out := logs.stdout
	lines := stepLines(out)
	expect := func(step, want string, refused bool) { t.Helper(); expectStep(t, lines, step, want, refused) }
	expect("resolve", "Address: "+gwAddress, false)
	// The rules' names are in the pod's hosts file, at the gateway: the
	// agent's lookups of them need no round trip to the resolver.
	expect("hosts", gwAddress+"\t"+gwAllowB, false)
	expect("http-allowed", "site="+gwAllowA+" path=/h1", false)
	expect("http-other-host", "status=403", true)
	expect("http-other-name", "no such host", true)
	expect("https-allowed", "status=200 body=site="+gwAllowB+" path=/t1", false)
	expect("https-other-sni", "error:", true)
	expect("https-no-sni", "error:", true)
	expect("https-direct", "error:", true)
	expect("http-direct", "error:", true)
	if t.Failed() {
		t.Fatalf("pod output:\n%s\nstderr:\n%s", out, logs.stderr)
	}
	// What the web host saw: the allowed sites only, each from the node
	// (the gateway dials), never from the pod itself.
	if n := web.count(gwOther) - otherBefore; n != 0 {
		t.Errorf("the other site was reached %d times", n)
	}
	if n := web.count(webAddr) - byAddrBefore; n != 0 {
		t.Errorf("the web host was reached by address %d times", n)
	}
	for from, n := range web.clients() {
		if from != webNode && n != before[from] {
			t.Errorf("%d requests came from %s, not the gateway on the node", n-before[from], from)
		}
	}
	p.remove()

	type seen struct {
		request, refusedHost, connection, refusedSNI, refusedNoSNI, dnsRefused, connectGateway, connectDirect, stopped bool
	}
	var s seen
	askedForB := 0
	recs := readTrail(t, p.id)
	// The connects to the gateway, by the port each got (the runsc patch's
	// local address): the gateway's records name that connect's process.
	connects := map[int]record{}
	for _, r := range recs {
		if r.Event == "syscall/connect" && r.Dst != nil && r.Dst.IP == gwAddress && r.Src != nil {
			connects[r.Src.Port] = r
		}
	}
	var joined *record
	for _, r := range recs {
		d := r.Detail
		switch r.Event {
		case "agentbox/egress_request":
			if d["host"] == gwAllowA && d["method"] == "GET" && d["path"] == "/h1" && d["http_status"] == "200" &&
				d["dialled"] == webAddr+":80" && strings.HasPrefix(d["egress_rule"], "allow[0] host "+gwAllowA) && d["bytes_received"] != "" {
				s.request = true
				joined = &r
			}
		case "agentbox/egress_refused":
			switch {
			case d["host"] == gwOther && d["path"] == "/h2" && d["http_status"] == "403" && strings.Contains(d["reason"], "no host rule matches "+gwOther):
				s.refusedHost = true
			case d["sni"] == gwOther && strings.Contains(d["reason"], "no host rule matches "+gwOther):
				s.refusedSNI = true
			case strings.Contains(d["reason"], "no SNI"):
				s.refusedNoSNI = true
			}
		case "agentbox/egress_connection":
			if d["sni"] == gwAllowB && d["dialled"] == webAddr+":443" && d["bytes_sent"] != "" && d["bytes_received"] != "" {
				s.connection = true
			}
		case "agentbox/dns_refused":
			s.dnsRefused = s.dnsRefused || d["name"] == gwOther
		case "agentbox/dns_answered":
			if strings.EqualFold(strings.TrimSuffix(d["name"], "."), gwAllowB) {
				askedForB++
			}
		case "agentbox/gateway_stopped":
			s.stopped = r.Status == "Success"
		case "syscall/connect":
			if r.Dst == nil {
				continue
			}
			switch {
			case r.Dst.IP == gwAddress && r.Dst.Port == 80 && d["egress_rule"] == egressrec.RuleGateway && d["egress"] == "allow":
				s.connectGateway = r.Status == "Success"
			case r.Dst.IP == webAddr && d["egress"] == "deny" && d["egress_rule"] == "default deny":
				s.connectDirect = true
			}
		}
	}
	if s != (seen{true, true, true, true, true, true, true, true, true}) {
		for _, r := range recs {
			if strings.HasPrefix(r.Event, "agentbox/") || r.Event == "syscall/connect" {
				t.Logf("%s %s %s %v %v", r.Event, r.Status, r.Message, r.Dst, r.Detail)
			}
		}
		t.Fatalf("trail: %+v", s)
	}
	// The request's record names the process that opened its connection:
	// the connect whose local port is the client port the gateway saw.
	if joined.Src == nil || joined.Src.Port == 0 {
		t.Fatalf("the request's record has no client endpoint: %+v", joined)
	}
	switch c, ok := connects[joined.Src.Port]; {
	case !ok:
		t.Errorf("no connect to the gateway from port %d (connects from %v)", joined.Src.Port, slices.Sorted(maps.Keys(connects)))
	case joined.Process == nil || c.Process == nil || joined.Process.PID != c.Process.PID || joined.Process.Name != "abx-fetch":
		t.Errorf("the request's actor %+v is not the connect's process %+v", joined.Process, c.Process)
	case joined.Detail["connect_event"] != strconv.Itoa(c.Seq):
		t.Errorf("the request names connect %q, the connect is seq %d", joined.Detail["connect_event"], c.Seq)
	}
	// b.gw.e2e.test was fetched by name over HTTPS, never looked up with
	// nslookup: its address came from the hosts file (the other name, in
	// no rule, still went to the resolver and was refused).
	if askedForB != 0 {
		t.Errorf("the resolver was asked for %s %d times: the hosts file was not used", gwAllowB, askedForB)
	}
}

// serveHTTPReply is a countingServer that speaks HTTP: every request is
// answered reply and counted by the local address it reached.
func serveHTTPReply(addr, reply string) (*countingServer, error) {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, err
	}
	s := &countingServer{ln: ln, port: ln.Addr().(*net.TCPAddr).Port, hits: map[string]int{}}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			local, _, _ := net.SplitHostPort(a.String())
			s.mu.Lock()
			s.hits[local]++
			s.accepts = append(s.accepts, time.Now())
			s.mu.Unlock()
		}
		io.WriteString(w, reply)
	}))
	return s, nil
}

// fetchScript sends an HTTP/1.0 GET to each host:port with busybox nc
// (busybox wget crashes inside gVisor here), labelled, then waits.
func fetchScript(targets ...string) string {
	var b strings.Builder
	for _, hp := range targets {
		host, port, _ := net.SplitHostPort(hp)
		fmt.Fprintf(&b, "r=$(printf 'GET / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' | nc -w 3 %s %s 2>&1 | tr '\\r\\n' '  '); echo \"fetch %s: $r\"; ", host, host, port, hp)
	}
	b.WriteString("echo probes-done; sleep 600")
	return b.String()
}
