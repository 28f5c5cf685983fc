//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	log := filepath.Join(t.TempDir(), "agent-sandbox.log")
	if err := kubeScript(log, "agent-sandbox"); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("hack/kube.sh agent-sandbox: %v\n%s", err, clip(string(b)))
	}
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
