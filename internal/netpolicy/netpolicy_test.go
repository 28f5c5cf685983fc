package netpolicy

import (
	"fmt"
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
		policy.EgressRule{Host: "*.Example.COM.", Ports: []int{443, 80}},
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
		// Host rules open no address on the pod's interface: their names
		// go to the gateway.
		{"203.0.113.7", 443, false, "default deny"},
		{"2001:db8::7", 80, false, "default deny"},
		{"169.254.169.254", 443, false, "metadata address"},
	}
	for _, tc := range cases {
		allow, rule := pl.Decide(netip.MustParseAddr(tc.addr), tc.port)
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
		`udp dport 53 counter drop comment "dns to another resolver"`,
		`tcp dport 53 counter drop comment "dns to another resolver"`,
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "host") || strings.Contains(rs, "set ") {
		t.Errorf("a host rule must open nothing in the ruleset:\n%s", rs)
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
	if ok, rule := open.Decide(netip.MustParseAddr("8.8.8.8"), 53); !ok || rule != "egress open" {
		t.Errorf("open: %v %s", ok, rule)
	}
	if ok, _ := open.Decide(netip.MustParseAddr("169.254.169.254"), 80); ok {
		t.Error("open egress must still deny metadata")
	}
	if rs := open.Ruleset("eth0"); !strings.Contains(rs, "policy accept;") || strings.Contains(rs, "default deny") {
		t.Errorf("open ruleset:\n%s", rs)
	}
	none, _ := Compile(profile(policy.EgressNone))
	if none.Enforced {
		t.Error("egress none has no interface to filter")
	}
	// Under egress none with a port for the node's port-forward, the
	// sandbox keeps its interface, and every packet it sends is dropped.
	nonePF := profile(policy.EgressNone)
	nonePF.Network.PortForward = []int{8080}
	kept, _ := Compile(nonePF)
	if !kept.Enforced || kept.DefaultAccept || kept.Resolver || len(kept.Allow) > 0 || kept.Mode() != policy.EgressNone {
		t.Errorf("egress none, port-forward: %+v (%s)", kept, kept.Mode())
	}
	if ok, _ := kept.Decide(netip.MustParseAddr("10.0.0.1"), 80); ok {
		t.Error("egress none with port-forward allowed a packet")
	}
	if rs := kept.Ruleset("eth0"); !strings.Contains(rs, "policy drop;") || !strings.Contains(rs, "default deny") || strings.Contains(rs, "dport 53") {
		t.Errorf("egress none with port-forward, ruleset:\n%s", rs)
	}
	// A broad rule does not name the metadata address.
	broad, _ := Compile(profile(policy.EgressAllowlist, policy.EgressRule{CIDR: "0.0.0.0/0"}))
	if ok, _ := broad.Decide(netip.MustParseAddr("169.254.169.254"), 80); ok {
		t.Error("0.0.0.0/0 must not open the metadata address")
	}
}

func TestMatchHost(t *testing.T) {
	pl, err := Compile(profile(policy.EgressAllowlist,
		policy.EgressRule{Host: "api.github.com", Ports: []int{443}},
		policy.EgressRule{Host: "*.pkg.dev", Ports: []int{443}},
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
		{"a.pkg.dev", "allow[1] host *.pkg.dev ports [443]"},
		{"a.b.pkg.dev", "allow[1] host *.pkg.dev ports [443]"},
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

func TestHostRuleNeedsPorts(t *testing.T) {
	_, err := Compile(profile(policy.EgressAllowlist, policy.EgressRule{Host: "a.test"}))
	if err == nil || !strings.Contains(err.Error(), "network.allow[0]: host a.test names no ports") {
		t.Fatalf("got %v", err)
	}
}

func TestResolutions(t *testing.T) {
	pl, _ := Compile(profile(policy.EgressAllowlist, policy.EgressRule{Host: "a.test", Ports: []int{443}}, policy.EgressRule{Host: "*.b.test", Ports: []int{443}}))
	now := time.Unix(1000, 0)
	tab := NewResolutions(func() time.Time { return now })
	a, b := pl.Hosts()[0], pl.Hosts()[1]
	x, y := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	tab.Add(a, "a.test", []netip.Addr{netip.MustParseAddr("::ffff:192.0.2.1")}, time.Minute)
	if got := tab.Get(a, "a.test"); len(got) != 1 || got[0] != x {
		t.Fatalf("get: %v", got)
	}
	if tab.Get(b, "a.test") != nil || tab.Get(a, "c.test") != nil {
		t.Error("an answer belongs to its rule and name")
	}
	if left := tab.Remaining(a, "a.test", []netip.Addr{x}); left != time.Minute {
		t.Errorf("remaining %v", left)
	}
	if left := tab.Remaining(a, "a.test", []netip.Addr{x, y}); left != 0 {
		t.Errorf("an address not in the answer: remaining %v", left)
	}
	now = now.Add(time.Minute)
	if left := tab.Remaining(a, "a.test", []netip.Addr{x}); left != 0 || tab.Get(a, "a.test") != nil {
		t.Errorf("expired: remaining %v", left)
	}
	// The agent picks names under a wildcard: the table stays bounded.
	for i := 0; i < 3*maxResolutions; i++ {
		tab.Add(b, fmt.Sprintf("n%d.b.test", i), []netip.Addr{y}, time.Hour)
	}
	if n := len(tab.m); n > maxResolutions {
		t.Errorf("%d entries", n)
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

func TestCompileInspected(t *testing.T) {
	p := &policy.Profile{
		Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
			{Host: "a.example", Ports: []int{443}},
			{Host: "*.api.example", Ports: []int{443}},
			{Host: "b.example", Ports: []int{443}, HTTP: &policy.HTTPRule{Methods: []string{"GET"}}},
			{Host: "c.example", Ports: []int{443}},
		}},
		Credentials: policy.CredentialsProfile{Secrets: []policy.Secret{
			{Env: "K", File: "/k", Inject: &policy.Inject{Host: "v1.api.example", Header: "x-api-key"}},
			{Env: "E", File: "/e"},
		}},
	}
	pl, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	var inspected []bool
	for _, r := range pl.Allow {
		inspected = append(inspected, r.Inspect)
	}
	if fmt.Sprint(inspected) != "[false true true false]" || !pl.Inspected() {
		t.Fatalf("inspected %v", inspected)
	}
	if len(pl.Injects) != 1 || pl.Injects[0] != (Inject{Host: "v1.api.example", Header: "X-Api-Key", Format: "{secret}", Env: "K", File: "/k"}) {
		t.Fatalf("injects %+v", pl.Injects)
	}
	p.Credentials.Secrets[0].Inject.Host = "elsewhere.example"
	if _, err := Compile(p); err == nil || !strings.Contains(err.Error(), "no host rule allows") {
		t.Fatalf("an inject no rule allows: %v", err)
	}
}

func TestQuarantineRuleset(t *testing.T) {
	rs := QuarantineRuleset([]string{"eth0", "agentbox-dns"})
	for _, want := range []string{
		"table netdev agentbox\ndelete table netdev agentbox\n",
		"chain quarantine0 {\n\t\ttype filter hook egress device \"eth0\" priority 0; policy drop;",
		"chain quarantine1 {\n\t\ttype filter hook egress device \"agentbox-dns\" priority 0; policy drop;",
		"counter drop comment \"quarantine\"",
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "accept") {
		t.Errorf("a quarantine accepts something:\n%s", rs)
	}
}
