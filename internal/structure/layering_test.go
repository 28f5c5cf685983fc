package structure

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "agentbox.dev/agentbox/"

// pure packages decide: they compile roles and plans, build records, hold
// the lifecycle. Through no chain of imports do they reach a package that
// starts, mounts, dials, execs, enters a namespace, or keeps the node's
// files.
var pure = []string{
	"internal/policy", "internal/compile", "internal/tighten", "internal/netpolicy",
	"internal/egressrec", "internal/egressev", "internal/modelapi", "internal/mcp", "internal/ocsf",
	"internal/ocispec", "internal/errkind", "internal/report", "internal/checkpoint/naming",
	"internal/erofs", "shim/sandbox",
}

// effects are those packages.
var effects = []string{
	"internal/hostexec", "internal/nsthread", "internal/cgroups", "internal/oomadj",
	"internal/install", "internal/mountguard", "internal/policysync", "internal/kubeapi",
	"internal/control", "internal/netenforce", "internal/egressgw", "internal/dnsproxy",
	"internal/checkpoint$", "internal/broker", "internal/audit/ingest", "internal/audit/forward",
	"internal/sentrystats", "internal/policystore", "internal/privdir", "internal/pauseroot",
}

// rule: from packages matching from (a prefix, or exact with a trailing
// "$"), the allowed agentbox packages (nil: any but deny), or the denied.
type rule struct {
	name        string
	from        []string
	allow, deny []string
}

var rules = []rule{
	{name: "pure", from: pure, deny: effects},
	// The trail, its ingest and forwarders use nothing of agentbox's but
	// its version: whatever feeds them depends on them.
	{name: "audit", from: []string{"internal/audit"}, allow: []string{"internal/audit", "internal/version$"}},
	// The lifecycle is agentbox's own and imports none of it.
	{name: "sandbox", from: []string{"shim/sandbox$"}, allow: []string{"shim/sandbox$"}},
	// Nothing below the shim and the CLI reaches them. (cmd/ holds main
	// packages and internal/e2e only tests: Go lets nothing import them.)
	{name: "downward", from: []string{"internal/"}, deny: []string{"shim", "internal/cli$"}},
}

func matches(pkg string, pats []string) bool {
	for _, p := range pats {
		if exact, ok := strings.CutSuffix(p, "$"); ok {
			if pkg == exact {
				return true
			}
		} else if pkg == p || strings.HasPrefix(pkg, strings.TrimSuffix(p, "/")+"/") || strings.HasSuffix(p, "/") && strings.HasPrefix(pkg, p) {
			return true
		}
	}
	return false
}

// deps is each of the module's packages (test files left out) with every
// agentbox package it depends on, directly or not.
func deps(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	all := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		all[pkg] = nil
		for _, d := range f[1:] {
			if rest, ok := strings.CutPrefix(d, mod); ok {
				all[pkg] = append(all[pkg], rest)
			}
		}
	}
	return all
}

// violations lists "PKG -> DEP (rule)" for every dependency a rule forbids.
func violations(all map[string][]string, rules []rule) []string {
	var out []string
	for pkg, ds := range all {
		for _, r := range rules {
			if !matches(pkg, r.from) {
				continue
			}
			for _, d := range ds {
				if r.allow != nil && !matches(d, r.allow) || r.deny != nil && matches(d, r.deny) {
					out = append(out, pkg+" -> "+d+" ("+r.name+")")
				}
			}
		}
	}
	return out
}

func TestLayering(t *testing.T) {
	all := deps(t)
	for _, r := range rules {
		n := 0
		for pkg := range all {
			if matches(pkg, r.from) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("rule %s applies to no package: it cannot fail", r.name)
		}
	}
	for _, p := range append(append([]string{}, pure...), effects...) {
		if _, ok := all[strings.TrimSuffix(p, "$")]; !ok {
			t.Errorf("%s is named in the rules but is no package", p)
		}
	}
	for _, v := range violations(all, rules) {
		t.Error(v)
	}
}

// Each rule fails on the break it is for.
func TestLayeringRulesCanFail(t *testing.T) {
	for _, tc := range []struct {
		pkg, dep, rule string
	}{
		{"internal/compile", "internal/netenforce", "pure"},
		{"internal/policy", "internal/checkpoint", "pure"},
		{"internal/egressrec", "internal/egressgw", "pure"},
		{"internal/tighten", "internal/hostexec", "pure"},
		{"internal/audit", "internal/policy", "audit"},
		{"internal/audit/ingest", "internal/errkind", "audit"},
		{"shim/sandbox", "internal/errkind", "sandbox"},
		{"internal/policy", "shim", "downward"},
		{"internal/report", "internal/cli", "downward"},
	} {
		got := violations(map[string][]string{tc.pkg: {tc.dep}}, rules)
		if len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), "("+tc.rule+")") {
			t.Errorf("%s -> %s: %q, want a %s violation", tc.pkg, tc.dep, got, tc.rule)
		}
	}
	if got := violations(map[string][]string{"internal/compile": {"internal/netpolicy", "internal/policy"}}, rules); len(got) != 0 {
		t.Errorf("the allowed twin: %q", got)
	}
}
