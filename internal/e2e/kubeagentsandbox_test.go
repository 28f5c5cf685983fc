//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

// asbSandbox is an agent-sandbox Sandbox whose pod template runs under the
// agentbox RuntimeClass and names role (as a SandboxTemplate would).
func asbSandbox(ns, name, role string, argv ...string) obj {
	pod := podSpec(ns, name, "agentbox", role, argv...)
	meta := pod["metadata"].(obj)
	return obj{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": obj{"name": name, "namespace": ns},
		"spec": obj{"podTemplate": obj{
			"metadata": obj{"annotations": meta["annotations"]},
			"spec":     pod["spec"],
		}},
	}
}

// TestKubeAgentSandbox: kubernetes-sigs/agent-sandbox's own controller
// (built from the Go module proxy, hack/kube.sh agent-sandbox) makes a
// Sandbox's pod, and agentbox runs it under the role its template names:
// the trail names the role and the pod the controller made. A Sandbox
// whose template names a role not bound in its namespace gets no running
// pod, with the refusal in the pod's events.
func TestKubeAgentSandbox(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-asb")
	writeNodePolicy(t, k, "e2e-asb.yaml", `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-asb}
spec:
  inherits: baseline
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-asb}
spec:
  role: e2e-asb
  subjects: [{namespace: e2e-asb}]
`)
	k.apply(t, asbSandbox(ns, "agent", "e2e-asb", "sh", "-c", "echo started; exec sleep 600"))
	k.waitSandboxPod(t, ns, "agent")
	p := k.waitPod(t, ns, "agent", 3*time.Minute, "Running", running)
	if owner := k.mustKubectl(t, "-n", ns, "get", "pod", "agent", "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"); owner != "Sandbox/agent" {
		t.Errorf("the pod's owner is %q, want the Sandbox", owner)
	}
	k.waitLogs(t, ns, "agent", "started", time.Minute)
	sandbox := k.sandboxOf(t, p.Metadata.UID)
	var resolved *record
	for _, r := range k.trail(t, sandbox) {
		if r.Event == "agentbox/role_resolved" {
			resolved = &r
		}
	}
	if resolved == nil || resolved.Role != "e2e-asb" || resolved.PodNS != ns || resolved.PodName != "agent" {
		t.Errorf("the trail's role record: %+v", resolved)
	}
	// The node agent names the Sandbox in the trail, by its UID.
	uid := k.mustKubectl(t, "-n", ns, "get", "sandbox", "agent", "-o", "jsonpath={.metadata.uid}")
	var owners []record
	if !eventually(t, time.Minute, func() bool { owners = k.ownerRecords(t, sandbox); return len(owners) > 0 }) {
		t.Errorf("the trail names no Sandbox")
	} else if o := owners[0]; o.Detail["sandbox_object"] != ns+"/agent" || o.Detail["sandbox_uid"] != uid || o.Detail["holder_kind"] != "" {
		t.Errorf("the owner record: %+v", o)
	}
	if !eventually(t, time.Minute, func() bool {
		r := k.kubectl("-n", ns, "get", "sandbox", "agent", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return strings.TrimSpace(r.stdout) == "True"
	}) {
		t.Errorf("the Sandbox is not Ready:\n%s", clip(k.kubectl("-n", ns, "get", "sandbox", "agent", "-o", "yaml").stdout))
	}

	// Its twin under a role the namespace is not bound to: no running pod.
	k.apply(t, asbSandbox(ns, "unbound", "coder", "sh", "-c", "echo started; exec sleep 600"))
	k.waitSandboxPod(t, ns, "unbound")
	line := k.waitEvent(t, ns, "unbound", "FailedCreatePodSandBox", `role "coder"`, "not bound")
	t.Logf("refused: %s", clip(line))
	if p := k.pod(t, ns, "unbound"); p.Status.Phase == "Running" {
		t.Error("a Sandbox under an unbound role runs")
	}
}

// waitSandboxPod waits for agent-sandbox's controller to make the
// Sandbox's pod (named after it).
func (k *kubeNode) waitSandboxPod(t *testing.T, ns, name string) {
	t.Helper()
	if !eventually(t, 2*time.Minute, func() bool { return k.kubectl("-n", ns, "get", "pod", name).code == 0 }) {
		b, _ := os.ReadFile(filepath.Join(k.dir, "logs", "agent-sandbox-controller.log"))
		t.Fatalf("no pod for Sandbox %s/%s:\n%s\ncontroller log:\n%s", ns, name,
			clip(k.kubectl("-n", ns, "get", "sandbox", name, "-o", "yaml").stdout), clip(string(b)))
	}
}

// applyExample applies one of examples/agent-sandbox/ as the guide shows
// it, in namespace ns instead of "agents".
func (k *kubeNode) applyExample(t *testing.T, file, ns string) {
	t.Helper()
	if r := k.run(time.Minute, []byte(exampleIn(t, file, ns)), "kubectl", "apply", "-f", "-"); r.code != 0 {
		t.Fatalf("kubectl apply %s: %v", file, r)
	}
}

// exampleIn is one of examples/agent-sandbox/ in namespace ns instead of
// "agents".
func exampleIn(t *testing.T, file, ns string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "examples", "agent-sandbox", file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "namespace: agents", "namespace: "+ns)
}

// ownerRecords are the agentbox/owner records of a sandbox's trail.
func (k *kubeNode) ownerRecords(t *testing.T, sandbox string) []record {
	var out []record
	for _, r := range k.trail(t, sandbox) {
		if r.Event == "agentbox/owner" {
			out = append(out, r)
		}
	}
	return out
}

// TestKubeAgentSandboxClaim: the guide's YAML (examples/agent-sandbox),
// applied as it is but for the namespace: an AgentRole and its binding, a
// SandboxTemplate under the agentbox RuntimeClass naming that role, a
// SandboxWarmPool of it and a SandboxClaim. agent-sandbox's controller
// starts the warm Sandboxes through agentbox, under the role; the claim
// takes one; the node agent tells its shim, and the trail names the
// Sandbox (by UID) kept warm by the pool, then claimed by the claim.
func TestKubeAgentSandboxClaim(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-asb-pool")
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "sandbox-agent", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "sandbox-agent", "--ignore-not-found")
	})
	k.applyExample(t, "role.yaml", ns)
	k.waitPolicy(t, "agentrolebinding", "sandbox-agent", "enforced", enforced)
	k.waitPolicy(t, "agentrole", "sandbox-agent", "enforced", enforced)
	k.applyExample(t, "template.yaml", ns)
	k.applyExample(t, "warmpool.yaml", ns)
	k.waitPoolReady(t, ns, "agents", "2")

	// Each warm pod's trail says it is warm before any claim, and it waits
	// in the idle CPU class.
	k.waitWarm(t, ns)
	k.warmWaitsIdle(t, ns)
	k.applyExample(t, "claim.yaml", ns)
	var name string
	if !eventually(t, 2*time.Minute, func() bool {
		name = strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxclaim", "task-1", "-o", "jsonpath={.status.sandbox.name}").stdout)
		return name != ""
	}) {
		t.Fatalf("the claim names no Sandbox:\n%s", clip(k.kubectl("-n", ns, "get", "sandboxclaim", "task-1", "-o", "yaml").stdout))
	}
	claimUID := k.mustKubectl(t, "-n", ns, "get", "sandboxclaim", "task-1", "-o", "jsonpath={.metadata.uid}")
	sbUID := k.mustKubectl(t, "-n", ns, "get", "sandbox", name, "-o", "jsonpath={.metadata.uid}")
	if launch := k.mustKubectl(t, "-n", ns, "get", "sandbox", name, "-o", `jsonpath={.metadata.labels.agents\.x-k8s\.io/launch-type}`); launch != "warm" {
		t.Errorf("the claim's Sandbox %s was launched %q, not from the warm pool", name, launch)
	}
	p := k.waitPod(t, ns, name, time.Minute, "Running", running)
	k.waitLogs(t, ns, name, "agent ready", time.Minute)
	sandbox := k.sandboxOf(t, p.Metadata.UID)

	// The trail: the role, then the Sandbox kept warm by the pool, then
	// claimed by the claim.
	owners := k.waitOwners(t, sandbox, "a claim", func(last record) bool { return last.Detail["holder_kind"] == "SandboxClaim" })
	claimed := owners[len(owners)-1]
	if claimed.Detail["sandbox_object"] != ns+"/"+name || claimed.Detail["sandbox_uid"] != sbUID ||
		claimed.Detail["holder"] != "task-1" || claimed.Detail["holder_uid"] != claimUID || claimed.Detail["previous_holder"] != "SandboxWarmPool agents" {
		t.Errorf("the claim's record: %+v", claimed)
	}
	if warm := owners[0]; warm.Detail["holder_kind"] != "SandboxWarmPool" || warm.Detail["holder"] != "agents" || warm.Detail["sandbox_uid"] != sbUID {
		t.Errorf("the warm Sandbox's record: %+v", warm)
	}
	t.Logf("trail: %s", claimed.Message)
	// From the claim, the agent is back in the normal CPU class, with
	// the bandwidth it had: the role's 1 CPU, which the shim put on the
	// kubelet's pod cgroup with the role's 512 MiB (runsc sets no limit on
	// a cgroup it did not make).
	if idle, quota := podCPU(t, p.Metadata.UID); idle != "0" || quota != "100000" || !strings.HasPrefix(claimed.Detail["cpu_class"], "normal") ||
		!strings.Contains(claimed.Detail["cpu_class"], "uncapped: 1000m") {
		t.Errorf("the claimed pod: cpu.idle %s, quota %s; its record's cpu_class %q", idle, quota, claimed.Detail["cpu_class"])
	}
	if mem := podMemoryLimit(t, p.Metadata.UID); mem != fmt.Sprint(512<<20) {
		t.Errorf("the claimed pod's cgroup: memory limit %s, want the role's 512 MiB", mem)
	}
	for _, r := range k.trail(t, sandbox) {
		if r.Event == "agentbox/role_resolved" && (r.Role != "sandbox-agent" || r.PodNS != ns || r.PodName != name) {
			t.Errorf("the role record: %+v", r)
		}
	}
	// The claim's task, from its annotations through the broker: on the
	// claim's record and every record after it; the warm pool's before.
	want := audit.Claim{Name: "task-1", UID: claimUID, Subject: "alice@example.com", Tenant: "acme", Task: "fix-build-42"}
	if claimed.Claim == nil || *claimed.Claim != want || claimed.WarmPool != "" {
		t.Errorf("the claim's record carries %+v (pool %q), want %+v", claimed.Claim, claimed.WarmPool, want)
	}
	if warm := owners[0]; warm.Claim != nil || warm.WarmPool != "agents" {
		t.Errorf("the warm Sandbox's record carries claim %+v, pool %q", warm.Claim, warm.WarmPool)
	}
	// The agent answers an exec under its role's limits.
	if out := k.mustKubectl(t, "-n", ns, "exec", name, "--", "sh", "-c", "id -u; touch /etc/x 2>&1 || echo read-only"); !strings.Contains(out, "65532") || !strings.Contains(out, "read-only") {
		t.Errorf("exec in the claimed agent: %q", out)
	}
	k.claimedRecords(t, sandbox, want)
	// The pool refills.
	if !eventually(t, 3*time.Minute, func() bool {
		r := k.kubectl("-n", ns, "get", "sandboxwarmpool", "agents", "-o", "jsonpath={.status.readyReplicas}")
		return strings.TrimSpace(r.stdout) == "2"
	}) {
		t.Errorf("the warm pool did not refill:\n%s", clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods").stdout))
	}
	k.claimRefused(t, ns)
}

// agentSandbox installs kubernetes-sigs/agent-sandbox's CRDs and controller
// on the cluster (hack/kube.sh agent-sandbox: cached, and a no-op when it
// runs).
func (k *kubeNode) agentSandbox(t *testing.T) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "agent-sandbox.log")
	if err := kubeScript(log, "agent-sandbox"); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("hack/kube.sh agent-sandbox: %v\n%s", err, clip(string(b)))
	}
}
