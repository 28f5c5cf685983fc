package config

// The network section's values, parsed: the upstream CA pool, the cluster
// prefixes, the resolver's addresses and its upstreams.

import (
	"crypto/x509"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// UpstreamRoots are the node's roots plus UpstreamCAFile's certificates.
func (e Egress) UpstreamRoots() (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if e.UpstreamCAFile == "" {
		return pool, nil
	}
	b, err := os.ReadFile(e.UpstreamCAFile)
	if err != nil {
		return nil, fmt.Errorf("egress.upstream_ca_file: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("egress.upstream_ca_file: %s holds no PEM certificate", e.UpstreamCAFile)
	}
	return pool, nil
}

// ClusterPrefixes parses ClusterCIDRs.
func (n Network) ClusterPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, c := range n.ClusterCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("network.cluster_cidrs[%d]: %q is not a CIDR", i, c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ResolverAddrs returns the resolver's address and the pod's peer address.
func (n Network) ResolverAddrs() (resolver, peer netip.Addr, err error) {
	a, err := netip.ParseAddr(n.ResolverAddress)
	if err != nil || !a.Is4() {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("network.resolver_address: %q is not an IPv4 address", n.ResolverAddress)
	}
	p := a.Next()
	if !p.IsValid() || !p.Is4() || p.As4()[3] == 0 || p.As4()[3] == 255 || a.As4()[3] == 0 {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("network.resolver_address: %s leaves no usable next address for the pod's side", a)
	}
	return a, p, nil
}

// UpstreamAddrs parses Upstreams, or reads resolvConf's nameservers when
// there are none.
func (n Network) UpstreamAddrs(resolvConf string) ([]netip.AddrPort, error) {
	list := n.Upstreams
	if len(list) == 0 {
		b, err := os.ReadFile(resolvConf)
		if err != nil {
			return nil, fmt.Errorf("network.upstreams is empty and %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "nameserver" {
				list = append(list, f[1])
			}
		}
	}
	var out []netip.AddrPort
	for i, u := range list {
		ap, err := parseUpstream(u)
		if err != nil {
			return nil, fmt.Errorf("network.upstreams[%d]: %w", i, err)
		}
		out = append(out, ap)
	}
	return out, nil
}

func parseUpstream(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(strings.Split(s, "%")[0])
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not an address or address:port", s)
	}
	return netip.AddrPortFrom(a, 53), nil
}
