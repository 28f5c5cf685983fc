// Package netpolicy compiles a role's network egress policy into an
// nftables ruleset for the pod's network namespace (a netdev table on the
// pod interface's egress hook: it filters what gVisor's netstack sends, in
// the host kernel, outside the sandbox), and decides connections the same
// way for the audit trail. Compiling and deciding are pure.
//
// Host rules open no address here: the pod's resolver answers their names
// with the egress gateway's address (on the resolver's link, not the pod's
// interface), and the gateway decides by name (internal/egressgw). An
// address is not an identity: many sites share one.
package netpolicy

import (
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"agentbox.dev/agentbox/internal/mcp"
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
	netip.MustParseAddr("168.63.129.16"),   // Azure WireServer
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
	netip.MustParseAddr("fd20:ce::254"),    // Google Cloud IPv6
}

// Rule is one compiled allow rule: a CIDR, or a host-name pattern that the
// egress gateway allows by name.
type Rule struct {
	// Prefix is the CIDR of a CIDR rule.
	Prefix netip.Prefix
	// Host is the name pattern of a host rule ("api.github.com",
	// "*.example.com"), lower case without a trailing dot.
	Host  string
	Ports []int
	// Name describes the rule in records ("allow[2] 10.0.0.0/8 ports [443]",
	// "allow[0] host api.github.com ports [443]").
	Name string
	// AllowPrivate: a host rule may open private destinations.
	AllowPrivate bool
	// Methods and Paths restrict a host rule's requests (policy.HTTPRule).
	Methods, Paths []string
	// Inspect: the gateway terminates this host rule's TLS to see each
	// request (it restricts methods or paths, or a secret is injected
	// toward a name it allows).
	Inspect bool
	// WebSocket: the rule's requests may upgrade to a WebSocket.
	WebSocket bool
	// Tools are what an api: mcp rule's MCP server may be asked (nil for
	// any other rule).
	Tools *mcp.Tools
	// API is the model API the host serves ("": none): its rule is
	// inspected and each model call recorded (mcp: an MCP server's).
	API string
}

// Plan is a role's egress policy, compiled.
type Plan struct {
	// Enforced is false for egress none (the sandbox has no interface),
	// unless the role names ports for the node's port-forward
	// (network.portForward): gVisor forwards only to a sandbox that keeps
	// its network stack on the pod's interface, so it keeps it, and every
	// packet it sends is dropped (a plan without rules, resolver or
	// default accept), replies to any connection from outside included.
	Enforced bool
	// DefaultAccept is true for egress open.
	DefaultAccept bool
	// Allow are the allow rules, in the role's order.
	Allow []Rule
	// Denied are the metadata addresses the role does not name.
	Denied []netip.Addr
	// Resolver is true for allowlist egress: the pod's names are resolved by
	// its own resolver, and DNS (port 53) to any other address is dropped
	// unless a CIDR rule lists port 53.
	Resolver bool
	// Injects are the role's secrets with inject, whose host rules are
	// inspected.
	Injects []Inject
	// Budget bounds the sandbox's calls to model hosts (the role's
	// limits.model), counted by the gateway.
	Budget policy.ModelBudget
	// MCPBudget bounds the sandbox's calls to each MCP server (the role's
	// limits.mcp), counted by the gateway.
	MCPBudget policy.MCPBudget
	// ModelAudit is what a model call's record keeps (the role's
	// audit.model): policy.ModelCalls, ModelDigests or ModelContent.
	ModelAudit string
}

// DNSPort is the port DNS to resolvers other than the pod's is dropped on.
const DNSPort = 53

// Compile turns a profile's network section into a plan.
func Compile(p *policy.Profile) (*Plan, error) {
	pl := &Plan{}
	switch p.Network.Egress {
	case policy.EgressNone:
		pl.Enforced = len(p.Network.PortForward) > 0
		return pl, nil
	case policy.EgressOpen:
		pl.Enforced, pl.DefaultAccept = true, true
	case policy.EgressAllowlist:
		pl.Enforced, pl.Resolver = true, true
	default:
		return nil, fmt.Errorf("egress %q", p.Network.Egress)
	}
	pl.Budget, pl.MCPBudget, pl.ModelAudit = p.Limits.Model, p.Limits.MCP, p.Audit.Model
	named := map[netip.Addr]bool{}
	for i, r := range p.Network.Allow {
		ports := append([]int(nil), r.Ports...)
		sort.Ints(ports)
		suffix := ""
		if len(ports) > 0 {
			suffix = fmt.Sprintf(" ports %v", ports)
		}
		if r.Host != "" {
			host := strings.TrimSuffix(strings.ToLower(r.Host), ".")
			if len(ports) == 0 {
				return nil, fmt.Errorf("network.allow[%d]: host %s names no ports: the egress gateway serves a host rule's listed ports", i, host)
			}
			rule := Rule{Host: host, Ports: ports, AllowPrivate: r.AllowPrivate, WebSocket: r.WebSocket, API: r.API,
				Name: fmt.Sprintf("allow[%d] host %s%s", i, host, suffix), Inspect: r.API != ""}
			if r.Tools != nil {
				rule.Tools = &mcp.Tools{Allow: sorted(r.Tools.Allow), Deny: sorted(r.Tools.Deny)}
			}
			if r.HTTP != nil {
				// Sorted: two versions of a role compare by content.
				rule.Methods, rule.Paths, rule.Inspect = sorted(r.HTTP.Methods), sorted(r.HTTP.Paths), true
			}
			pl.Allow = append(pl.Allow, rule)
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
		pl.Allow = append(pl.Allow, Rule{Prefix: pfx, Ports: ports, Name: fmt.Sprintf("allow[%d] %s%s", i, pfx, suffix)})
	}
	for _, sec := range p.Credentials.Secrets {
		if sec.Inject == nil || !pl.Resolver {
			continue
		}
		in := Inject{Host: strings.TrimSuffix(strings.ToLower(sec.Inject.Host), "."), Header: http.CanonicalHeaderKey(sec.Inject.Header),
			Format: sec.Inject.Format, Env: sec.Env, File: sec.File, Ref: sec.SecretRef, FromClaim: sec.FromClaim}
		if in.Format == "" {
			in.Format = policy.SecretToken
		}
		found := false
		for j := range pl.Allow {
			if pl.Allow[j].Host != "" && policy.HostMatches(pl.Allow[j].Host, in.Host) {
				// The first rule matching is the one the gateway decides by.
				pl.Allow[j].Inspect, found = true, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("credentials: the secret for %s: no host rule allows that name", in.Host)
		}
		pl.Injects = append(pl.Injects, in)
	}
	for _, m := range MetadataAddresses {
		if !named[m] {
			pl.Denied = append(pl.Denied, m)
		}
	}
	return pl, nil
}

// Hosts are the plan's host rules.
func (pl *Plan) Hosts() []Rule {
	var out []Rule
	for _, r := range pl.Allow {
		if r.Host != "" {
			out = append(out, r)
		}
	}
	return out
}

// HostPorts are the ports the host rules name, each once, in order: the
// gateway listens on each.
func (pl *Plan) HostPorts() []int {
	seen := map[int]bool{}
	var out []int
	for _, r := range pl.Hosts() {
		for _, p := range r.Ports {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// HostNames are the host rules' patterns, in order, for records and
// explanations.
func (pl *Plan) HostNames() []string {
	var out []string
	for _, r := range pl.Hosts() {
		out = append(out, r.Host)
	}
	return out
}

// DeniedNames are the denied metadata addresses as text.
func (pl *Plan) DeniedNames() []string {
	var out []string
	for _, a := range pl.Denied {
		out = append(out, a.String())
	}
	return out
}

// MatchHost returns the first host rule whose pattern matches name (any
// case, with or without the trailing dot). "*.example.com" matches names
// below example.com, not example.com itself.
func (pl *Plan) MatchHost(name string) (Rule, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" {
		return Rule{}, false
	}
	for _, r := range pl.Allow {
		if r.Host != "" && policy.HostMatches(r.Host, name) {
			return r, true
		}
	}
	return Rule{}, false
}

// Inspected says whether any host rule is inspected: the gateway needs its
// CA, and the sandbox trusts it.
func (pl *Plan) Inspected() bool {
	for _, r := range pl.Allow {
		if r.Inspect {
			return true
		}
	}
	return false
}

// AppendHostLabel appends label to b in lower case if every byte of it is
// one a host name's label is made of (letters, digits, '-', '_'), for the
// resolver and the gateway alike; otherwise it returns the first byte that
// is not, and b holds a part of the label.
func AppendHostLabel(b *strings.Builder, label []byte) (byte, bool) {
	for _, c := range label {
		switch {
		case c >= 'A' && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			return c, false
		}
	}
	return 0, true
}

// dnsExempt reports whether a CIDR rule lists the DNS port explicitly: DNS
// to that network is what the role asked for.
func (r Rule) dnsExempt() bool {
	if r.Host != "" {
		return false
	}
	for _, p := range r.Ports {
		if p == DNSPort {
			return true
		}
	}
	return false
}

// Ruleset renders the plan for the pod interface iface, as `nft -f`
// input. It replaces any earlier agentbox table.
func (pl *Plan) Ruleset(iface string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s\ndelete table netdev %s\n", Table, Table)
	fmt.Fprintf(&b, "table netdev %s {\n", Table)
	b.WriteString("\tchain egress {\n")
	policy := "drop"
	if pl.DefaultAccept {
		policy = "accept"
	}
	fmt.Fprintf(&b, "\t\ttype filter hook egress device %q priority 0; policy %s;\n", iface, policy)
	// Address resolution must work for anything to.
	b.WriteString("\t\tether type arp accept\n")
	b.WriteString("\t\ticmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept\n")
	for _, a := range pl.Denied {
		writeDrop(&b, fmt.Sprintf("%s daddr %s ", family(a), a), RuleMetadata, "metadata")
	}
	if pl.Resolver {
		for _, r := range pl.Allow {
			if r.dnsExempt() {
				writeAccept(&b, r, []int{DNSPort})
			}
		}
		for _, proto := range []string{"udp", "tcp"} {
			writeDrop(&b, fmt.Sprintf("%s dport %d ", proto, DNSPort), RuleOtherResolver, RuleOtherResolver)
		}
	}
	for _, r := range pl.Allow {
		if r.Host == "" {
			writeAccept(&b, r, r.Ports)
		}
	}
	if !pl.DefaultAccept {
		writeDrop(&b, "", RuleDefaultDeny, RuleDefaultDeny)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// QuarantineRuleset renders what a quarantined pod's namespace holds: on
// each of ifaces (the pod's interface, and the resolver's link when it has
// one) every packet the sandbox sends is dropped, counted and logged, ARP
// included. Like Ruleset it replaces the table in one transaction, so there
// is no moment with neither the role's rules nor these.
func QuarantineRuleset(ifaces []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s\ndelete table netdev %s\n", Table, Table)
	fmt.Fprintf(&b, "table netdev %s {\n", Table)
	for i, iface := range ifaces {
		fmt.Fprintf(&b, "\tchain quarantine%d {\n", i)
		fmt.Fprintf(&b, "\t\ttype filter hook egress device %q priority 0; policy drop;\n", iface)
		writeDrop(&b, "", RuleQuarantine, RuleQuarantine)
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// LogGroup is the nfnetlink_log group agentbox's drop rules log to, in the
// pod's network namespace (groups are per namespace).
const LogGroup = 7

// LogPrefix starts the prefix of every agentbox log rule; the rule's name
// follows.
const LogPrefix = "agentbox: "

// Rule names Decide reports besides allow rules.
const (
	RuleQuarantine    = "quarantine"
	RuleDefaultDeny   = "default deny"
	RuleMetadata      = "metadata address"
	RuleOtherResolver = "dns to another resolver"
	RuleOpen          = "egress open"
	RuleNone          = "egress none"
)

// LogRate bounds how many packets per second each kind of drop rule logs
// to LogGroup (for the trail); its counter counts them all.
const LogRate = "20/second burst 40 packets"

// writeDrop renders a drop rule for match: a rate-limited log line first
// (a limit that is over lets the packet fall through, so it cannot share
// the drop's line), then the counted drop.
func writeDrop(b *strings.Builder, match, rule, comment string) {
	fmt.Fprintf(b, "\t\t%slimit rate %s log prefix %q group %d\n", match, LogRate, LogPrefix+rule, LogGroup)
	fmt.Fprintf(b, "\t\t%scounter drop comment %q\n", match, comment)
}

// writeAccept renders the accept lines of a CIDR rule on ports (any port
// when empty).
func writeAccept(b *strings.Builder, r Rule, ports []int) {
	fam, daddr := family(r.Prefix.Addr()), r.Prefix.String()
	if len(ports) == 0 {
		fmt.Fprintf(b, "\t\t%s daddr %s accept comment %q\n", fam, daddr, r.Name)
		return
	}
	set := joinInts(ports)
	fmt.Fprintf(b, "\t\t%s daddr %s tcp dport { %s } accept comment %q\n", fam, daddr, set, r.Name)
	fmt.Fprintf(b, "\t\t%s daddr %s udp dport { %s } accept comment %q\n", fam, daddr, set, r.Name)
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

// Decide says what the ruleset does with a TCP or UDP packet to addr:port
// on the pod's interface, and which rule decides, the way nftables walks
// the chain. Host rules match no address: their names reach the gateway,
// over the resolver's link.
func (pl *Plan) Decide(addr netip.Addr, port int) (allow bool, rule string) {
	if !pl.Enforced {
		return false, RuleNone
	}
	addr = addr.Unmap()
	for _, a := range pl.Denied {
		if a == addr {
			return false, RuleMetadata
		}
	}
	matches := func(r Rule) bool { return r.Host == "" && r.Prefix.Contains(addr) }
	if pl.Resolver && port == DNSPort {
		for _, r := range pl.Allow {
			if r.dnsExempt() && matches(r) {
				return true, r.Name
			}
		}
		return false, RuleOtherResolver
	}
	for _, r := range pl.Allow {
		if !matches(r) {
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
		return true, RuleOpen
	}
	return false, RuleDefaultDeny
}

// Counter is what one kind of drop rule caught.
type Counter struct{ Packets, Bytes uint64 }

var counterRE = regexp.MustCompile(`counter packets (\d+) bytes (\d+) drop comment "([^"]*)"`)

// ParseCounters reads the drop counters from `nft list table` output,
// summed by the rules' comments ("metadata", "default deny", ...).
func ParseCounters(listing string) map[string]Counter {
	out := map[string]Counter{}
	for _, m := range counterRE.FindAllStringSubmatch(listing, -1) {
		p, err1 := strconv.ParseUint(m[1], 10, 64)
		b, err2 := strconv.ParseUint(m[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		c := out[m[3]]
		c.Packets += p
		c.Bytes += b
		out[m[3]] = c
	}
	return out
}
