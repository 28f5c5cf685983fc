package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/audit"
)

// TestPolicySuggestAndDiff: a trail whose agent fetched from one host
// gives a role allowing that host; the role loads with the shipped ones,
// diff finds nothing it refuses, and baseline refuses the host.
func TestPolicySuggestAndDiff(t *testing.T) {
	dir := t.TempDir()
	var c audit.Chain
	var out []byte
	for _, r := range []*audit.Record{
		audit.TypeRoleResolved.New("Success", "role coder", nil),
		audit.TypeEgressRequest.New("Success", "GET https://pypi.org/simple/", map[string]string{"host": "pypi.org"}),
		audit.TypeSandboxEnd.New("Success", "sandbox ended", nil),
	} {
		r.Sandbox, r.Role = "sb", "coder"
		if r.Event == "agentbox/egress_request" {
			r.Dst = &audit.Endpoint{Port: 443}
		}
		var h string
		out, h = c.SealAppend(out, r)
		c.Commit(h)
	}
	trail := filepath.Join(dir, "sb.jsonl")
	if err := os.WriteFile(trail, out, 0o640); err != nil {
		t.Fatal(err)
	}
	y, _, err := run(t, "policy", "suggest", "--name", "from-trail", "--inherits", "coder", trail)
	if err != nil || !strings.Contains(y, "- {host: pypi.org, ports: [443]}   # 1 request(s)") || !strings.Contains(y, "metadata: {name: from-trail}") {
		t.Fatalf("suggest: %v\n%s", err, y)
	}
	policies := filepath.Join(dir, "policies")
	os.MkdirAll(policies, 0o755)
	for _, f := range []string{"baseline.yaml", "coder.yaml", "researcher.yaml", "bindings.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../policies", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(policies, f), b, 0o644)
	}
	os.WriteFile(filepath.Join(policies, "suggested.yaml"), []byte(y), 0o644)
	o, _, err := run(t, "policy", "diff", "--policy-dir", policies, "--trail", trail, "--role", "from-trail")
	if err != nil || !strings.Contains(o, "role from-trail allows everything the trail shows (1 host(s)") {
		t.Fatalf("diff against the suggestion: %v\n%s", err, o)
	}
	o, _, err = run(t, "policy", "diff", "--policy-dir", policies, "--trail", trail, "--role", "baseline")
	if err == nil || !strings.Contains(o, `refused: "pypi.org:443 (1 request(s))": "egress none"`) {
		t.Fatalf("diff against baseline: %v\n%s", err, o)
	}
	if _, e, err := run(t, "policy", "suggest"); err == nil {
		t.Fatalf("suggest without a trail: %s", e)
	}
	if _, _, err := run(t, "policy", "diff", "--policy-dir", policies, "--trail", trail, "--role", "nope"); err == nil {
		t.Fatal("diff against an undefined role")
	}
}
