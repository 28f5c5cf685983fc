package policy

// Matching a request against what a role allows: host names, paths and
// capabilities.

import (
	"sort"
	"strings"
)

// hostAllowed says whether a host rule of the profile allows name (the
// gateway's matching: exact, or "*.suffix" for the names below suffix).
func (p *Profile) hostAllowed(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, r := range p.Network.Allow {
		if h := strings.TrimSuffix(strings.ToLower(r.Host), "."); h != "" && HostMatches(h, name) {
			return true
		}
	}
	return false
}

// HostMatches says whether a host rule's pattern (lower case, no trailing
// dot) matches name: the name itself, or "*.suffix" for the names below
// suffix. The resolver, the gateway and validation decide by it alike.
func HostMatches(pattern, name string) bool {
	if suffix, wild := strings.CutPrefix(pattern, "*"); wild {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return name == pattern
}

// CanonicalPath reports whether p (decoded, starting with '/') has no '.',
// '..' or empty segments: the path that is checked is the path the server
// sees. A trailing '/' is allowed.
func CanonicalPath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || (s == "" && i != len(segs)-1) {
			return false
		}
	}
	return true
}

// PathAllowed says whether the decoded, canonical path p is one of the
// patterns (exact, or a prefix ending in '*'); no patterns allow any.
func PathAllowed(patterns []string, p string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, pt := range patterns {
		if prefix, ok := strings.CutSuffix(pt, "*"); ok {
			if strings.HasPrefix(p, prefix) {
				return true
			}
		} else if p == pt {
			return true
		}
	}
	return false
}

// CapabilityName spells a capability as the OCI spec does ("net_admin",
// "NET_ADMIN" and "CAP_NET_ADMIN" are CAP_NET_ADMIN), and reports whether
// it is a Linux capability.
func CapabilityName(c string) (string, bool) {
	name := strings.ToUpper(c)
	if !strings.HasPrefix(name, "CAP_") {
		name = "CAP_" + name
	}
	return name, knownCapabilities[name]
}

// AllCapabilities lists every Linux capability agentbox knows, sorted.
func AllCapabilities() []string {
	out := make([]string, 0, len(knownCapabilities))
	for c := range knownCapabilities {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}
