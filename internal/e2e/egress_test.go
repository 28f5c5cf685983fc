//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

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
