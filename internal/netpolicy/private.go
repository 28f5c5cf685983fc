package netpolicy

import (
	"net/netip"
)

// Private destinations: what a host rule's answer may not open unless the
// rule says allowPrivate. A name is the agent's to choose among the
// allowed ones, and DNS answers are whatever a name's owner says: without
// this, an allowed name (or a CNAME it points to) resolving to 127.0.0.1,
// the node's address or a pod IP would open it.
var privateRanges = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (this host)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (ULA)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64"},
}

// Destinations decides which answered addresses a host rule may open.
type Destinations struct {
	// Node are the node's own addresses.
	Node []netip.Addr
	// Cluster are the cluster's pod and service ranges, and any other
	// range the admin names.
	Cluster []netip.Prefix
	// Link are the addresses of the pod's resolver link.
	Link []netip.Addr
}

// Refuse returns why rule r may not open a (or "" when it may). The
// resolver link is refused whatever the rule says; the node's own
// addresses, the cluster's ranges and the private ranges unless the rule
// sets allowPrivate (a CIDR rule can name any of them too).
func (d Destinations) Refuse(r Rule, a netip.Addr) string {
	a = a.Unmap()
	for _, l := range d.Link {
		if l.Unmap() == a {
			return "the pod's resolver link"
		}
	}
	if r.AllowPrivate {
		return ""
	}
	const optIn = " (the rule does not set allowPrivate)"
	for _, n := range d.Node {
		if n.Unmap() == a {
			return "the node's own address" + optIn
		}
	}
	for _, p := range d.Cluster {
		if p.Contains(a) {
			return "the cluster's range " + p.String() + optIn
		}
	}
	for _, p := range privateRanges {
		if p.prefix.Contains(a) {
			return p.why + " " + p.prefix.String() + optIn
		}
	}
	return ""
}
