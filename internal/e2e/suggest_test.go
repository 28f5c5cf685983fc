//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPolicySuggestFromTrail: a workload runs under a loose role (coder
// with three hosts); agentbox policy suggest writes a role from its trail;
// the same workload runs under that role and passes, while one step more
// than the trail showed (a host it never reached) is refused. policy diff
// finds nothing the suggestion would refuse of the first run, and what
// baseline would.
func TestPolicySuggestFromTrail(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	const loose, suggested = "zz-e2e-loose.yaml", "zz-e2e-suggested.yaml"
	writePolicy(t, loose, `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-loose}
spec:
  inherits: coder
  network:
    egress: allowlist
    allow:
      - {host: `+gwAllowA+`, ports: [80, 443]}
      - {host: `+gwAllowB+`, ports: [80, 443]}
      - {host: `+gwOther+`, ports: [80, 443]}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-loose}
spec:
  role: e2e-loose
  subjects: [{namespace: e2e-loose}]
`)
	t.Cleanup(func() {
		os.Remove(filepath.Join(dev.dir, "agentbox", "policies", loose))
		os.Remove(filepath.Join(dev.dir, "agentbox", "policies", suggested))
	})
	// The workload: a tool it writes and runs, a note in /tmp, a page from
	// one host.
	work := strings.Join([]string{
		gwStep("tool", "mkdir -p /workspace/bin && printf '#!/bin/sh\\necho tool-ran\\n' > /workspace/bin/tool && chmod +x /workspace/bin/tool && /workspace/bin/tool"),
		gwStep("note", "echo kept > /tmp/note && cat /tmp/note"),
		gwStep("fetch", "abx-fetch http://"+gwAllowA+"/suggest"),
	}, "; ")
	runWork := func(ns, extra string) (map[string]string, *pod) {
		t.Helper()
		p := newPodIn(t, "suggest-"+ns, ns, map[string]string{"agentbox.dev/role": ns})
		script := work + "; " + extra + "; echo probes-done; sleep 600"
		id := p.containerWith(t, "c", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", script}})
		logs := waitLogsWithin(t, id, "probes-done", 2*time.Minute)
		return stepLines(logs.stdout), p
	}
	lines, p := runWork("e2e-loose", "true")
	for step, want := range map[string]string{"tool": "tool-ran", "note": "kept", "fetch": "status=200"} {
		expectStep(t, lines, step, want, false)
	}
	p.remove()
	readTrail(t, p.id)
	trail := filepath.Join(dev.dir, "audit", p.id+".jsonl")
	r := agentbox("policy", "suggest", "--name", "e2e-suggested", "--inherits", "coder", trail)
	if r.code != 0 {
		t.Fatalf("policy suggest: %v", r)
	}
	t.Logf("the suggestion:\n%s", r.stdout)
	for _, want := range []string{"- {host: " + gwAllowA + ", ports: [80]}", "writable: [/tmp, /workspace]", "allowExec: [/workspace]",
		"# its sandbox's peak was", "# its sandbox used"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the suggestion lacks %q", want)
		}
	}
	if strings.Contains(r.stdout, "host: "+gwAllowB) {
		t.Errorf("the suggestion allows a host the agent never reached")
	}
	writePolicy(t, suggested, r.stdout+`---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-suggested}
spec:
  role: e2e-suggested
  subjects: [{namespace: e2e-suggested}]
`)
	policies := filepath.Join(dev.dir, "agentbox", "policies")
	if d := agentbox("policy", "diff", "--policy-dir", policies, "--trail", trail, "--role", "e2e-suggested"); d.code != 0 || !strings.Contains(d.stdout, "allows everything the trail shows") {
		t.Errorf("diff against the suggestion: %v", d)
	}
	if d := agentbox("policy", "diff", "--policy-dir", policies, "--trail", trail, "--role", "baseline"); d.code == 0 ||
		!strings.Contains(d.stdout, gwAllowA+":80") || !strings.Contains(d.stdout, "write /workspace/bin/tool") {
		t.Errorf("diff against baseline: %v", d)
	}

	// Again under the suggestion: the same work passes; a host more is
	// refused.
	lines, p = runWork("e2e-suggested", gwStep("more", "abx-fetch http://"+gwAllowB+"/more"))
	for step, want := range map[string]string{"tool": "tool-ran", "note": "kept", "fetch": "status=200"} {
		expectStep(t, lines, step, want, false)
	}
	if got := lines["more"]; strings.Contains(got, "status=200") || got == "" {
		t.Errorf("a host the trail never showed: %q", got)
	}
	p.remove()
	var refused bool
	for _, rec := range readTrail(t, p.id) {
		if rec.Event == "agentbox/dns_refused" && strings.Contains(rec.Message, gwAllowB) {
			refused = true
		}
	}
	if !refused {
		t.Error("the trail of the second run does not record the refusal of " + gwAllowB)
	}
}
