//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// sandboxdClient is agent-sandbox's Go SDK example client for sandboxd
// (examples/sandboxd-sandbox/client at the version hack/kube.sh builds):
// it claims a Sandbox from a warm pool through the SDK, writes a file,
// runs commands, reads the file back and deletes the claim.
func sandboxdClient() string {
	return filepath.Join(cacheDir(), "kube", "agent-sandbox-v1.0.1", "bin", "sandboxd-client")
}

// applyRolesFirst applies one of examples/agent-sandbox/ in namespace ns,
// its AgentRoles and bindings first and enforced before the rest, so that
// no pod starts before its node knows its role.
func (k *kubeNode) applyRolesFirst(t *testing.T, file, ns string, roles ...string) {
	t.Helper()
	var first, rest []string
	for _, doc := range strings.Split(exampleIn(t, file, ns), "\n---\n") {
		if strings.Contains(doc, "\nkind: AgentRole") {
			first = append(first, doc)
		} else {
			rest = append(rest, doc)
		}
	}
	for _, docs := range [][]string{first, rest} {
		if r := k.run(time.Minute, []byte(strings.Join(docs, "\n---\n")), "kubectl", "apply", "-f", "-"); r.code != 0 {
			t.Fatalf("kubectl apply %s: %v", file, r)
		}
		for _, role := range roles {
			k.waitPolicy(t, "agentrolebinding", role, "enforced", enforced)
			k.waitPolicy(t, "agentrole", role, "enforced", enforced)
		}
		roles = nil
	}
}

// TestKubeSandboxdSDK: agent-sandbox's SDK flow on agentbox. The guide's
// YAML (examples/agent-sandbox/sandboxd.yaml): a role naming sandboxd's
// two ports for port-forward, a template whose pod runs sandboxd (from
// agent-sandbox's own module) under it, and a warm pool. agent-sandbox's
// Go SDK, in its sandboxd mode (a pod port-forward to 8080 and 9090),
// claims a Sandbox from the pool, writes a file, runs commands, reads the
// file back and deletes the claim. Each command sandboxd ran is a process
// in the sandbox's trail carrying the claim. The twin: the same pool under
// a role that names no port for port-forward, where the SDK cannot reach
// sandboxd and no command runs.
func TestKubeSandboxdSDK(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-asb-sdk")
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "sandboxd-agent", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "sandboxd-agent", "--ignore-not-found")
	})
	k.applyRolesFirst(t, "sandboxd.yaml", ns, "sandboxd-agent")
	k.waitPoolReady(t, ns, "sandboxd", "1")

	cmd := "id -u; echo ran-by-sdk > /workspace/cmd.txt; cat /workspace/cmd.txt"
	r := k.run(3*time.Minute, nil, sandboxdClient(), "-warmpool", "sandboxd", "-namespace", ns, "-file", "greeting.txt", "-cmd", cmd)
	if r.code != 0 {
		t.Fatalf("the SDK's flow: %v", r)
	}
	out := r.stdout
	for _, want := range []string{"run: exit=0", "read back", "content matches", "stdout: 65532\nran-by-sdk"} {
		if !strings.Contains(out, want) {
			t.Errorf("the SDK's output has no %q:\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`created sandbox "([^"]+)" \(claim "([^"]+)"\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the SDK named no sandbox:\n%s", out)
	}
	name, claim := m[1], m[2]
	t.Logf("the SDK claimed %s (claim %s):\n%s", name, claim, out)
	// The claim is gone: the SDK deleted it.
	if !eventually(t, time.Minute, func() bool { return k.kubectl("-n", ns, "get", "sandboxclaim", claim).code != 0 }) {
		t.Errorf("the claim %s is still there after the SDK's delete", claim)
	}

	// The trail: the commands sandboxd ran, each carrying the claim.
	uid := k.podUIDOf(t, ns, name)
	sandbox := k.sandboxOf(t, uid)
	var ran []string
	has := func(pred func(string) bool) bool { return slices.ContainsFunc(ran, pred) }
	file := func(a string) bool { return a == "cat greeting.txt" }
	extra := func(a string) bool { return strings.HasSuffix(a, "-c "+cmd) }
	eventually(t, 30*time.Second, func() bool {
		ran = ran[:0]
		for _, rec := range k.trail(t, sandbox) {
			if rec.Event != "sentry/execve" || rec.Process == nil || len(rec.Process.Argv) == 0 {
				continue
			}
			argv := strings.Join(rec.Process.Argv, " ")
			if file(argv) || extra(argv) {
				if rec.Claim == nil || rec.Claim.Name != claim {
					t.Errorf("sandboxd's command %q carries claim %+v, want %s", argv, rec.Claim, claim)
				}
				ran = append(ran, argv)
			}
		}
		return has(file) && has(extra)
	})
	if !has(file) || !has(extra) {
		t.Fatalf("the trail lacks sandboxd's commands, has: %q", ran)
	}
	t.Logf("in the trail with claim %s: %q", claim, ran)
	// The SDK's port-forward connections, each one record at its end.
	var fwd *record
	eventually(t, 30*time.Second, func() bool {
		fwd = findRecord(k.trail(t, sandbox), "agentbox/port_forward")
		return fwd != nil
	})
	if fwd == nil || fwd.Status != "Success" || (fwd.Detail["port"] != "8080" && fwd.Detail["port"] != "9090") {
		t.Errorf("the port-forward record: %+v", fwd)
	}

	// The twin: the same template under a role without port-forward.
	t.Run("no-port-forward", func(t *testing.T) {
		k.sandboxdTwin(t, ns)
		r := k.run(2*time.Minute, nil, sandboxdClient(), "-warmpool", "sandboxd-closed", "-namespace", ns, "-cmd", "echo must-not-run")
		if r.code == 0 || strings.Contains(r.stdout, "must-not-run") {
			t.Fatalf("the SDK reached sandboxd under a role without port-forward: %v", r)
		}
		t.Logf("refused: %s", clip(lastLines(r.stderr+r.stdout, 3)))
	})
}

// sandboxdTwin starts a warm pool of the sandboxd template under a role
// that inherits sandboxd-agent and names no port for port-forward.
func (k *kubeNode) sandboxdTwin(t *testing.T, ns string) {
	t.Helper()
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "sandboxd-closed", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "sandboxd-closed", "--ignore-not-found")
	})
	k.apply(t,
		obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentRole", "metadata": obj{"name": "sandboxd-closed"},
			"spec": obj{"inherits": "baseline", "filesystem": obj{"writable": []string{"/tmp", "/workspace"}}}},
		obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentRoleBinding", "metadata": obj{"name": "sandboxd-closed"},
			"spec": obj{"role": "sandboxd-closed", "subjects": []obj{{"namespace": ns}}}})
	k.waitPolicy(t, "agentrolebinding", "sandboxd-closed", "enforced", enforced)
	k.waitPolicy(t, "agentrole", "sandboxd-closed", "enforced", enforced)
	var tmpl string
	for _, doc := range strings.Split(exampleIn(t, "sandboxd.yaml", ns), "\n---\n") {
		if strings.Contains(doc, "\nkind: SandboxTemplate") {
			tmpl = strings.NewReplacer("\n  name: sandboxd\n", "\n  name: sandboxd-closed\n",
				"agentbox.dev/role: sandboxd-agent", "agentbox.dev/role: sandboxd-closed").Replace(doc)
		}
	}
	if r := k.run(time.Minute, []byte(tmpl), "kubectl", "apply", "-f", "-"); r.code != 0 || !strings.Contains(tmpl, "sandboxd-closed\n") {
		t.Fatalf("the twin's template: %v\n%s", r, tmpl)
	}
	k.apply(t, obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": obj{"name": "sandboxd-closed", "namespace": ns},
		"spec":     obj{"replicas": 1, "sandboxTemplateRef": obj{"name": "sandboxd-closed"}}})
	k.waitPoolReady(t, ns, "sandboxd-closed", "1")
}

// waitPoolReady waits for a SandboxWarmPool's ready Sandboxes.
func (k *kubeNode) waitPoolReady(t *testing.T, ns, pool, n string) {
	t.Helper()
	if !eventually(t, 3*time.Minute, func() bool {
		r := k.kubectl("-n", ns, "get", "sandboxwarmpool", pool, "-o", "jsonpath={.status.readyReplicas}")
		return strings.TrimSpace(r.stdout) == n
	}) {
		b, _ := os.ReadFile(filepath.Join(k.dir, "logs", "agent-sandbox-controller.log"))
		t.Fatalf("the warm pool %s has no %s ready Sandboxes:\n%s\n%s\ncontroller log:\n%s", pool, n, clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods", "-o", "wide").stdout),
			clip(k.kubectl("-n", ns, "get", "events").stdout), clip(lastLines(string(b), 20)))
	}
}

// podUIDOf is a pod's UID.
func (k *kubeNode) podUIDOf(t *testing.T, ns, name string) string {
	t.Helper()
	return strings.TrimSpace(k.mustKubectl(t, "-n", ns, "get", "pod", name, "-o", "jsonpath={.metadata.uid}"))
}

// lastLines is s's last n lines.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
