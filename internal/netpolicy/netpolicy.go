// Package netpolicy compiles a role's network egress policy into an
// nftables ruleset for the pod's network namespace (a netdev table on the
// pod interface's egress hook: it filters what gVisor's netstack sends, in
// the host kernel, outside the sandbox), and decides connections the same
// way for the audit trail. Compiling and deciding are pure.
package netpolicy

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"agentbox.dev/agentbox/internal/policy"
)

// Table is the nftables table agentbox owns in a pod's network namespace.
const Table = "agentbox"

// MetadataAddresses are cloud metadata services, denied under every role
// unless a role names one exactly (a /32 or /128 allow rule).
var MetadataAddresses = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack...
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
}

// Rule is one compiled allow rule.
type Rule struct {
	Prefix netip.Prefix
	Ports  []int
	// Name describes the rule in records ("allow[2] 10.0.0.0/8:443").
	Name string
}

// Plan is a role's egress policy, compiled.
type Plan struct {
	// Enforced is false for egress none (the sandbox has no interface).
	Enforced bool
	// DefaultAccept is true for egress open.
	DefaultAccept bool
	Allow         []Rule
	// Denied are the metadata addresses the role does not name.
	Denied []netip.Addr
	// Unresolved are host-name rules, which allow nothing until names are
	// resolved for the pod.
	Unresolved []string
}

// Compile turns a profile's network section into a plan.
func Compile(p *policy.Profile) (*Plan, error) {
	pl := &Plan{}
	switch p.Network.Egress {
	case policy.EgressNone:
		return pl, nil
	case policy.EgressOpen:
		pl.Enforced, pl.DefaultAccept = true, true
	case policy.EgressAllowlist:
		pl.Enforced = true
	default:
		return nil, fmt.Errorf("egress %q", p.Network.Egress)
	}
	named := map[netip.Addr]bool{}
	for i, r := range p.Network.Allow {
		if r.Host != "" {
			pl.Unresolved = append(pl.Unresolved, r.Host)
			continue
		}
		pfx, err := netip.ParsePrefix(r.CIDR)
		if err != nil {
			return nil, fmt.Errorf("network.allow[%d]: %w", i, err)
		}
		pfx = pfx.Masked()
		if pfx.Bits() == pfx.Addr().BitLen() {
			named[pfx.Addr()] = true
		}
		ports := append([]int(nil), r.Ports...)
		sort.Ints(ports)
		name := fmt.Sprintf("allow[%d] %s", i, pfx)
		if len(ports) > 0 {
			name += fmt.Sprintf(" ports %v", ports)
		}
		pl.Allow = append(pl.Allow, Rule{Prefix: pfx, Ports: ports, Name: name})
	}
	for _, m := range MetadataAddresses {
		if !named[m] {
			pl.Denied = append(pl.Denied, m)
		}
	}
	return pl, nil
}

// Ruleset renders the plan for the pod interface iface, as `nft -f`
// input. It replaces any earlier agentbox table.
func (pl *Plan) Ruleset(iface string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s\ndelete table netdev %s\n", Table, Table)
	fmt.Fprintf(&b, "table netdev %s {\n\tchain egress {\n", Table)
	policy := "drop"
	if pl.DefaultAccept {
		policy = "accept"
	}
	fmt.Fprintf(&b, "\t\ttype filter hook egress device %q priority 0; policy %s;\n", iface, policy)
	// Address resolution must work for anything to.
	b.WriteString("\t\tether type arp accept\n")
	b.WriteString("\t\ticmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept\n")
	for _, a := range pl.Denied {
		fmt.Fprintf(&b, "\t\t%s daddr %s counter drop comment \"metadata\"\n", family(a), a)
	}
	for _, r := range pl.Allow {
		fam := family(r.Prefix.Addr())
		if len(r.Ports) == 0 {
			fmt.Fprintf(&b, "\t\t%s daddr %s accept comment %q\n", fam, r.Prefix, r.Name)
			continue
		}
		set := joinInts(r.Ports)
		fmt.Fprintf(&b, "\t\t%s daddr %s tcp dport { %s } accept comment %q\n", fam, r.Prefix, set, r.Name)
		fmt.Fprintf(&b, "\t\t%s daddr %s udp dport { %s } accept comment %q\n", fam, r.Prefix, set, r.Name)
	}
	if !pl.DefaultAccept {
		b.WriteString("\t\tcounter drop comment \"default deny\"\n")
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "ip"
	}
	return "ip6"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}

// Decide says what the ruleset does with a TCP or UDP packet to addr:port,
// and which rule decides, the way nftables walks the chain.
func (pl *Plan) Decide(addr netip.Addr, port int) (allow bool, rule string) {
	if !pl.Enforced {
		return false, "egress none"
	}
	addr = addr.Unmap()
	for _, a := range pl.Denied {
		if a == addr {
			return false, "metadata address"
		}
	}
	for _, r := range pl.Allow {
		if !r.Prefix.Contains(addr) {
			continue
		}
		if len(r.Ports) == 0 {
			return true, r.Name
		}
		for _, p := range r.Ports {
			if p == port {
				return true, r.Name
			}
		}
	}
	if pl.DefaultAccept {
		return true, "egress open"
	}
	return false, "default deny"
}
