package netpolicy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// An IPv6 address that carries an IPv4 one is decided by that address
// too: on a NAT64 cluster, 64:ff9b::7f00:1 is the node's loopback.
func TestRefuseEmbeddedIPv4(t *testing.T) {
	node := netip.MustParseAddr("198.51.100.7")
	d := Destinations{Local: func(a netip.Addr) (bool, error) { return a == node, nil }}
	for addr, want := range map[string]string{
		"64:ff9b::7f00:1":          "embeds 127.0.0.1 (NAT64 64:ff9b::/96): loopback",
		"64:ff9b::a9fe:a9fe":       "embeds 169.254.169.254",
		"64:ff9b::c633:6407":       "embeds 198.51.100.7 (NAT64 64:ff9b::/96): the node's own address",
		"2002:a00:1::1":            "embeds 10.0.0.1 (6to4 2002::/16): private",
		"::ffff:10.0.0.1":          "private (RFC 1918)",
		"::10.0.0.1":               "embeds 10.0.0.1 (IPv4-compatible ::/96)",
		"2001:0:1:2:3:4:f5ff:fffe": "embeds 10.0.0.1 (Teredo 2001::/32)",
		"64:ff9b::c000:20a":        "", // 192.0.2.10: public by this check
		"2606:4700::1":             "",
		"::1":                      "loopback",
	} {
		got := d.Refuse(Rule{Name: "r"}, netip.MustParseAddr(addr))
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", addr, got, want)
		}
	}
	// allowPrivate opens them, as it opens the IPv4 address.
	if got := d.Refuse(Rule{AllowPrivate: true}, netip.MustParseAddr("64:ff9b::a00:1")); got != "" {
		t.Errorf("allowPrivate: %q", got)
	}
}

// The node's own addresses are asked for at each decision; an address the
// kernel cannot be asked about is refused, never let through.
func TestRefuseAsksTheKernelEachTime(t *testing.T) {
	vip := netip.MustParseAddr("203.0.113.9")
	local := false
	d := Destinations{Local: func(a netip.Addr) (bool, error) {
		if a == netip.MustParseAddr("203.0.113.10") {
			return false, errors.New("netlink: permission denied")
		}
		return local && a == vip, nil
	}}
	if got := d.Refuse(Rule{}, vip); got != "" {
		t.Fatalf("before the node has it: %q", got)
	}
	local = true
	if got := d.Refuse(Rule{}, vip); !strings.Contains(got, "the node's own address") {
		t.Fatalf("after the node gained it: %q", got)
	}
	if got := d.Refuse(Rule{}, netip.MustParseAddr("203.0.113.10")); !strings.Contains(got, "cannot tell whether the node routes it") {
		t.Fatalf("an error: %q", got)
	}
}
