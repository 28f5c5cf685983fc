//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// countingServer answers every connection and counts them by the local
// address they reached.
type countingServer struct {
	ln      net.Listener
	port    int
	mu      sync.Mutex
	hits    map[string]int
	accepts []time.Time
}

func serve(addr, reply string) (*countingServer, error) {
	network := "tcp4"
	if strings.HasPrefix(addr, "[") {
		network = "tcp6"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	s := &countingServer{ln: ln, port: ln.Addr().(*net.TCPAddr).Port, hits: map[string]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			local, _, _ := net.SplitHostPort(c.LocalAddr().String())
			s.mu.Lock()
			s.hits[local]++
			s.accepts = append(s.accepts, time.Now())
			s.mu.Unlock()
			c.Write([]byte(reply))
			c.Close()
		}
	}()
	return s, nil
}

func (s *countingServer) count(addr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[addr]
}

// egress holds the test servers every destination of the egress tests
// resolves to: all on this machine, on the private containerd's bridge.
var egress struct {
	gateway, other string
	metadata       string
	gateway6       string          // the bridge's IPv6 address
	metadata6      string          // fd00:ec2::254, bound on the bridge
	denied6        *countingServer // [gateway6]:port, allowed by no rule
	meta6          *countingServer // [fd00:ec2::254]:80
	allowed        *countingServer // gateway:port allowed by e2e-allow (listens everywhere)
	denied         *countingServer // another port, same address
	meta           *countingServer // 169.254.169.254:80, bound on the bridge
	sink           *sinkServer     // gateway:port allowed by e2e-allow, for throughput
	upstream       *dnsServer      // the resolvers' upstream, on loopback
	otherDNS       *dnsServer      // another resolver, on other:53, that pods must not reach
}

// sinkServer reads each connection to the end and records its bytes and
// the time from its first byte to its end.
type sinkServer struct {
	port int
	mu   sync.Mutex
	runs []sinkRun
}

type sinkRun struct {
	bytes int64
	took  time.Duration
}

func newSink() (*sinkServer, error) {
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	s := &sinkServer{port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256<<10)
				var n int64
				var first time.Time
				for {
					k, err := c.Read(buf)
					if k > 0 && first.IsZero() {
						first = time.Now()
					}
					n += int64(k)
					if err != nil {
						break
					}
				}
				s.mu.Lock()
				s.runs = append(s.runs, sinkRun{n, time.Since(first)})
				s.mu.Unlock()
			}()
		}
	}()
	return s, nil
}

func startEgressServers(d *daemon) error {
	gw, bridge, err := bridgeOf(d)
	if err != nil {
		return err
	}
	egress.gateway = gw
	egress.other = strings.TrimSuffix(gw, ".1") + ".254"
	egress.metadata = "169.254.169.254"
	egress.gateway6 = "fd00:ab:" + strings.Split(gw, ".")[2] + "::1"
	egress.metadata6 = "fd00:ec2::254"
	// The "other" and metadata addresses live on the private bridge only,
	// which hack/containerd.sh stop deletes.
	for _, a := range []string{egress.other + "/32", egress.metadata + "/32", egress.metadata6 + "/128"} {
		if out, err := exec.Command("ip", "addr", "add", a, "dev", bridge, "nodad").CombinedOutput(); err != nil {
			return fmt.Errorf("ip addr add %s dev %s: %v: %s", a, bridge, err, out)
		}
	}
	if egress.allowed, err = serve("0.0.0.0:0", "allowed-server\n"); err != nil {
		return err
	}
	if egress.denied, err = serve("0.0.0.0:0", "denied-server\n"); err != nil {
		return err
	}
	if egress.meta, err = serve(egress.metadata+":80", "metadata-server\n"); err != nil {
		return err
	}
	if egress.denied6, err = serve("["+egress.gateway6+"]:0", "v6-server\n"); err != nil {
		return err
	}
	if egress.meta6, err = serve("["+egress.metadata6+"]:80", "metadata-server\n"); err != nil {
		return err
	}
	if egress.sink, err = newSink(); err != nil {
		return err
	}
	if err := startWebHost(); err != nil {
		return err
	}
	return startDNSServers(d)
}

// bridgeOf reads the gateway address and bridge name from the daemon's CNI
// config.
func bridgeOf(d *daemon) (gw, bridge string, err error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "cni", "net.d", "10-agentbox.conflist"))
	if err != nil {
		return "", "", err
	}
	var conf struct {
		Plugins []struct {
			Bridge string `json:"bridge"`
			IPAM   struct {
				Ranges [][]struct{ Subnet string } `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		return "", "", err
	}
	_, n, err := net.ParseCIDR(conf.Plugins[0].IPAM.Ranges[0][0].Subnet)
	if err != nil {
		return "", "", err
	}
	ip := n.IP.To4()
	ip[3]++
	return ip.String(), conf.Plugins[0].Bridge, nil
}

func probeScript(targets ...string) string {
	var b strings.Builder
	for _, t := range targets {
		host, port, _ := net.SplitHostPort(t)
		fmt.Fprintf(&b, "r=$(nc -w 3 %s %s </dev/null 2>&1); echo \"probe %s: $r\"; ", host, port, t)
	}
	b.WriteString("echo probes-done; sleep 600")
	return b.String()
}

// TestEgressAllowlist: under an allowlist role the allowed address and
// port connect; another port on the same host, another address and the
// metadata address are refused by nftables in the pod's network namespace,
// and each attempt is audited with the rule that decided. After the pod is
// gone, so are its rules.
func TestEgressAllowlist(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	gwAllowed := net.JoinHostPort(egress.gateway, fmt.Sprint(egress.allowed.port))
	gwDenied := net.JoinHostPort(egress.gateway, fmt.Sprint(egress.denied.port))
	otherAddr := net.JoinHostPort(egress.other, fmt.Sprint(egress.allowed.port))
	meta := net.JoinHostPort(egress.metadata, "80")
	beforeOther, beforeMeta := egress.allowed.count(egress.other), egress.meta.count(egress.metadata)
	beforeDenied := egress.denied.count(egress.gateway)

	p := newPodIn(t, "egress", "e2e-allow", map[string]string{"agentbox.dev/role": "e2e-allow"})
	id := p.container(t, "c", "sh", "-c", probeScript(gwAllowed, gwDenied, otherAddr, meta))
	logs := waitLogs(t, id, "probes-done")
	if !strings.Contains(logs.stdout, "probe "+gwAllowed+": allowed-server") {
		t.Fatalf("the allowed host and port must connect: %v", logs)
	}
	for _, blocked := range []string{gwDenied, otherAddr, meta} {
		if !strings.Contains(logs.stdout, "probe "+blocked+": nc: timed out") {
			t.Errorf("%s must be refused: %v", blocked, logs)
		}
	}
	if n := egress.denied.count(egress.gateway) - beforeDenied; n != 0 {
		t.Errorf("the other port was reached %d time(s)", n)
	}
	if n := egress.allowed.count(egress.other) - beforeOther; n != 0 {
		t.Errorf("the other address was reached %d time(s)", n)
	}
	if n := egress.meta.count(egress.metadata) - beforeMeta; n != 0 {
		t.Errorf("the metadata address was reached %d time(s)", n)
	}
	// The rules are in the pod's namespace, outside the sandbox.
	r := dev.crictl(30*time.Second, "inspectp", p.id)
	var insp struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string } `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	json.Unmarshal([]byte(r.stdout), &insp)
	var netns string
	for _, ns := range insp.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			netns = ns.Path
		}
	}
	out, err := exec.Command("nsenter", "--net="+netns, "nft", "list", "table", "netdev", "agentbox").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hook egress") {
		t.Fatalf("no agentbox table in %s: %v: %s", netns, err, out)
	}
	p.remove()

	// Every attempt is in the trail with its destination and the rule.
	recs := readTrail(t, p.id)
	want := map[string]string{
		gwAllowed: fmt.Sprintf("allow allow[0] %s/32 ports %v", egress.gateway, sortedPorts(egress.allowed.port, egress.sink.port)),
		gwDenied:  "deny default deny",
		otherAddr: "deny default deny",
		meta:      "deny metadata address",
	}
	seen := map[string]bool{}
	denied := map[string]string{}
	var applied, removed, drops bool
	for _, rec := range recs {
		switch rec.Event {
		case "agentbox/egress_denied":
			if rec.Dst != nil {
				denied[net.JoinHostPort(rec.Dst.IP, fmt.Sprint(rec.Dst.Port))] = rec.Detail["protocol"] + " " + rec.Detail["egress_rule"]
			}
		case "agentbox/egress_drops":
			// Every refused attempt retransmits its SYN into the drop rules.
			drops = !strings.HasPrefix(rec.Detail["dropped default deny"], "0 ") && !strings.HasPrefix(rec.Detail["dropped metadata"], "0 ") &&
				rec.Detail["dropped metadata"] != "" && rec.Detail["dropped default deny"] != ""
			if !drops {
				t.Errorf("drop counters: %v", rec.Detail)
			}
		case "agentbox/egress_applied":
			applied = true
		case "agentbox/egress_removed":
			removed = rec.Status == "Success"
		case "syscall/connect":
			if rec.Dst == nil {
				continue
			}
			dst := net.JoinHostPort(rec.Dst.IP, fmt.Sprint(rec.Dst.Port))
			if w, ok := want[dst]; ok {
				got := rec.Detail["egress"] + " " + rec.Detail["egress_rule"]
				if got != w {
					t.Errorf("%s: recorded %q, want %q", dst, got, w)
				}
				seen[dst] = true
			}
		}
	}
	// The kernel's log of the drops names the same destinations and rules,
	// whatever made the packets.
	for dst, w := range map[string]string{gwDenied: "tcp default deny", otherAddr: "tcp default deny", meta: "tcp metadata address"} {
		if denied[dst] != w {
			t.Errorf("denial of %s logged as %q, want %q (all: %v)", dst, denied[dst], w, denied)
		}
	}
	if _, ok := denied[gwAllowed]; ok {
		t.Errorf("the allowed destination was logged as denied")
	}
	if !applied || !removed || !drops || len(seen) != len(want) {
		t.Fatalf("trail: applied %v removed %v drops %v, connects seen %v", applied, removed, drops, seen)
	}
}

// TestEgressOpenDeniesMetadata: open egress reaches the bridge, but not the
// metadata address.
func TestEgressOpenDeniesMetadata(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	before := egress.meta.count(egress.metadata)
	gwDenied := net.JoinHostPort(egress.gateway, fmt.Sprint(egress.denied.port))
	meta := net.JoinHostPort(egress.metadata, "80")
	p := newPodIn(t, "open", "e2e-net", map[string]string{"agentbox.dev/role": "e2e-open"})
	id := p.container(t, "c", "sh", "-c", probeScript(gwDenied, meta))
	logs := waitLogs(t, id, "probes-done")
	if !strings.Contains(logs.stdout, "probe "+gwDenied+": denied-server") {
		t.Fatalf("open egress must reach the bridge: %v", logs)
	}
	if !strings.Contains(logs.stdout, "probe "+meta+": nc: timed out") || egress.meta.count(egress.metadata) != before {
		t.Fatalf("the metadata address must stay denied under open egress: %v", logs)
	}
}

// TestEgressIPv6: on the dual-stack bridge, open egress reaches the
// gateway's IPv6 address but not fd00:ec2::254; an allowlist whose rules
// are all IPv4 reaches neither. Both refusals are audited.
func TestEgressIPv6(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	v6 := net.JoinHostPort(egress.gateway6, fmt.Sprint(egress.denied6.port))
	meta := net.JoinHostPort(egress.metadata6, "80")
	before6, beforeMeta := egress.denied6.count(egress.gateway6), egress.meta6.count(egress.metadata6)

	open := newPodIn(t, "open6", "e2e-net", map[string]string{"agentbox.dev/role": "e2e-open"})
	logs := waitLogs(t, open.container(t, "c", "sh", "-c", probeScript(v6, meta)), "probes-done")
	if !strings.Contains(logs.stdout, "probe "+v6+": v6-server") {
		t.Fatalf("open egress must reach the bridge over IPv6: %v", logs)
	}
	if !strings.Contains(logs.stdout, "probe "+meta+": nc: timed out") {
		t.Errorf("fd00:ec2::254 must stay denied under open egress: %v", logs)
	}
	allow := newPodIn(t, "allow6", "e2e-allow", map[string]string{"agentbox.dev/role": "e2e-allow"})
	logs = waitLogs(t, allow.container(t, "c", "sh", "-c", probeScript(v6, meta)), "probes-done")
	if !strings.Contains(logs.stdout, "probe "+v6+": nc: timed out") || !strings.Contains(logs.stdout, "probe "+meta+": nc: timed out") {
		t.Errorf("an IPv4 allowlist must refuse IPv6: %v", logs)
	}
	if n := egress.denied6.count(egress.gateway6) - before6; n != 1 {
		t.Errorf("the IPv6 server was reached %d times, want 1 (open egress only)", n)
	}
	if n := egress.meta6.count(egress.metadata6) - beforeMeta; n != 0 {
		t.Errorf("fd00:ec2::254 was reached %d times", n)
	}
	for _, p := range []*pod{open, allow} {
		p.remove()
	}
	want := map[string]map[string]string{
		open.id:  {v6: "allow egress open", meta: "deny metadata address"},
		allow.id: {v6: "deny default deny", meta: "deny metadata address"},
	}
	for id, w := range want {
		got, logged := map[string]string{}, map[string]string{}
		for _, r := range readTrail(t, id) {
			if r.Event == "syscall/connect" && r.Dst != nil {
				got[net.JoinHostPort(r.Dst.IP, fmt.Sprint(r.Dst.Port))] = r.Detail["egress"] + " " + r.Detail["egress_rule"]
			}
			if r.Event == "agentbox/egress_denied" && r.Dst != nil {
				logged[net.JoinHostPort(r.Dst.IP, fmt.Sprint(r.Dst.Port))] = r.Detail["protocol"] + " " + r.Detail["egress_rule"]
			}
		}
		if logged[meta] != "tcp metadata address" {
			t.Errorf("%s: the kernel's log of the IPv6 metadata drop: %v", id, logged)
		}
		for dst, decision := range w {
			if got[dst] != decision {
				t.Errorf("%s: %s recorded %q, want %q (all: %v)", id, dst, got[dst], decision, got)
			}
		}
	}
}

func sortedPorts(a, b int) []int {
	if a > b {
		a, b = b, a
	}
	return []int{a, b}
}

func (s *countingServer) snapshot() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.accepts...)
}

func (s *sinkServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// run waits (up to 10s) for the n-th run to end and returns it.
func (s *sinkServer) run(n int) sinkRun {
	for i := 0; i < 200; i++ {
		s.mu.Lock()
		if len(s.runs) > n {
			r := s.runs[n]
			s.mu.Unlock()
			return r
		}
		s.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return sinkRun{}
}

// TestEgressCtrNetns: a ctr container given a network namespace (a veth on
// the private bridge) gets the same rules, and they are removed from the
// namespace, which outlives the container, when it is deleted.
func TestEgressCtrNetns(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	_, bridge, err := bridgeOf(dev)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("abx-e2e-%d", os.Getpid())
	host := fmt.Sprintf("abxv%d", os.Getpid()%100000)
	ip := strings.TrimSuffix(egress.gateway, ".1") + ".200/24"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	run("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	defer exec.Command("ip", "link", "del", host).Run()
	run("ip", "link", "set", host, "master", bridge, "up")
	run("ip", "netns", "exec", ns, "ip", "addr", "add", ip, "dev", "eth0")
	run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
	run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

	id := uniqueID("ctrnet")
	gwAllowed := net.JoinHostPort(egress.gateway, fmt.Sprint(egress.allowed.port))
	gwDenied := net.JoinHostPort(egress.gateway, fmt.Sprint(egress.denied.port))
	before := egress.denied.count(egress.gateway)
	r := dev.runAgent(t, id, []string{"--with-ns", "network:/var/run/netns/" + ns, "--annotation", "agentbox.dev/role=e2e-allow"},
		"sh", "-c", strings.Replace(probeScript(gwAllowed, gwDenied), "; sleep 600", "", 1))
	if r.code != 0 || !strings.Contains(r.stdout, "probe "+gwAllowed+": allowed-server") || !strings.Contains(r.stdout, "probe "+gwDenied+": nc: timed out") {
		t.Fatalf("ctr container in a given netns: %v", r)
	}
	if egress.denied.count(egress.gateway) != before {
		t.Fatal("the denied port was reached")
	}
	// runsc moved the interface's address into the sandbox and did not
	// give it back: a namespace serves one sandbox unless it is readdressed.
	if out, _ := exec.Command("ip", "netns", "exec", ns, "ip", "-o", "-4", "addr", "show", "dev", "eth0").CombinedOutput(); strings.Contains(string(out), "inet ") {
		t.Logf("runsc left eth0's address in place: %s", out)
	}
	run("ip", "netns", "exec", ns, "ip", "addr", "replace", ip, "dev", "eth0")
	// Host rules work without the CRI too: the image's /etc/resolv.conf
	// gives way to the resolver's, and the gateway decides by name.
	r = dev.ctr(90*time.Second, "run", "--rm", "--runtime", runtimeType, "--with-ns", "network:/var/run/netns/"+ns,
		"--annotation", "agentbox.dev/role=e2e-gw", probeImage, uniqueID("ctrgw"),
		"sh", "-c", "grep nameserver /etc/resolv.conf; abx-fetch http://"+gwAllowA+"/ctr; abx-fetch http://"+gwOther+"/ctr; echo done")
	for _, w := range []string{"nameserver 169.254.53.53", "status=200 body=site=" + gwAllowA + " path=/ctr", "lookup " + gwOther, "no such host", "done"} {
		if r.code != 0 || !strings.Contains(r.stdout, w) {
			t.Errorf("ctr container, host rule: output lacks %q: %v", w, r)
		}
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput()
	if err != nil || strings.Contains(string(out), "agentbox") {
		t.Fatalf("rules left in the namespace after the container: %v %s", err, out)
	}
	out, err = exec.Command("ip", "netns", "exec", ns, "ip", "-o", "link", "show").CombinedOutput()
	if err != nil || strings.Contains(string(out), "agentbox-dns") {
		t.Fatalf("the resolver's link is left in the namespace after the container: %v %s", err, out)
	}
}

// TestEgressCtrLoopback: an allowlist role through plain ctr run (no CNI,
// no network namespace given) still has a working loopback, as through the
// CRI: a local server and its client, the commonest thing a coding agent
// does. Before, bind(127.0.0.1) failed with EADDRNOTAVAIL there.
func TestEgressCtrLoopback(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := dev.runAgent(t, uniqueID("ctrlo"), []string{"--annotation", "agentbox.dev/role=e2e-allow"},
		"sh", "-c", "mkdir /tmp/www && echo served-over-loopback > /tmp/www/index.html && httpd -p 127.0.0.1:9000 -h /tmp/www && sleep 1; "+
			"printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 3 127.0.0.1 9000; echo done")
	if r.code != 0 || !strings.Contains(r.stdout, "served-over-loopback") || !strings.Contains(r.stdout, "done") {
		t.Fatalf("loopback under ctr: %v", r)
	}
}
