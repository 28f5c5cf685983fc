package netpolicy

import (
	"fmt"
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
	// Local says whether the node's kernel would deliver a to the node
	// itself (a route of type local: its own addresses, a VIP added to an
	// interface, a local route). It is asked at each decision, never
	// taken from a list at start: an address the node gains while a
	// sandbox runs is its own from then on.
	// An error (the kernel could not be asked) refuses the address.
	Local func(netip.Addr) (bool, error)
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
//
// An IPv6 address that carries an IPv4 one (NAT64 64:ff9b::/96, 6to4
// 2002::/16, IPv4-compatible ::a.b.c.d, Teredo's client) is decided by
// the IPv4 address too: on a NAT64 cluster 64:ff9b::7f00:1 is 127.0.0.1.
func (d Destinations) Refuse(r Rule, a netip.Addr) string {
	a = a.Unmap()
	if why := d.refuse(r, a); why != "" {
		return why
	}
	if v4, how, ok := EmbeddedIPv4(a); ok {
		if why := d.refuse(r, v4); why != "" {
			return fmt.Sprintf("%s embeds %s (%s): %s", a, v4, how, why)
		}
	}
	return ""
}

func (d Destinations) refuse(r Rule, a netip.Addr) string {
	for _, l := range d.Link {
		if l.Unmap() == a {
			return "the pod's resolver link"
		}
	}
	if r.AllowPrivate {
		return ""
	}
	const optIn = " (the rule does not set allowPrivate)"
	if d.Local != nil {
		switch local, err := d.Local(a); {
		case err != nil:
			return "cannot tell whether the node routes it to itself: " + err.Error()
		case local:
			return "the node's own address (the node's kernel routes it locally)" + optIn
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

// The IPv6 ranges that carry an IPv4 address, and where.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	v4Compat  = netip.MustParsePrefix("::/96")
	teredo    = netip.MustParsePrefix("2001::/32")
)

// EmbeddedIPv4 is the IPv4 address an IPv6 address carries, and by which
// scheme; false for one that carries none (an IPv4 address included).
func EmbeddedIPv4(a netip.Addr) (netip.Addr, string, bool) {
	if !a.Is6() || a.Is4In6() {
		return netip.Addr{}, "", false
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), "NAT64 64:ff9b::/96", true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), "6to4 2002::/16", true
	case teredo.Contains(a):
		// The client's address, inverted (RFC 4380).
		return netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}), "Teredo 2001::/32", true
	case v4Compat.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return netip.AddrFrom4([4]byte(b[12:16])), "IPv4-compatible ::/96", true
	}
	return netip.Addr{}, "", false
}
