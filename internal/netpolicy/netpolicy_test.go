package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/policy"
)

func profile(egress string, allow ...policy.EgressRule) *policy.Profile {
	p := &policy.Profile{}
	p.Network.Egress, p.Network.Allow = egress, allow
	return p
}

func TestCompileAndDecide(t *testing.T) {
	pl, err := Compile(profile(policy.EgressAllowlist,
		policy.EgressRule{CIDR: "10.203.7.1/32", Ports: []int{8443, 443}},
		policy.EgressRule{CIDR: "192.168.0.0/16"},
		policy.EgressRule{Host: "api.github.com", Ports: []int{443}},
		policy.EgressRule{CIDR: "169.254.170.2/32", Ports: []int{80}},
		policy.EgressRule{CIDR: "10.9.0.0/16", Ports: []int{53, 443}},
		policy.EgressRule{Host: "*.Example.COM."},
	))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		addr  string
		port  int
		allow bool
		rule  string
	}{
		{"10.203.7.1", 443, true, "allow[0] 10.203.7.1/32 ports [443 8443]"},
		{"10.203.7.1", 80, false, "default deny"},
		{"10.203.7.2", 443, false, "default deny"},
		{"192.168.4.5", 22, true, "allow[1] 192.168.0.0/16"},
		{"169.254.169.254", 80, false, "metadata address"},
		{"169.254.170.2", 80, true, "allow[3] 169.254.170.2/32 ports [80]"}, // named exactly
		{"::ffff:10.203.7.1", 443, true, "allow[0] 10.203.7.1/32 ports [443 8443]"},
		{"fd00:ec2::254", 80, false, "metadata address"},
		// DNS goes to the pod's resolver only, unless a CIDR rule lists 53.
		{"192.168.4.5", 53, false, "dns to another resolver"},
		{"10.9.1.1", 53, true, "allow[4] 10.9.0.0/16 ports [53 443]"},
		// Host rules allow what the resolver put in their sets.
		{"203.0.113.7", 443, true, "allow[2] host api.github.com ports [443]"},
		{"203.0.113.7", 80, false, "default deny"},
		{"2001:db8::7", 80, true, "allow[5] host *.example.com"},
		{"203.0.113.8", 443, false, "default deny"},
		// A resolved metadata address stays denied.
		{"169.254.169.254", 443, false, "metadata address"},
	}
	resolved := func(r Rule, a netip.Addr) bool {
		switch r.Host {
		case "api.github.com":
			return a == netip.MustParseAddr("203.0.113.7") || a == netip.MustParseAddr("169.254.169.254")
		case "*.example.com":
			return a == netip.MustParseAddr("2001:db8::7")
		}
		return false
	}
	for _, tc := range cases {
		allow, rule := pl.Decide(netip.MustParseAddr(tc.addr), tc.port, resolved)
		if allow != tc.allow || rule != tc.rule {
			t.Errorf("%s:%d: got %v %q, want %v %q", tc.addr, tc.port, allow, rule, tc.allow, tc.rule)
		}
	}
	if h := pl.Hosts(); len(h) != 2 || h[0].Host != "api.github.com" || h[1].Host != "*.example.com" {
		t.Errorf("hosts %+v", h)
	}
	if n := strings.Join(pl.HostNames(), " "); n != "api.github.com *.example.com" {
		t.Errorf("host names %q", n)
	}
	if n := strings.Join(pl.DeniedNames(), " "); n != "169.254.169.254 100.100.100.200 168.63.129.16 fd00:ec2::254 fd20:ce::254" {
		t.Errorf("denied %q", n)
	}
	rs := pl.Ruleset("eth0")
	for _, want := range []string{
		`type filter hook egress device "eth0" priority 0; policy drop;`,
		`ip daddr 169.254.169.254 counter drop comment "metadata"`,
		`ip6 daddr fd00:ec2::254 counter drop comment "metadata"`,
		`ip daddr 10.203.7.1/32 tcp dport { 443, 8443 } accept`,
		`ip daddr 10.203.7.1/32 udp dport { 443, 8443 } accept`,
		`ip daddr 192.168.0.0/16 accept`,
		`counter drop comment "default deny"`,
		"ether type arp accept",
		"set host4_2 {\n\t\ttype ipv4_addr; flags timeout;",
		"set host6_5 {\n\t\ttype ipv6_addr; flags timeout;",
		`ip daddr @host4_2 tcp dport { 443 } accept comment "allow[2] host api.github.com ports [443]"`,
		`ip6 daddr @host6_5 accept comment "allow[5] host *.example.com"`,
		`udp dport 53 counter drop comment "dns to another resolver"`,
		`tcp dport 53 counter drop comment "dns to another resolver"`,
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "169.254.170.2 counter drop") {
		t.Error("a metadata address the role names must not be dropped")
	}
	// The metadata drops come before any allow rule, and the DNS drop
	// before every rule but the one that lists port 53.
	if strings.Index(rs, "metadata") > strings.Index(rs, "allow[0]") {
		t.Error("metadata drops must precede allow rules")
	}
	if strings.Index(rs, "allow[4]") > strings.Index(rs, "another resolver") || strings.Index(rs, "another resolver") > strings.Index(rs, "allow[0]") {
		t.Errorf("DNS drop out of place:\n%s", rs)
	}
}

func TestOpenAndNone(t *testing.T) {
	open, _ := Compile(profile(policy.EgressOpen))
	if ok, rule := open.Decide(netip.MustParseAddr("8.8.8.8"), 53, nil); !ok || rule != "egress open" {
		t.Errorf("open: %v %s", ok, rule)
	}
	if ok, _ := open.Decide(netip.MustParseAddr("169.254.169.254"), 80, nil); ok {
		t.Error("open egress must still deny metadata")
	}
	if rs := open.Ruleset("eth0"); !strings.Contains(rs, "policy accept;") || strings.Contains(rs, "default deny") {
		t.Errorf("open ruleset:\n%s", rs)
	}
	none, _ := Compile(profile(policy.EgressNone))
	if none.Enforced {
		t.Error("egress none has no interface to filter")
	}
	// A broad rule does not name the metadata address.
	broad, _ := Compile(profile(policy.EgressAllowlist, policy.EgressRule{CIDR: "0.0.0.0/0"}))
	if ok, _ := broad.Decide(netip.MustParseAddr("169.254.169.254"), 80, nil); ok {
		t.Error("0.0.0.0/0 must not open the metadata address")
	}
}

func TestMatchHost(t *testing.T) {
	pl, err := Compile(profile(policy.EgressAllowlist,
		policy.EgressRule{Host: "api.github.com", Ports: []int{443}},
		policy.EgressRule{Host: "*.pkg.dev"},
		policy.EgressRule{Host: "pkg.dev", Ports: []int{80}},
	))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		rule string // "" for no match
	}{
		{"api.github.com", "allow[0] host api.github.com ports [443]"},
		{"API.GitHub.com.", "allow[0] host api.github.com ports [443]"},
		{"x.api.github.com", ""},
		{"github.com", ""},
		{"a.pkg.dev", "allow[1] host *.pkg.dev"},
		{"a.b.pkg.dev", "allow[1] host *.pkg.dev"},
		{"pkg.dev", "allow[2] host pkg.dev ports [80]"},
		{"evilpkg.dev", ""},
		{".pkg.dev", ""},
		{"", ""},
		{".", ""},
	}
	for _, tc := range cases {
		r, ok := pl.MatchHost(tc.name)
		if ok != (tc.rule != "") || r.Name != tc.rule {
			t.Errorf("%q: got %v %q, want %q", tc.name, ok, r.Name, tc.rule)
		}
	}
}

func TestElements(t *testing.T) {
	pl, _ := Compile(profile(policy.EgressAllowlist, policy.EgressRule{Host: "a.test"}))
	got := pl.Elements(pl.Hosts()[0], []netip.Addr{netip.MustParseAddr("::ffff:192.0.2.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("192.0.2.2")}, 90*time.Second)
	want := `add element netdev agentbox host4_0 { 192.0.2.1 timeout 90s, 192.0.2.2 timeout 90s }
delete element netdev agentbox host4_0 { 192.0.2.1, 192.0.2.2 }
add element netdev agentbox host4_0 { 192.0.2.1 timeout 90s, 192.0.2.2 timeout 90s }
add element netdev agentbox host6_0 { 2001:db8::1 timeout 90s }
delete element netdev agentbox host6_0 { 2001:db8::1 }
add element netdev agentbox host6_0 { 2001:db8::1 timeout 90s }
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if pl.Elements(pl.Hosts()[0], nil, time.Minute) != "" {
		t.Error("no addresses, no commands")
	}
}

func TestResolutions(t *testing.T) {
	pl, _ := Compile(profile(policy.EgressAllowlist, policy.EgressRule{Host: "a.test", Ports: []int{443}}, policy.EgressRule{Host: "b.test"}))
	now := time.Unix(1000, 0)
	tab := NewResolutions(func() time.Time { return now })
	a, b := pl.Hosts()[0], pl.Hosts()[1]
	x := netip.MustParseAddr("192.0.2.1")
	tab.Add(a, []netip.Addr{netip.MustParseAddr("::ffff:192.0.2.1")}, time.Minute)
	if ok, rule := pl.Decide(x, 443, tab.Has); !ok || rule != a.Name {
		t.Fatalf("resolved address: %v %s", ok, rule)
	}
	if tab.Has(b, x) {
		t.Error("an address belongs to the rule whose name resolved to it")
	}
	y := netip.MustParseAddr("192.0.2.2")
	if left := tab.Remaining(a, []netip.Addr{x}); left != 59*time.Second {
		t.Errorf("remaining %v", left)
	}
	if left := tab.Remaining(a, []netip.Addr{x, y}); left != 0 {
		t.Errorf("an address not in the set: remaining %v", left)
	}
	now = now.Add(time.Minute)
	if left := tab.Remaining(a, []netip.Addr{x}); left != 0 {
		t.Errorf("expired: remaining %v", left)
	}
	if ok, rule := pl.Decide(x, 443, tab.Has); ok || rule != RuleDefaultDeny {
		t.Errorf("expired address: %v %s", ok, rule)
	}
}

func TestParseCounters(t *testing.T) {
	listing := `table netdev agentbox {
	set host4_0 {
		type ipv4_addr
		flags timeout
		elements = { 10.0.0.1 timeout 5m expires 4m }
	}
	chain egress {
		type filter hook egress device "eth0" priority filter; policy drop;
		ip daddr 169.254.169.254 counter packets 2 bytes 120 drop comment "metadata"
		ip6 daddr fd00:ec2::254 counter packets 1 bytes 80 drop comment "metadata"
		udp dport 53 counter packets 0 bytes 0 drop comment "dns to another resolver"
		ip daddr @host4_0 tcp dport { 443 } accept comment "allow[0] host a.test ports [443]"
		counter packets 7 bytes 420 drop comment "default deny"
	}
}`
	got := ParseCounters(listing)
	want := map[string]Counter{"metadata": {3, 200}, "dns to another resolver": {0, 0}, "default deny": {7, 420}}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
}
