package netpolicy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/policy"
)

func plan(t *testing.T, egress string, rules ...policy.EgressRule) *Plan {
	t.Helper()
	pl, err := Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: egress, Allow: rules}})
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// A running sandbox takes what tightens it and never what loosens it.
func TestNarrow(t *testing.T) {
	a := policy.EgressRule{Host: "a.test", Ports: []int{80, 443}}
	b := policy.EgressRule{Host: "b.test", Ports: []int{443}}
	star := policy.EgressRule{Host: "*.cdn.test", Ports: []int{443}}
	net8 := policy.EgressRule{CIDR: "10.0.0.0/8", Ports: []int{443}}
	allow, open, none := policy.EgressAllowlist, policy.EgressOpen, policy.EgressNone
	for _, tc := range []struct {
		name               string
		cur, next          *Plan
		hosts, cidrs       []string // the live plan's rules (host ports / cidr ports)
		applied, pending   []string // substrings, in order
		deny, accept, same bool
	}{
		{name: "host removed", cur: plan(t, allow, a, b), next: plan(t, allow, a),
			hosts: []string{"a.test [80 443]"}, applied: []string{"allow[1] host b.test ports [443] removed"}},
		{name: "host added: pending", cur: plan(t, allow, a), next: plan(t, allow, a, b), same: true,
			hosts: []string{"a.test [80 443]"}, pending: []string{"allow[1] host b.test ports [443] (loosens)"}},
		{name: "one removed, one added", cur: plan(t, allow, a), next: plan(t, allow, b),
			applied: []string{"allow[0] host a.test ports [80 443] removed"}, pending: []string{"b.test ports [443] (loosens)"}},
		{name: "ports narrowed", cur: plan(t, allow, a), next: plan(t, allow, policy.EgressRule{Host: "a.test", Ports: []int{443}}),
			hosts: []string{"a.test [443]"}, applied: []string{"narrowed to a.test ports [443]"}},
		{name: "ports widened: pending", cur: plan(t, allow, b), next: plan(t, allow, policy.EgressRule{Host: "b.test", Ports: []int{80, 443}}), same: true,
			hosts: []string{"b.test [443]"}, pending: []string{"(loosens)"}},
		{name: "pattern to a name under it", cur: plan(t, allow, star), next: plan(t, allow, policy.EgressRule{Host: "x.cdn.test", Ports: []int{443}}),
			hosts: []string{"x.cdn.test [443]"}, applied: []string{"narrowed to x.cdn.test"}},
		{name: "name to a pattern: pending", cur: plan(t, allow, policy.EgressRule{Host: "x.cdn.test", Ports: []int{443}}), next: plan(t, allow, star), same: true,
			hosts: []string{"x.cdn.test [443]"}, pending: []string{"(loosens)"}},
		{name: "cidr narrowed", cur: plan(t, allow, net8), next: plan(t, allow, policy.EgressRule{CIDR: "10.1.0.0/16", Ports: []int{443}}),
			cidrs: []string{"10.1.0.0/16 [443]"}, applied: []string{"narrowed to 10.1.0.0/16"}},
		{name: "cidr widened: pending", cur: plan(t, allow, policy.EgressRule{CIDR: "10.1.0.0/16", Ports: []int{443}}), next: plan(t, allow, net8), same: true,
			cidrs: []string{"10.1.0.0/16 [443]"}, pending: []string{"(loosens)"}},
		{name: "websocket taken away", cur: plan(t, allow, policy.EgressRule{Host: "b.test", Ports: []int{443}, WebSocket: true}), next: plan(t, allow, b),
			hosts: []string{"b.test [443]"}, applied: []string{"narrowed to b.test ports [443]"}},
		{name: "websocket given: pending", cur: plan(t, allow, b), next: plan(t, allow, policy.EgressRule{Host: "b.test", Ports: []int{443}, WebSocket: true}), same: true,
			hosts: []string{"b.test [443]"}, pending: []string{"(loosens)"}},
		{name: "allowlist to none", cur: plan(t, allow, a, net8), next: plan(t, none), deny: true,
			applied: []string{"egress none: every allow rule removed"}},
		{name: "allowlist to open: pending", cur: plan(t, allow, net8), next: plan(t, open), same: true,
			cidrs: []string{"10.0.0.0/8 [443]"}, pending: []string{"egress open (loosens)"}},
		{name: "open to allowlist: CIDR rules now, host rules pending", cur: plan(t, open), next: plan(t, allow, a, net8), deny: true,
			cidrs: []string{"10.0.0.0/8 [443]"}, applied: []string{"default deny", "allow[1] 10.0.0.0/8 ports [443] allowed"},
			pending: []string{"host rule needs the pod's resolver and gateway"}},
		{name: "none to open: pending", cur: plan(t, none), next: plan(t, open), same: true,
			pending: []string{"no network interface"}},
		{name: "metadata named by the role: the new version denies it", cur: plan(t, allow, policy.EgressRule{CIDR: "169.254.169.254/32"}), next: plan(t, allow),
			applied: []string{"metadata address 169.254.169.254 denied", "removed"}},
		{name: "paths narrowed", cur: plan(t, allow, b), next: plan(t, allow, withHTTP(b, nil, "/task/*")),
			hosts: []string{"b.test [443]"}, applied: []string{"narrowed to b.test ports [443] paths [/task/*]"}},
		{name: "paths narrowed further", cur: plan(t, allow, withHTTP(b, nil, "/repos/*")), next: plan(t, allow, withHTTP(b, nil, "/repos/org/*", "/other")),
			hosts: []string{"b.test [443]"}, applied: []string{"narrowed to b.test ports [443] paths [/repos/org/*]"}, pending: []string{"(loosens)"}},
		{name: "paths taken away: pending", cur: plan(t, allow, withHTTP(b, nil, "/task/*")), next: plan(t, allow, b), same: true,
			hosts: []string{"b.test [443]"}, pending: []string{"allow[0] host b.test ports [443] (loosens)"}},
		{name: "a path widened: pending", cur: plan(t, allow, withHTTP(b, nil, "/task/1")), next: plan(t, allow, withHTTP(b, nil, "/task/*")), same: true,
			hosts: []string{"b.test [443]"}, pending: []string{"(loosens)"}},
		{name: "no path in common", cur: plan(t, allow, withHTTP(b, nil, "/a/*")), next: plan(t, allow, withHTTP(b, nil, "/b/*")),
			applied: []string{"b.test ports [443] removed"}, pending: []string{"(loosens)"}},
		{name: "methods narrowed, in the new order", cur: plan(t, allow, withHTTP(b, []string{"GET", "POST"})), next: plan(t, allow, withHTTP(b, []string{"POST"})),
			hosts: []string{"b.test [443]"}, applied: []string{"methods [POST]"}},
		{name: "the same methods in another order", cur: plan(t, allow, withHTTP(b, []string{"GET", "POST"})), next: plan(t, allow, withHTTP(b, []string{"POST", "GET"})), same: true,
			hosts: []string{"b.test [443]"}},
		{name: "an MCP rule's tools changed: for new sandboxes", cur: plan(t, allow, mcpRule(b, "get_*")), next: plan(t, allow, mcpRule(b, "get_issue")), same: true,
			hosts: []string{"b.test [443]"}, pending: []string{"its MCP tools differ from the running sandbox's"}},
		{name: "an MCP rule unchanged", cur: plan(t, allow, mcpRule(b, "get_*")), next: plan(t, allow, mcpRule(b, "get_*")), same: true,
			hosts: []string{"b.test [443]"}},
		{name: "unchanged", cur: plan(t, allow, a, net8), next: plan(t, allow, a, net8), same: true,
			hosts: []string{"a.test [80 443]"}, cidrs: []string{"10.0.0.0/8 [443]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live, applied, pending := Narrow(tc.cur, tc.next)
			if got := live.Equal(tc.cur); got != tc.same {
				t.Errorf("live equals the current plan: %v, want %v (applied %q)", got, tc.same, applied)
			}
			if tc.same != (len(applied) == 0) {
				t.Errorf("applied %q with same=%v", applied, tc.same)
			}
			var hosts, cidrs []string
			for _, r := range live.Allow {
				if r.Host != "" {
					hosts = append(hosts, fmt.Sprint(r.Host, " ", r.Ports))
				} else {
					cidrs = append(cidrs, fmt.Sprint(r.Prefix, " ", r.Ports))
				}
			}
			if strings.Join(hosts, ",") != strings.Join(tc.hosts, ",") || strings.Join(cidrs, ",") != strings.Join(tc.cidrs, ",") {
				t.Errorf("live hosts %q cidrs %q, want %q %q", hosts, cidrs, tc.hosts, tc.cidrs)
			}
			check := func(what string, got, want []string) {
				j := strings.Join(got, " | ")
				for _, w := range want {
					if !strings.Contains(j, w) {
						t.Errorf("%s %q lacks %q", what, got, w)
					}
				}
				if len(want) == 0 && len(got) > 0 {
					t.Errorf("%s %q, want none", what, got)
				}
			}
			check("applied", applied, tc.applied)
			check("pending", pending, tc.pending)
			if tc.deny && live.DefaultAccept {
				t.Error("the live plan accepts by default")
			}
			if live.Resolver != tc.cur.Resolver {
				t.Error("the live plan changed whether the pod has a resolver")
			}
		})
	}
}

// A model budget narrows bound by bound: lower applies, higher or none is
// pending (and so refuses a restore under the looser role).
func TestNarrowBudget(t *testing.T) {
	cur := &Plan{Enforced: true, Resolver: true, Budget: policy.ModelBudget{Tokens: 1000, Requests: 10}}
	next := &Plan{Enforced: true, Resolver: true, Budget: policy.ModelBudget{Tokens: 500, RequestsPerMinute: 5}}
	live, applied, pending := Narrow(cur, next)
	if live.Budget != (policy.ModelBudget{Tokens: 500, Requests: 10, RequestsPerMinute: 5}) {
		t.Fatalf("live budget %+v", live.Budget)
	}
	if want := []string{"model tokens bounded to 500", "model requests per minute bounded to 5"}; !slices.Equal(applied, want) {
		t.Errorf("applied %q, want %q", applied, want)
	}
	if want := []string{"model requests bound removed (loosens)"}; !slices.Equal(pending, want) {
		t.Errorf("pending %q, want %q", pending, want)
	}
	if _, _, p := Narrow(next, &Plan{Enforced: true, Resolver: true, Budget: policy.ModelBudget{Tokens: 900, RequestsPerMinute: 5}}); !slices.Equal(p, []string{"model tokens bound raised to 900 (loosens)"}) {
		t.Errorf("raised: %q", p)
	}
	if live.Equal(cur) || !live.Equal(live) {
		t.Error("Equal ignores the budget")
	}
	// A lower output cap applies at once; a higher one loosens.
	capped := &Plan{Enforced: true, Resolver: true, Budget: policy.ModelBudget{Tokens: 500, RequestsPerMinute: 5, MaxOutput: 400}}
	if l, a, _ := Narrow(next, capped); l.Budget.MaxOutput != 400 || !slices.Equal(a, []string{"model output cap bounded to 400"}) {
		t.Errorf("capped: %+v %q", l.Budget, a)
	}
	if _, _, p := Narrow(capped, next); !slices.Equal(p, []string{"model output cap bound removed (loosens)"}) {
		t.Errorf("cap removed: %q", p)
	}
}

// A role compiled twice injects the same Kubernetes Secret's key: its new
// version (unchanged) injects nothing new, whatever the pointers.
func TestNarrowSameSecretRef(t *testing.T) {
	compile := func() *Plan {
		r := policy.SecretRef{Namespace: "keys", Name: "vendor", Key: "token"}
		pl, err := Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{{Host: "api.test", Ports: []int{443}}}},
			Credentials: policy.CredentialsProfile{Secrets: []policy.Secret{{SecretRef: &r, Inject: &policy.Inject{Host: "api.test", Header: "authorization"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	cur, next := compile(), compile()
	if _, _, pending := Narrow(cur, next); len(pending) != 0 {
		t.Fatalf("the same role, compiled again, is pending: %q", pending)
	}
	other := compile()
	other.Injects[0].Ref = &policy.SecretRef{Namespace: "keys", Name: "vendor", Key: "other"}
	if _, _, pending := Narrow(cur, other); len(pending) != 1 {
		t.Fatalf("another Secret's key injected: pending %q", pending)
	}
}

// withHTTP is r restricted to methods and paths.
func withHTTP(r policy.EgressRule, methods []string, paths ...string) policy.EgressRule {
	r.HTTP = &policy.HTTPRule{Methods: methods, Paths: paths}
	return r
}

// mcpRule is r naming an MCP server whose tools allow are allowed.
func mcpRule(r policy.EgressRule, allow ...string) policy.EgressRule {
	r.API, r.Tools = policy.APIMCP, &policy.ToolsRule{Allow: allow}
	return r
}

// An MCP budget narrows bound by bound, per tool too.
func TestNarrowMCPBudget(t *testing.T) {
	cur := &Plan{Enforced: true, Resolver: true, MCPBudget: policy.MCPBudget{Calls: 100, Tools: map[string]int64{"delete_issue": 2, "search": 10}}}
	next := &Plan{Enforced: true, Resolver: true, MCPBudget: policy.MCPBudget{Calls: 50, Tools: map[string]int64{"delete_issue": 1, "get": 5}}}
	live, applied, pending := Narrow(cur, next)
	if want := (policy.MCPBudget{Calls: 50, Tools: map[string]int64{"delete_issue": 1, "search": 10, "get": 5}}); !live.MCPBudget.Equal(want) {
		t.Fatalf("live %+v", live.MCPBudget)
	}
	if want := []string{"MCP calls bounded to 50", "MCP calls of delete_issue bounded to 1", "MCP calls of get bounded to 5"}; !slices.Equal(applied, want) {
		t.Errorf("applied %q, want %q", applied, want)
	}
	if want := []string{"MCP calls of search bound removed (loosens)"}; !slices.Equal(pending, want) {
		t.Errorf("pending %q, want %q", pending, want)
	}
	if cur.MCPBudget.Tools["delete_issue"] != 2 {
		t.Error("the current plan's budget changed")
	}
}
