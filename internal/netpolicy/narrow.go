package netpolicy

import (
	"fmt"
	"maps"
	"slices"

	"agentbox.dev/agentbox/internal/policy"
)

// Narrow is what a running sandbox whose egress is cur takes of next, its
// role's new version: whatever tightens it, never what loosens it. A rule
// next removes is gone; a rule next narrows (fewer ports, a smaller CIDR,
// an exact name under a pattern) is narrowed; a metadata address next
// denies is denied. What next would open that cur does not (a new rule,
// more ports, a wider range, egress open) is not applied: pending lists it,
// for new sandboxes. applied says what changed; live == cur when nothing
// did. A sandbox keeps the machinery it started with: a pod without a
// resolver and gateway (egress open) takes no host rule live.
func Narrow(cur, next *Plan) (live *Plan, applied, pending []string) {
	live, applied, pending = narrowRules(cur, next)
	if live != cur {
		var a, p []string
		live.Budget, a, p = narrowBudget(cur.Budget, next.Budget)
		applied, pending = append(applied, a...), append(pending, p...)
		live.MCPBudget, a, p = narrowMCPBudget(cur.MCPBudget, next.MCPBudget)
		applied, pending = append(applied, a...), append(pending, p...)
		// What a running sandbox's model calls record stays as it began
		// (a change is for new sandboxes); recording less loosens.
		live.ModelAudit = cur.ModelAudit
		if modelAuditRank[next.ModelAudit] < modelAuditRank[cur.ModelAudit] {
			pending = append(pending, "audit.model "+next.ModelAudit+" records less than "+cur.ModelAudit+" (loosens)")
		}
	}
	return live, applied, pending
}

// narrowBudget is the tighter of two model budgets, bound by bound: a
// lower bound applies at once, a higher one or none is pending.
func narrowBudget(cur, next policy.ModelBudget) (policy.ModelBudget, []string, []string) {
	var applied, pending []string
	out := cur
	for _, b := range []struct {
		name      string
		cur, next int64
		live      *int64
	}{{"tokens", cur.Tokens, next.Tokens, &out.Tokens}, {"requests", cur.Requests, next.Requests, &out.Requests},
		{"requests per minute", cur.RequestsPerMinute, next.RequestsPerMinute, &out.RequestsPerMinute},
		{"output cap", cur.MaxOutput, next.MaxOutput, &out.MaxOutput}} {
		switch {
		case b.next == b.cur:
		case b.next > 0 && (b.cur == 0 || b.next < b.cur):
			*b.live = b.next
			applied = append(applied, fmt.Sprintf("model %s bounded to %d", b.name, b.next))
		default:
			pending = append(pending, fmt.Sprintf("model %s bound %s (loosens)", b.name, map[bool]string{true: "removed", false: fmt.Sprint("raised to ", b.next)}[b.next == 0]))
		}
	}
	return out, applied, pending
}

func narrowRules(cur, next *Plan) (live *Plan, applied, pending []string) {
	if !cur.Enforced {
		if next.Enforced {
			pending = append(pending, "egress "+mode(next)+": the sandbox has no network interface (egress none); applies to new sandboxes")
		}
		return cur, nil, pending
	}
	live = &Plan{Enforced: true, DefaultAccept: cur.DefaultAccept, Resolver: cur.Resolver}
	// Denying more is tighter; a metadata address next names is pending.
	live.Denied = slices.Clone(cur.Denied)
	for _, a := range next.Denied {
		if !slices.Contains(live.Denied, a) {
			live.Denied = append(live.Denied, a)
			applied = append(applied, "metadata address "+a.String()+" denied")
		}
	}
	for _, a := range cur.Denied {
		if next.Enforced && !slices.Contains(next.Denied, a) {
			pending = append(pending, "metadata address "+a.String()+" allowed (loosens)")
		}
	}
	switch {
	case !next.Enforced:
		if len(cur.Allow) > 0 || cur.DefaultAccept {
			applied = append(applied, "egress none: every allow rule removed")
		}
		live.DefaultAccept, live.Allow = false, nil
		return live, applied, pending
	case cur.DefaultAccept && next.DefaultAccept:
		return live, applied, pending
	case !cur.DefaultAccept && next.DefaultAccept:
		pending = append(pending, "egress open (loosens)")
		live.Allow, live.Injects = slices.Clone(cur.Allow), slices.Clone(cur.Injects)
		return live, applied, pending
	case cur.DefaultAccept:
		// open -> allowlist: CIDR rules apply at once; host rules need
		// the resolver and gateway only a pod started under them has.
		live.DefaultAccept = false
		applied = append(applied, "egress open -> allowlist: default deny")
		for _, r := range next.Allow {
			if r.Host != "" {
				pending = append(pending, r.Name+": a host rule needs the pod's resolver and gateway; applies to new sandboxes")
				continue
			}
			live.Allow = append(live.Allow, r)
			applied = append(applied, r.Name+" allowed (within open)")
		}
		return live, applied, pending
	}
	// allowlist -> allowlist: each current rule keeps what next still
	// allows of it.
	for _, c := range cur.Allow {
		kept := false
		for _, n := range next.Allow {
			r, ok := intersect(c, n)
			if !ok {
				continue
			}
			kept = true
			live.Allow = append(live.Allow, r)
			if !sameRule(r, c) {
				applied = append(applied, fmt.Sprintf("%s narrowed to %s", c.Name, describeRule(r)))
			}
		}
		if !kept {
			applied = append(applied, c.Name+" removed")
		}
	}
	for _, n := range next.Allow {
		covered := false
		for _, c := range cur.Allow {
			if within(n, c) {
				covered = true
				break
			}
		}
		switch {
		case covered:
		case toolsDiffer(n, cur.Allow):
			pending = append(pending, n.Name+": its MCP tools differ from the running sandbox's; applies to new sandboxes")
		default:
			pending = append(pending, n.Name+" (loosens)")
		}
	}
	// The gateway injects a secret only toward a name the live rules
	// still allow; a new injection is pending (the sandbox may hold no
	// placeholder for it, nor trust the CA it needs).
	for _, in := range cur.Injects {
		if _, ok := live.MatchHost(in.Host); ok {
			live.Injects = append(live.Injects, in)
		} else {
			applied = append(applied, "no secret injected toward "+in.Host)
		}
	}
	for _, in := range next.Injects {
		if !slices.ContainsFunc(cur.Injects, in.Same) {
			pending = append(pending, "a secret injected toward "+in.Host)
		}
	}
	return live, applied, pending
}

// Mode is the plan's egress mode: none, allowlist or open.
func (pl *Plan) Mode() string { return mode(pl) }

func mode(p *Plan) string {
	switch {
	case !p.Enforced, !p.DefaultAccept && !p.Resolver:
		// Enforced without either: egress none on an interface kept for
		// port-forward.
		return string(policy.EgressNone)
	case p.DefaultAccept:
		return string(policy.EgressOpen)
	}
	return string(policy.EgressAllowlist)
}

// intersect is what rule c allows that n allows too, keeping c's
// inspection (a running sandbox trusts the CA it started with, or none);
// false when they share nothing.
func intersect(c, n Rule) (Rule, bool) {
	ports, ok := intersectPorts(c.Ports, n.Ports)
	if !ok {
		return Rule{}, false
	}
	r := c
	r.Ports, r.Name = ports, n.Name
	r.AllowPrivate = c.AllowPrivate && n.AllowPrivate
	r.WebSocket = c.WebSocket && n.WebSocket
	if r.Methods, r.Paths, ok = intersectHTTP(c, n); !ok {
		return Rule{}, false
	}
	// Methods and paths are seen only inspected: a rule that passed TLS
	// through is inspected from now on (its name then needs the
	// sandbox's CA: without one, the gateway refuses it, closed).
	r.Inspect = c.Inspect || len(r.Methods) > 0 || len(r.Paths) > 0
	switch {
	case c.Host != "" && n.Host != "":
		switch {
		case c.Host == n.Host, !isPattern(c.Host) && policy.HostMatches(n.Host, c.Host):
		case !isPattern(n.Host) && policy.HostMatches(c.Host, n.Host):
			r.Host = n.Host
		default:
			return Rule{}, false
		}
		return r, true
	case c.Host == "" && n.Host == "":
		switch {
		case c.Prefix.Bits() >= n.Prefix.Bits() && n.Prefix.Contains(c.Prefix.Addr()):
		case n.Prefix.Bits() > c.Prefix.Bits() && c.Prefix.Contains(n.Prefix.Addr()):
			r.Prefix = n.Prefix
		default:
			return Rule{}, false
		}
		return r, true
	}
	return Rule{}, false
}

// within says whether n allows nothing that c does not.
func within(n, c Rule) bool {
	r, ok := intersect(c, n)
	if !ok {
		return false
	}
	return r.Host == n.Host && r.Prefix == n.Prefix && slices.Equal(r.Ports, n.Ports) && (r.AllowPrivate || !n.AllowPrivate) &&
		(r.WebSocket || !n.WebSocket) && sameHTTP(r, n)
}

// intersectPorts intersects two sorted port lists (empty: any port).
func intersectPorts(a, b []int) ([]int, bool) {
	switch {
	case len(a) == 0:
		return slices.Clone(b), true
	case len(b) == 0:
		return slices.Clone(a), true
	}
	var out []int
	for _, p := range a {
		if slices.Contains(b, p) {
			out = append(out, p)
		}
	}
	return out, len(out) > 0
}

func isPattern(host string) bool { return len(host) > 1 && host[0] == '*' }

func sameRule(a, b Rule) bool {
	return a.Host == b.Host && a.Prefix == b.Prefix && slices.Equal(a.Ports, b.Ports) && a.AllowPrivate == b.AllowPrivate &&
		a.WebSocket == b.WebSocket && a.API == b.API && sameHTTP(a, b)
}

func describeRule(r Rule) string {
	what := r.Host
	if what == "" {
		what = r.Prefix.String()
	}
	if len(r.Ports) > 0 {
		what += fmt.Sprintf(" ports %v", r.Ports)
	}
	if r.WebSocket {
		what += " websocket"
	}
	if r.API != "" {
		what += " api " + r.API
	}
	if len(r.Methods) > 0 {
		what += fmt.Sprintf(" methods %v", r.Methods)
	}
	if len(r.Paths) > 0 {
		what += fmt.Sprintf(" paths %v", r.Paths)
	}
	return what
}

// Equal says whether two plans enforce the same.
func (pl *Plan) Equal(o *Plan) bool {
	if pl.Enforced != o.Enforced || pl.DefaultAccept != o.DefaultAccept || pl.Resolver != o.Resolver || pl.Budget != o.Budget || pl.ModelAudit != o.ModelAudit ||
		!pl.MCPBudget.Equal(o.MCPBudget) || !slices.Equal(pl.Denied, o.Denied) || len(pl.Allow) != len(o.Allow) || !slices.EqualFunc(pl.Injects, o.Injects, Inject.Same) {
		return false
	}
	for i := range pl.Allow {
		if !sameRule(pl.Allow[i], o.Allow[i]) {
			return false
		}
	}
	return true
}

// modelAuditRank orders audit.model's levels by what they keep.
var modelAuditRank = map[string]int{policy.ModelCalls: 1, policy.ModelDigests: 2, policy.ModelContent: 3}

// toolsDiffer says whether n matches a current rule but for its MCP tools.
func toolsDiffer(n Rule, cur []Rule) bool {
	for _, c := range cur {
		if r, ok := intersect(c, n); ok && r.Host == n.Host && !sameTools(c.Tools, n.Tools) {
			return true
		}
	}
	return false
}

// narrowMCPBudget is the tighter of two MCP budgets, bound by bound: a
// lower bound applies at once, a higher one or none is pending.
func narrowMCPBudget(cur, next policy.MCPBudget) (policy.MCPBudget, []string, []string) {
	var applied, pending []string
	out := policy.MCPBudget{Calls: cur.Calls, Tools: maps.Clone(cur.Tools)}
	one := func(name string, c, n int64, set func(int64)) {
		switch {
		case n == c:
		case n > 0 && (c == 0 || n < c):
			set(n)
			applied = append(applied, fmt.Sprintf("MCP %s bounded to %d", name, n))
		default:
			pending = append(pending, fmt.Sprintf("MCP %s bound %s (loosens)", name, map[bool]string{true: "removed", false: fmt.Sprint("raised to ", n)}[n == 0]))
		}
	}
	one("calls", cur.Calls, next.Calls, func(n int64) { out.Calls = n })
	names := slices.Sorted(maps.Keys(cur.Tools))
	for t := range next.Tools {
		if _, ok := cur.Tools[t]; !ok {
			names = append(names, t)
		}
	}
	slices.Sort(names)
	for _, t := range slices.Compact(names) {
		one("calls of "+t, cur.Tools[t], next.Tools[t], func(n int64) {
			if out.Tools == nil {
				out.Tools = map[string]int64{}
			}
			out.Tools[t] = n
		})
	}
	return out, applied, pending
}
