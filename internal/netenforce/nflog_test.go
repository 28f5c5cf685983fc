package netenforce

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/nsthread"
	"agentbox.dev/agentbox/internal/policy"
)

// TestDenialLogInANamespace loads a plan into a namespace made here (a
// veth pair whose both ends stay in it, so nothing can leave), sends
// packets the rules drop, and reads them back from the kernel's log.
func TestDenialLogInANamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	for _, tool := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	ns := fmt.Sprintf("abx-nflog-%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	run("ip", "-n", ns, "addr", "add", "10.99.0.1/24", "dev", "d0")
	run("ip", "-n", ns, "link", "set", "d0", "up")
	run("ip", "-n", ns, "link", "set", "d1", "up")
	run("ip", "-n", ns, "route", "add", "169.254.169.254/32", "dev", "d0")
	run("ip", "-n", ns, "neigh", "add", "10.99.0.2", "lladdr", "02:00:00:00:00:02", "dev", "d0", "nud", "permanent")
	run("ip", "-n", ns, "neigh", "add", "169.254.169.254", "lladdr", "02:00:00:00:00:02", "dev", "d0", "nud", "permanent")
	path := "/var/run/netns/" + ns

	p := &policy.Profile{}
	p.Network.Egress = policy.EgressAllowlist
	p.Network.Allow = []policy.EgressRule{{CIDR: "10.99.0.2/32", Ports: []int{443}}}
	pl, err := netpolicy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	if iface, err := Apply(path, pl); err != nil || iface != "d0" {
		// d1 is an interface too: keep it out of the count.
		if iface, err = Apply(path, pl, "d1"); err != nil || iface != "d0" {
			t.Fatalf("apply: %q %v", iface, err)
		}
	}
	log, err := OpenDenialLog(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []Denial
	log.Start(func(d Denial) { mu.Lock(); got = append(got, d); mu.Unlock() }, func(int) {})
	send := func(network, addr string) {
		nsthread.Run(nsthread.Path(path), func() error {
			c, err := net.Dial(network, addr)
			if err == nil {
				c.Write([]byte("x"))
				c.Close()
			}
			return nil
		})
	}
	send("udp", "10.99.0.2:9")        // default deny
	send("udp", "10.99.0.2:53")       // another resolver
	send("udp", "169.254.169.254:80") // metadata
	send("udp", "10.99.0.2:443")      // allowed: not logged
	want := map[Denial]bool{
		{Rule: netpolicy.RuleDefaultDeny, Proto: "udp", Dst: netip.MustParseAddrPort("10.99.0.2:9")}:     true,
		{Rule: netpolicy.RuleOtherResolver, Proto: "udp", Dst: netip.MustParseAddrPort("10.99.0.2:53")}:  true,
		{Rule: netpolicy.RuleMetadata, Proto: "udp", Dst: netip.MustParseAddrPort("169.254.169.254:80")}: true,
	}
	t0 := time.Now()
	deadline := time.Now().Add(3 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, d := range got {
			if want[d] {
				n++
			}
		}
		all := append([]Denial(nil), got...)
		mu.Unlock()
		if n == len(want) {
			t.Logf("logged after %v", time.Since(t0))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logged %v, want %v", all, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	for _, d := range got {
		if d.Dst.Port() == 443 {
			t.Errorf("an allowed packet was logged: %v", d)
		}
	}
	mu.Unlock()
	t1 := time.Now()
	log.Close()
	t.Logf("closed after %v", time.Since(t1))
	counters, err := Counters(path)
	if err != nil || counters["default deny"].Packets == 0 || counters["metadata"].Packets == 0 || counters[netpolicy.RuleOtherResolver].Packets == 0 {
		t.Errorf("counters %v %v", counters, err)
	}

	// Quarantined, the allowed destination is dropped too, and logged as
	// the quarantine; restored, it passes again and the log is quiet.
	if err := Quarantine(path, "d0"); err != nil {
		t.Fatal(err)
	}
	log, err = OpenDenialLog(path)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	// The namespace's own IPv6 chatter (neighbour discovery, MLD) is
	// dropped too while quarantined: the test's UDP packets are what it
	// looks for.
	quarantined := make(chan Denial, 256)
	log.Start(func(d Denial) { quarantined <- d }, func(int) {})
	udp := func(d Denial, port uint16) bool { return d.Proto == "udp" && d.Dst.Port() == port }
	send("udp", "10.99.0.2:443")
	for deadline := time.After(3 * time.Second); ; {
		select {
		case d := <-quarantined:
			if !udp(d, 443) {
				continue
			}
			if d.Rule != netpolicy.RuleQuarantine {
				t.Errorf("quarantine logged %v", d)
			}
		case <-deadline:
			t.Fatal("a packet to the allowed destination was not dropped under quarantine")
		}
		break
	}
	if c, err := Counters(path); err != nil || c[netpolicy.RuleQuarantine].Packets == 0 || c["default deny"].Packets != 0 {
		t.Errorf("quarantine counters %v %v", c, err)
	}
	if err := Restore(path, pl, "d0"); err != nil {
		t.Fatal(err)
	}
	send("udp", "10.99.0.2:443")
	send("udp", "10.99.0.2:9")
	for deadline := time.After(3 * time.Second); ; {
		select {
		case d := <-quarantined:
			if udp(d, 443) {
				t.Errorf("after restore, the allowed destination was dropped: %v", d)
				continue
			}
			if !udp(d, 9) {
				continue
			}
			if d.Rule != netpolicy.RuleDefaultDeny {
				t.Errorf("after restore, port 9 was dropped by %q, want the default deny", d.Rule)
			}
		case <-deadline:
			t.Fatal("the restored rules log nothing")
		}
		break
	}
}

func TestDeduper(t *testing.T) {
	dd := &Deduper{Window: 5 * time.Second}
	d := Denial{Rule: netpolicy.RuleDefaultDeny, Proto: "tcp", Dst: netip.MustParseAddrPort("192.0.2.1:80")}
	now := time.Unix(100, 0)
	if !dd.Pass(d, now) || dd.Pass(d, now.Add(time.Second)) || dd.Pass(d, now.Add(4*time.Second)) {
		t.Fatal("a retransmission within the window must be held back")
	}
	if !dd.Pass(d, now.Add(6*time.Second)) || dd.Held() != 2 {
		t.Errorf("held %d", dd.Held())
	}
	other := d
	other.Dst = netip.MustParseAddrPort("192.0.2.1:81")
	if !dd.Pass(other, now.Add(6*time.Second)) {
		t.Error("another port is another denial")
	}
}

// attr encodes one netlink attribute.
func attr(typ uint16, data []byte) []byte {
	b := make([]byte, align4(4+len(data)))
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(data)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[4:], data)
	return b
}

func TestParseDenial(t *testing.T) {
	ipv4 := []byte{0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 2, 169, 254, 169, 254, 0x9c, 0x40, 0, 80}
	sum := ^checksum(ipv4[:20])
	binary.BigEndian.PutUint16(ipv4[10:], sum)
	ipv6 := append([]byte{0x60, 0, 0, 0, 0, 8, 17, 64}, make([]byte, 32)...)
	copy(ipv6[24:40], netip.MustParseAddr("fd00:ec2::254").AsSlice())
	ipv6 = append(ipv6, 0x9c, 0x40, 0, 53, 0, 8, 0, 0)
	// A destination MAC whose first nibble reads as IPv4 (seen with
	// gVisor's frames, whose packet header says protocol 0).
	eth := append([]byte{0x4a, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00}, ipv4...)
	eth6 := append([]byte{0x66, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x86, 0xdd}, ipv6...)
	badsum := append([]byte(nil), ipv4...)
	badsum[10]++
	prefix := func(rule string) []byte { return attr(nfulaPrefix, append([]byte(netpolicy.LogPrefix+rule), 0)) }
	cases := []struct {
		name  string
		attrs []byte
		want  Denial
		ok    bool
	}{
		{"ipv4 tcp", concat(prefix(netpolicy.RuleMetadata), attr(nfulaPayload, ipv4)), Denial{netpolicy.RuleMetadata, "tcp", netip.MustParseAddrPort("169.254.169.254:80")}, true},
		{"ethernet first", concat(prefix(netpolicy.RuleMetadata), attr(nfulaPayload, eth)), Denial{netpolicy.RuleMetadata, "tcp", netip.MustParseAddrPort("169.254.169.254:80")}, true},
		{"ipv6 udp", concat(prefix(netpolicy.RuleOtherResolver), attr(nfulaPayload, ipv6)), Denial{netpolicy.RuleOtherResolver, "udp", netip.MustParseAddrPort("[fd00:ec2::254]:53")}, true},
		{"ethernet first, ipv6", concat(prefix(netpolicy.RuleOtherResolver), attr(nfulaPayload, eth6)), Denial{netpolicy.RuleOtherResolver, "udp", netip.MustParseAddrPort("[fd00:ec2::254]:53")}, true},
		{"bad ipv4 checksum", concat(prefix(netpolicy.RuleMetadata), attr(nfulaPayload, badsum)), Denial{}, false},
		{"not ours", concat(attr(nfulaPrefix, []byte("other: x\x00")), attr(nfulaPayload, ipv4)), Denial{}, false},
		{"no payload", concat(prefix(netpolicy.RuleDefaultDeny)), Denial{}, false},
		{"short payload", concat(prefix(netpolicy.RuleDefaultDeny), attr(nfulaPayload, ipv4[:10])), Denial{}, false},
		{"bad attribute length", []byte{0xff, 0xff, 9, 0}, Denial{}, false},
	}
	for _, tc := range cases {
		got, ok := ParseDenial(tc.attrs)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// FuzzParseDenial: nothing in a log message crashes the reader.
func FuzzParseDenial(f *testing.F) {
	f.Add(concat(attr(nfulaPrefix, []byte(netpolicy.LogPrefix+"x\x00")), attr(nfulaPayload, []byte{0x45, 0, 0, 20})))
	f.Add([]byte{8, 0, 9, 0, 0x60, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseDenial(b)
		netlinkMessages(b)
	})
}

func checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}
