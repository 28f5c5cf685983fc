//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a test DNS server on this machine: it answers A questions
// from a table (NOERROR and no records for anything else) and counts every
// question it is asked, by name.
type dnsServer struct {
	conn    *net.UDPConn
	answers map[string]netip.Addr
	mu      sync.Mutex
	asked   map[string]int
	packets int
}

func newDNSServer(addr string, answers map[string]netip.Addr) (*dnsServer, error) {
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		return nil, err
	}
	s := &dnsServer{conn: c, answers: answers, asked: map[string]int{}}
	go s.serve()
	return s, nil
}

func (s *dnsServer) serve() {
	buf := make([]byte, 65535)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.packets++
		s.mu.Unlock()
		var m dnsmessage.Message
		if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
			continue
		}
		q := m.Questions[0]
		name := strings.ToLower(q.Name.String())
		s.mu.Lock()
		s.asked[name]++
		s.mu.Unlock()
		m.Response, m.RecursionAvailable, m.Additionals = true, true, nil
		// A name's address is answered for its family's question (an
		// IPv6 one, for AAAA only); another question gets no answer.
		a, ok := s.answers[name]
		hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
		switch {
		case !ok:
			m.RCode = dnsmessage.RCodeNameError
		case q.Type == dnsmessage.TypeA && a.Is4():
			m.Answers = []dnsmessage.Resource{{Header: hdr, Body: &dnsmessage.AResource{A: a.As4()}}}
		case q.Type == dnsmessage.TypeAAAA && a.Is6():
			m.Answers = []dnsmessage.Resource{{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}}}
		}
		if b, err := m.Pack(); err == nil {
			s.conn.WriteToUDPAddrPort(b, from)
		}
	}
}

func (s *dnsServer) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[name]
}

func (s *dnsServer) packetCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.packets
}

// The names the upstream test server knows. The allowed ones resolve to the
// bridge's "other" address, which no CIDR rule allows: only the resolver's
// answer can open it.
const (
	dnsAllowed   = "allowed.e2e.test"
	dnsWild      = "x.wild.e2e.test"
	dnsNotListed = "notlisted.e2e.test"
	dnsRebind    = "meta.e2e.test" // allowed, but resolves to the metadata address
	// dnsPrivate is allowed by a rule without allowPrivate, and resolves
	// to the node's bridge address (a CNAME chain is unit-tested).
	dnsPrivate = "private.e2e.test"
)

// startDNSServers starts the upstream the pods' resolvers use (on
// loopback) and another resolver on the bridge that pods must not reach,
// and points the shim's config at the upstream.
func startDNSServers(d *daemon) error {
	other := netip.MustParseAddr(egress.other)
	answers := map[string]netip.Addr{
		dnsAllowed + ".":   other,
		dnsWild + ".":      other,
		dnsNotListed + ".": other,
		dnsRebind + ".":    netip.MustParseAddr(egress.metadata),
		dnsPrivate + ".":   other,
	}
	for _, n := range append([]string{gwAllowA, gwAllowB, gwOther, gwMCP, gwMCPPass}, modelHosts...) {
		answers[n+"."] = netip.MustParseAddr(webAddr)
	}
	// The gateway edges' names (edges_test.go): one whose address moves
	// onto the node while a sandbox runs, one whose only address is a
	// NAT64 spelling of loopback.
	answers[gwLate+"."] = netip.MustParseAddr(lateAddr)
	answers[gwNAT64+"."] = netip.MustParseAddr(nat64Loopback)
	var err error
	if egress.upstream, err = newDNSServer("127.0.0.1:0", answers); err != nil {
		return err
	}
	if egress.otherDNS, err = newDNSServer(egress.other+":53", answers); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(d.dir, "agentbox", "config.toml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err = fmt.Fprintf(f, "\n# The e2e suite's upstream DNS server (on loopback).\n[network]\nupstreams = [%q]\n", egress.upstream.conn.LocalAddr().String()); err != nil {
		return err
	}
	// The gateway verifies the test web host (behind inspected rules) with
	// its CA, as it would a corporate one.
	webCA := filepath.Join(d.dir, "web-ca.pem")
	if err := os.WriteFile(webCA, []byte(web.caPEM), 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "\n# The test web host's CA, for the gateway's inspected rules.\n[egress]\nupstream_ca_file = %q\n", webCA)
	return err
}

func dnsScript(steps ...string) string {
	return strings.Join(steps, "; ") + "; echo probes-done; sleep 600"
}

// lookup runs busybox nslookup for name (at server, if given) and labels
// its output.
func lookup(name, server string) string {
	return fmt.Sprintf("r=$(timeout 4 nslookup %s %s 2>&1); echo \"lookup %s@%s: rc=$? $(echo \"$r\" | tr '\\n' ' ')\"", name, server, name, server)
}

func connect(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("r=$(nc -w 3 %s %s </dev/null 2>&1); echo \"probe %s: $r\"", host, port, addr)
}

// TestEgressDNS: under an allowlist with host rules, the pod's resolver
// answers allowed names with the egress gateway's address, and the address
// upstream gave stays closed on the pod's interface (before the lookup and
// after: only the gateway, deciding by name, reaches it); a name not on the
// list gets NXDOMAIN without reaching upstream; another resolver is
// unreachable; a name that resolves to the metadata address stays closed.
// Every question and refusal is in the trail. (TestEgressGateway: what
// goes through the gateway.)
func TestEgressDNS(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	otherAllowed := net.JoinHostPort(egress.other, fmt.Sprint(egress.allowed.port))
	otherDenied := net.JoinHostPort(egress.other, fmt.Sprint(egress.denied.port))
	before := map[string]int{}
	for _, n := range []string{dnsAllowed, dnsWild, dnsNotListed, dnsRebind} {
		before[n] = egress.upstream.count(n + ".")
	}
	beforeOther, beforeDenied, beforeOtherDNS := egress.allowed.count(egress.other), egress.denied.count(egress.other), egress.otherDNS.packetCount()
	beforeMeta := egress.meta.count(egress.metadata)

	p := newPodIn(t, "dns", "e2e-dns", map[string]string{"agentbox.dev/role": "e2e-dns"})
	id := p.container(t, "c", "sh", "-c", dnsScript(
		"cat /etc/resolv.conf | sed 's/^/resolv: /'",
		connect(otherAllowed), // before any answer: closed
		lookup(dnsPrivate, ""),
		connect(otherDenied), // private.e2e.test's rule allows this port, but the answer was withheld
		lookup(dnsAllowed, ""),
		connect(otherAllowed),
		connect(otherDenied),
		lookup(dnsWild, ""),
		lookup(dnsNotListed, ""),
		lookup(dnsAllowed, egress.other),
		lookup(dnsRebind, ""),
		connect(egress.metadata+":80"),
	))
	logs := waitLogs(t, id, "probes-done")
	out := logs.stdout
	want := []string{
		"resolv: nameserver 169.254.53.53",
		"probe " + otherAllowed + ": nc: timed out",
		"lookup " + dnsPrivate + "@: rc=",
		"lookup " + dnsAllowed + "@: rc=0 ",
		"probe " + otherAllowed + ": nc: timed out", // never opened by an answer
		"probe " + otherDenied + ": nc: timed out",
		"lookup " + dnsWild + "@: rc=0 ",
		"lookup " + dnsNotListed + "@: rc=1 ",
		"lookup " + dnsAllowed + "@" + egress.other + ": rc=143 ", // killed by timeout: no answer
		"probe " + egress.metadata + ":80: nc: timed out",
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if !strings.Contains(out, "Address: "+gwAddress) || strings.Contains(out, "Address: "+egress.other) || !strings.Contains(out, "NXDOMAIN") {
		t.Errorf("answers: %s", out)
	}
	if t.Failed() {
		t.Fatalf("pod output:\n%s\nstderr:\n%s", out, logs.stderr)
	}
	// What reached the test servers.
	if n := egress.allowed.count(egress.other) - beforeOther; n != 0 {
		t.Errorf("the allowed name's address was reached directly %d times", n)
	}
	if n := egress.otherDNS.packetCount() - beforeOtherDNS; n != 0 {
		t.Errorf("the other resolver got %d packets", n)
	}
	if n := egress.meta.count(egress.metadata) - beforeMeta; n != 0 {
		t.Errorf("the metadata address was reached %d times", n)
	}
	if egress.upstream.count(dnsAllowed+".") == before[dnsAllowed] || egress.upstream.count(dnsWild+".") == before[dnsWild] {
		t.Error("allowed names must be resolved upstream")
	}
	if n := egress.upstream.count(dnsNotListed+".") - before[dnsNotListed]; n != 0 {
		t.Errorf("a name not on the list reached upstream %d times", n)
	}
	// A second container joins the pod's resolver and rules; one that
	// claims a wider role does not start, and the pod's rules stay as they
	// were.
	wider := p.tryContainer(t, "wider", map[string]any{"command": []string{"true"}, "annotations": map[string]string{"agentbox.dev/role": "e2e-open"}})
	if wider.code != 0 {
		t.Fatalf("create: %v", wider)
	}
	if rs := dev.crictl(60*time.Second, "start", strings.TrimSpace(wider.stdout)); rs.code == 0 || !strings.Contains(rs.stderr, "a container runs under its pod's role") {
		t.Fatalf("a container claiming a wider role: %v", rs)
	}
	id2 := p.container(t, "c2", "sh", "-c", dnsScript(
		"cat /etc/resolv.conf | sed 's/^/resolv: /'",
		lookup(dnsWild, ""),
		connect(otherAllowed),
		connect(otherDenied),
	))
	out2 := waitLogs(t, id2, "probes-done").stdout
	for _, w := range []string{"resolv: nameserver 169.254.53.53", "lookup " + dnsWild + "@: rc=0 ", "probe " + otherAllowed + ": nc: timed out", "probe " + otherDenied + ": nc: timed out"} {
		if !strings.Contains(out2, w) {
			t.Errorf("second container: output lacks %q:\n%s", w, out2)
		}
	}
	if n := egress.denied.count(egress.other) - beforeDenied; n != 0 {
		t.Errorf("another port of the allowed name's address was reached %d times", n)
	}
	// Answers open nothing in the pod's ruleset.
	netns := podNetns(t, p.id)
	table, _ := exec.Command("nsenter", "--net="+netns, "nft", "list", "table", "netdev", "agentbox").CombinedOutput()
	if strings.Contains(string(table), egress.other) || strings.Contains(string(table), "set ") || !strings.Contains(string(table), "default deny") {
		t.Errorf("the pod's ruleset:\n%s", table)
	}
	p.remove()

	recs := readTrail(t, p.id)
	type seen struct {
		answered, refused, otherResolver, allowedConnect, deniedConnect, stopped, drops, deniedQuery, withheld bool
	}
	var s seen
	for _, r := range recs {
		switch r.Event {
		case "agentbox/dns_answered":
			if r.Detail["name"] == dnsAllowed && r.Detail["type"] == "A" && r.Detail["addresses"] == egress.other &&
				r.Detail["rule"] == fmt.Sprintf("allow[0] host %s ports %v", dnsAllowed, sortedPorts(egress.allowed.port, egress.sink.port)) && r.Detail["allowed_for"] == "5m0s" {
				s.answered = true
			}
		case "agentbox/dns_address_withheld":
			if r.Detail["name"] == dnsPrivate && r.Detail["address"] == egress.other && strings.Contains(r.Detail["reason"], "allowPrivate") {
				s.withheld = true
			}
		case "agentbox/dns_refused":
			if r.Detail["name"] == dnsNotListed && r.Detail["rule"] == "no host rule matches" && r.Detail["rcode"] == "RCodeNameError" {
				s.refused = true
			}
		case "agentbox/resolver_stopped":
			s.stopped = r.Status == "Success"
		case "agentbox/egress_denied":
			if r.Dst != nil && r.Dst.IP == egress.other && r.Dst.Port == 53 && r.Detail["egress_rule"] == "dns to another resolver" && r.Detail["protocol"] == "udp" {
				s.deniedQuery = true
			}
		case "agentbox/egress_drops":
			d := r.Detail["dropped dns to another resolver"]
			s.drops = d != "" && !strings.HasPrefix(d, "0 ")
		case "syscall/connect":
			if r.Dst == nil {
				continue
			}
			dst := net.JoinHostPort(r.Dst.IP, fmt.Sprint(r.Dst.Port))
			got := r.Detail["egress"] + " " + r.Detail["egress_rule"]
			switch dst {
			case net.JoinHostPort(egress.other, "53"):
				s.otherResolver = got == "deny dns to another resolver"
			case otherAllowed:
				if got == "deny default deny" {
					s.allowedConnect = true // the answered address, dialled directly
				}
			case otherDenied:
				s.deniedConnect = got == "deny default deny"
			}
		}
	}
	if s != (seen{true, true, true, true, true, true, true, true, true}) {
		for _, r := range recs {
			if strings.HasPrefix(r.Event, "agentbox/") || r.Event == "syscall/connect" {
				t.Logf("%s %s %v %v", r.Event, r.Status, r.Dst, r.Detail)
			}
		}
		t.Fatalf("trail: %+v", s)
	}
}

// podNetns reads a CRI pod's network namespace path.
func podNetns(t *testing.T, podID string) string {
	t.Helper()
	r := dev.crictl(30*time.Second, "inspectp", "-o", "go-template", "--template", `{{range .info.runtimeSpec.linux.namespaces}}{{if eq .type "network"}}{{.path}}{{end}}{{end}}`, podID)
	ns := strings.TrimSpace(r.stdout)
	if r.code != 0 || ns == "" {
		t.Fatalf("no network namespace for pod %s: %v", podID, r)
	}
	return ns
}
