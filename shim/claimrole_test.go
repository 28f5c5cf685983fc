package shim

import (
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/tighten"
)

// A claim's role is taken as a live tightening is, and only whole: what
// it would leave pending (a loosening, or what a running sandbox cannot
// change) refuses it, naming each.
func TestClaimRoleNoLooser(t *testing.T) {
	profile := func(allow []policy.EgressRule, wall string) *policy.Profile {
		var b strings.Builder
		b.WriteString("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: r}\nspec:\n  network:\n    egress: allowlist\n    allow:\n")
		for _, r := range allow {
			b.WriteString("    - {host: " + r.Host + ", ports: [443]}\n")
		}
		if wall != "" {
			b.WriteString("  limits: {wallClock: " + wall + "}\n")
		}
		set, err := policy.Parse("p.yaml", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		p, err := set.Profile("r")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := policy.EgressRule{Host: "a.test", Ports: []int{443}}
	b := policy.EgressRule{Host: "b.test", Ports: []int{443}}
	pool := profile([]policy.EgressRule{a, b}, "")
	plan, err := netpolicy.Compile(pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		next *policy.Profile
		err  string
	}{
		{name: "the same", next: profile([]policy.EgressRule{a, b}, "")},
		{name: "narrower", next: profile([]policy.EgressRule{a}, "")},
		{name: "looser", next: profile([]policy.EgressRule{a, b, {Host: "c.test", Ports: []int{443}}}, ""), err: "allow[2] host c.test ports [443] (loosens)"},
		{name: "what a running sandbox cannot change", next: profile([]policy.EgressRule{a}, "1h"), err: "limits (wall clock, CPU time, open files): applies to new sandboxes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tighten.Diff(tighten.Running{Profile: pool, Plan: plan}, tc.next)
			if err != nil {
				t.Fatal(err)
			}
			err = noLooser("task", c)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "role task is not as tight") {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
}

func TestWithRole(t *testing.T) {
	req := policy.Request{Annotations: map[string]string{policy.RoleAnnotation: "pool", "agentbox.dev/egress": "none"}, PodNamespace: "agents"}
	got := withRole(req, "task")
	if got.RoleName() != "task" || got.Annotations["agentbox.dev/egress"] != "none" || got.PodNamespace != "agents" {
		t.Fatalf("%+v", got)
	}
	if req.RoleName() != "pool" {
		t.Fatal("the sandbox's own request changed")
	}
}
