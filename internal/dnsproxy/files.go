package dnsproxy

// The files a container reads its resolver and names from: resolv.conf
// naming the pod's resolver, and hosts naming the gateway.

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"

	"agentbox.dev/agentbox/internal/netpolicy"
)

// ResolvConf renders the pod's resolv.conf: the resolver as its only
// nameserver, keeping the search domains and options of the one it
// replaces (a Kubernetes pod's cluster domains).
func ResolvConf(original []byte, resolver netip.Addr) []byte {
	var b strings.Builder
	b.WriteString("# agentbox: names resolve through the pod's resolver, which answers only what its role allows.\n")
	fmt.Fprintf(&b, "nameserver %s\n", resolver)
	for _, line := range strings.Split(string(original), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "search" || f[0] == "domain" || f[0] == "options") {
			b.WriteString(strings.Join(f, " ") + "\n")
		}
	}
	return []byte(b.String())
}

// Hosts is a container's /etc/hosts with the host rules' exact names
// (names, not patterns) mapped to the egress gateway's address, after what
// the pod's own hosts file says (original; localhost entries if it has
// none). The answer is the one the resolver gives for them, without the
// round trip: the gateway decides by the name the agent sends (SNI, Host)
// and dials what it resolves itself, so the address only brings the
// connection to the gateway. A name the original maps already keeps that
// entry first (the pod author's hostAliases); a name that is not a plain
// host name is left to the resolver.
func Hosts(original []byte, gateway netip.Addr, names []string) []byte {
	var b strings.Builder
	if len(bytes.TrimSpace(original)) == 0 {
		b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	} else {
		b.Write(original)
		if original[len(original)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	plain := PlainNames(names)
	if len(plain) == 0 || !gateway.IsValid() {
		return []byte(b.String())
	}
	b.WriteString("# agentbox: the role's host rules, reached through the pod's egress gateway\n")
	// glibc reads at most a few hundred aliases per line: one name a line.
	for _, n := range plain {
		fmt.Fprintf(&b, "%s\t%s\n", gateway, n)
	}
	return []byte(b.String())
}

// PlainNames are the names among a plan's host rules that a hosts file can
// hold: lower case, without the trailing dot, once each; patterns and
// addresses left out.
func PlainNames(names []string) []string {
	var plain []string
	seen := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSuffix(strings.ToLower(n), ".")
		if n == "" || seen[n] || !plainHostName(n) {
			continue
		}
		seen[n] = true
		plain = append(plain, n)
	}
	return plain
}

// plainHostName: dot-separated labels of letters, digits, '-' and '_',
// each 1-63 bytes, at most 253 in all (no pattern, no address).
func plainHostName(n string) bool {
	if len(n) > 253 {
		return false
	}
	if _, err := netip.ParseAddr(n); err == nil {
		return false
	}
	for _, label := range strings.Split(n, ".") {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		var sb strings.Builder
		if _, ok := netpolicy.AppendHostLabel(&sb, []byte(label)); !ok {
			return false
		}
	}
	return true
}
