//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/doclinks"
)

// docRun is how the suite runs one documented command on the test
// cluster's node: in which order, on which of the two pods, the exit code
// the page promises, and what its output names (after the placeholders
// are replaced).
type docRun struct {
	order int
	pod   string // "coder-7" or "coder-8"
	code  int
	want  string
}

// documentedRuns has every agentbox command line the docs show, keyed by
// the line without its comment and with its spaces collapsed. A command
// the docs gain or change fails the test until it is here: each is run.
var documentedRuns = map[string]docRun{
	"agentbox sandbox list": {1, "coder-7", 0, "NS/coder-7"},
	`agentbox sandbox quarantine --pod agents/coder-7 --reason "exfiltration to an allowed host"`:                               {2, "coder-7", 0, "quarantined"},
	"agentbox sandbox quarantine --release --pod agents/coder-7":                                                                {3, "coder-7", 0, ""},
	`agentbox sandbox freeze --reason "look before it acts" 4f2a9c0e`:                                                           {4, "coder-7", 0, ""},
	"agentbox sandbox thaw 4f2a9c0e":                                                                                            {5, "coder-7", 0, ""},
	"agentbox sandbox checkpoint --name review-42 --pod agents/coder-7":                                                         {6, "coder-7", 0, "NAME"},
	"agentbox sandbox checkpoints":                                                                                              {7, "coder-7", 0, "NAME"},
	"agentbox sandbox checkpoints --remove review-42":                                                                           {8, "coder-7", 0, ""},
	"agentbox audit tail --class file /tmp/agentbox-dev/audit":                                                                  {9, "coder-7", 0, "/tmp/state"},
	"agentbox audit verify --open /tmp/agentbox-dev/audit":                                                                      {10, "coder-7", 0, "chain intact, open"},
	"agentbox audit validate /tmp/agentbox-dev/audit":                                                                           {11, "coder-7", 0, ""},
	"agentbox audit report --sandbox a8 -o html /tmp/agentbox-dev/audit > a8.html":                                              {12, "coder-7", 0, ""},
	"agentbox policy suggest --name my-agent --inherits coder /var/log/agentbox/audit/SANDBOX.jsonl":                            {13, "coder-7", 0, "name: my-agent"},
	"agentbox policy suggest --name my-agent --inherits coder SANDBOX.jsonl > my-agent.yaml":                                    {14, "coder-7", 0, ""},
	"agentbox policy diff --trail SANDBOX.jsonl --role my-agent --policy-dir /etc/agentbox/policies --policy-dir my-agent.yaml": {15, "coder-7", 0, ""},
	"agentbox policy diff --trail SANDBOX.jsonl --role baseline":                                                                {16, "coder-7", 0, ""},
	"agentbox policy validate /etc/agentbox/policies my-agent.yaml":                                                             {17, "coder-7", 0, ""},
	"agentbox doctor --address /run/containerd/containerd.sock":                                                                 {18, "coder-7", 0, ""},
	`agentbox sandbox suspend --name review-42 --reason "waiting for review" --pod agents/coder-7`:                              {19, "coder-7", 0, "suspended into"},
	`agentbox sandbox stop --reason "enough" 4f2a9c0e`:                                                                          {20, "coder-8", 0, ""},
}

var spaces = regexp.MustCompile(`\s+`)

// docKey is a documented line without its comment, spaces collapsed.
func docKey(line string) string {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	return strings.TrimSpace(spaces.ReplaceAllString(line, " "))
}

// TestKubeDocumentedCommands runs each agentbox command the docs show, as
// written, on the hack/kube.sh cluster's node: the placeholders (the pod
// agents/coder-7, the sandbox id 4f2a9c0e, the trail SANDBOX.jsonl, the
// checkpoint review-42, the audit directory) replaced by the test's own,
// in a shell, so its redirections write where the page says.
func TestKubeDocumentedCommands(t *testing.T) {
	pages, err := doclinks.Pages(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		doclinks.Command
		docRun
	}
	var steps []step
	seen := map[string]bool{}
	for _, c := range doclinks.Commands(pages, "agentbox") {
		r, ok := documentedRuns[docKey(c.Line)]
		if !ok {
			t.Errorf("%s: %q is not in documentedRuns: say how the suite runs it", c.At, docKey(c.Line))
			continue
		}
		seen[docKey(c.Line)] = true
		steps = append(steps, step{c, r})
	}
	for k := range documentedRuns {
		if !seen[k] {
			t.Errorf("documentedRuns has %q, which no page shows", k)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].order < steps[j].order })

	k := kubeCluster(t)
	ns := k.namespace(t, "abx-doc")
	writeNodePolicy(t, k, "e2e-kube-doc.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-doc}
spec:
  inherits: baseline
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-doc}
spec:
  role: e2e-kube-doc
  subjects: [{namespace: %s}]
`, ns))
	script := `i=0; exec 3>>/tmp/state; while :; do i=$((i+1)); echo "count $i" >&3; sleep 0.5; done`
	sandboxes := map[string]string{}
	for _, name := range []string{"coder-7", "coder-8"} {
		k.apply(t, podSpec(ns, name, "agentbox", "e2e-kube-doc", "sh", "-c", script))
	}
	for _, name := range []string{"coder-7", "coder-8"} {
		p := k.waitPod(t, ns, name, 3*time.Minute, "Running", running)
		sandboxes[name] = k.sandboxOf(t, p.Metadata.UID)
	}
	// The trail has the agent's writes to /tmp/state before the audit
	// commands read it.
	if !eventually(t, 30*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(k.dir, "varlog", "agentbox", "audit", sandboxes["coder-7"]+".jsonl"))
		return strings.Contains(string(b), "/tmp/state")
	}) {
		t.Fatal("the agent's trail never named /tmp/state")
	}
	work := t.TempDir()
	checkpoint := uniqueID("review")
	for _, s := range steps {
		sb := sandboxes[s.pod]
		line := strings.NewReplacer(
			"agents/coder-7", ns+"/"+s.pod,
			"review-42", checkpoint,
			"4f2a9c0e", sb[:8],
			"--sandbox a8", "--sandbox "+sb,
			"/tmp/agentbox-dev/audit", "/var/log/agentbox/audit",
			"/var/log/agentbox/audit/SANDBOX.jsonl", "/var/log/agentbox/audit/"+sb+".jsonl",
			"SANDBOX.jsonl", "/var/log/agentbox/audit/"+sb+".jsonl",
			"/run/containerd/containerd.sock", k.sock,
		).Replace(s.Line)
		r := k.run(3*time.Minute, nil, filepath.Join(repoRoot, "hack", "kube.sh"), "node", "sh", "-c",
			fmt.Sprintf("cd %s && PATH=%s:$PATH && %s", work, filepath.Join(repoRoot, "_output", "bin"), line))
		want := strings.NewReplacer("NS", ns, "NAME", checkpoint).Replace(s.want)
		if r.code != s.code || !strings.Contains(r.stdout+r.stderr, want) {
			t.Fatalf("%s: %s\nexit %d (want %d), output should hold %q:\n%s", s.At, line, r.code, s.code, want, clip(r.stdout+r.stderr))
		}
		t.Logf("%s: %s: exit %d", s.At, line, r.code)
	}
	// What the redirections wrote is what the pages say they hold.
	if b, err := os.ReadFile(filepath.Join(work, "a8.html")); err != nil || !strings.Contains(string(b), sandboxes["coder-7"]) {
		t.Errorf("a8.html: %v, does not name the sandbox", err)
	}
	if b, err := os.ReadFile(filepath.Join(work, "my-agent.yaml")); err != nil || !strings.Contains(string(b), "inherits: coder") {
		t.Errorf("my-agent.yaml: %v:\n%s", err, b)
	}
	k.waitPod(t, ns, "coder-7", time.Minute, "Succeeded after the suspend", func(p kubePod) bool { return p.Status.Phase == "Succeeded" })
	k.waitPod(t, ns, "coder-8", time.Minute, "ended by the stop", func(p kubePod) bool { return p.Status.Phase != "Running" })
}
