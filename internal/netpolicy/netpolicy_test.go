package netpolicy

import (
	"net/netip"
	"strings"
	"testing"

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
	}
	for _, tc := range cases {
		allow, rule := pl.Decide(netip.MustParseAddr(tc.addr), tc.port)
		if allow != tc.allow || rule != tc.rule {
			t.Errorf("%s:%d: got %v %q, want %v %q", tc.addr, tc.port, allow, rule, tc.allow, tc.rule)
		}
	}
	if len(pl.Unresolved) != 1 || pl.Unresolved[0] != "api.github.com" {
		t.Errorf("unresolved %v", pl.Unresolved)
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
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "169.254.170.2 counter drop") {
		t.Error("a metadata address the role names must not be dropped")
	}
	// The metadata drops come before any allow rule.
	if strings.Index(rs, "metadata") > strings.Index(rs, "allow[0]") {
		t.Error("metadata drops must precede allow rules")
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
	// A broad rule does not name the metadata address.
	broad, _ := Compile(profile(policy.EgressAllowlist, policy.EgressRule{CIDR: "0.0.0.0/0"}))
	if ok, _ := broad.Decide(netip.MustParseAddr("169.254.169.254"), 80); ok {
		t.Error("0.0.0.0/0 must not open the metadata address")
	}
}
