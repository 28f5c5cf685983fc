//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKubeSandboxSuspendResume: an agent-sandbox Sandbox whose role keeps
// memory on suspend (suspend: memory) is set to operatingMode Suspended:
// the node agent has the shim checkpoint the pod's sandbox before the pod
// goes, names the checkpoint in the Sandbox's pod template and says so in
// an Event. Set back to Running, its new pod resumes from it: the agent's
// in-memory counter goes on, and the trails link. A Sandbox of another
// namespace naming the checkpoint is refused, and so is a pod of the same
// namespace that names it without being the Sandbox's.
func TestKubeSandboxSuspendResume(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-asb-suspend")
	thief := k.namespace(t, "e2e-asb-thief")
	writeNodePolicy(t, k, "e2e-asb-mem.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-asb-mem}
spec:
  inherits: baseline
  suspend: memory
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-asb-mem}
spec:
  role: e2e-asb-mem
  subjects: [{namespace: %s}, {namespace: %s}]
`, ns, thief))
	sbx := asbSandbox(ns, "counter", "e2e-asb-mem", "sh", "-c", asbCounter)
	sbx["spec"].(obj)["podTemplate"].(obj)["spec"].(obj)["terminationGracePeriodSeconds"] = 30
	first, uid := k.counterSandbox(t, ns, sbx)

	// Suspended: the pod goes, its memory stays.
	last := counts(k.logs(t, ns, "counter"))
	k.mustKubectl(t, "-n", ns, "patch", "sandbox", "counter", "--type=merge", "-p", `{"spec":{"operatingMode":"Suspended"}}`)
	line := k.waitEvent(t, ns, "counter", "Suspended", "saved the agent's memory into checkpoint sb-"+uid)
	t.Logf("%s", line)
	if !eventually(t, 2*time.Minute, func() bool { return k.kubectl("-n", ns, "get", "pod", "counter").code != 0 }) {
		t.Fatal("the suspended Sandbox's pod was not deleted")
	}
	name := k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.spec.podTemplate.metadata.annotations.agentbox\.dev/restore-from}`)
	if !strings.HasPrefix(name, "sb-"+uid+"-") {
		t.Fatalf("the Sandbox's pod template names checkpoint %q", name)
	}
	// No shared store here: the next pod is pinned to this node.
	pin := k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.spec.podTemplate.spec.nodeSelector.kubernetes\.io/hostname}`)
	if pin == "" || pin != k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.metadata.annotations.agentbox\.dev/pinned-to}`) {
		t.Errorf("the suspended Sandbox is not pinned to its node: nodeSelector %q", pin)
	}
	recs := k.trail(t, first)
	cp := findRecord(recs, "agentbox/checkpointed")
	if cp == nil || cp.Detail["checkpoint"] != name || cp.Detail["suspended"] != "true" || !strings.Contains(cp.Detail["reason"], "operatingMode Suspended") {
		t.Fatalf("the suspended pod's checkpoint record: %+v", cp)
	}
	for _, r := range recs {
		if r.Event == "agentbox/container_exit" && !strings.Contains(r.Message, "suspended into checkpoint "+name) {
			t.Errorf("an exit that does not say the suspend: %s", r.Message)
		}
	}

	// Another namespace's Sandbox naming the checkpoint: refused.
	steal := asbSandbox(thief, "thief", "e2e-asb-mem", "sh", "-c", asbCounter)
	steal["spec"].(obj)["podTemplate"].(obj)["metadata"].(obj)["annotations"].(obj)["agentbox.dev/restore-from"] = name
	k.apply(t, steal)
	k.waitSandboxPod(t, thief, "thief")
	t.Logf("another namespace: %s", clip(k.waitEvent(t, thief, "thief", "FailedCreatePodSandBox", "restored only where it was taken")))
	k.kubectl("-n", thief, "delete", "sandbox", "thief", "--wait=false")
	// A pod of the same namespace that names it, and is not the
	// Sandbox's: its restore waits for a proof that never comes.
	forged := podSpec(ns, "forged", "agentbox", "e2e-asb-mem", "sh", "-c", asbCounter)
	forged["metadata"].(obj)["annotations"].(obj)["agentbox.dev/restore-from"] = name
	k.apply(t, forged)
	t.Logf("the same namespace, not the Sandbox's pod: %s", clip(k.waitEvent(t, ns, "forged", "FailedCreatePodSandBox", "did not prove this pod is that Sandbox's")))
	k.kubectl("-n", ns, "delete", "pod", "forged", "--wait=false", "--grace-period=0")

	// Running again: the new pod resumes the agent.
	k.mustKubectl(t, "-n", ns, "patch", "sandbox", "counter", "--type=merge", "-p", `{"spec":{"operatingMode":"Running"}}`)
	k.waitSandboxPod(t, ns, "counter")
	p2 := k.waitPod(t, ns, "counter", 3*time.Minute, "Running", running)
	after := counts(k.waitLogs(t, ns, "counter", "count ", time.Minute))
	if len(last) == 0 || len(after) == 0 || after[0] <= last[len(last)-1] {
		t.Fatalf("the counter did not go on: it was at %v before the suspend, and the resumed pod printed %v", last[max(0, len(last)-1):], after[:min(len(after), 5)])
	}
	t.Logf("suspended after count %d; the resumed pod went on at %d", last[len(last)-1], after[0])
	second := k.sandboxOf(t, p2.Metadata.UID)
	restored := findRecord(k.trail(t, second), "agentbox/restored")
	if restored == nil || restored.Detail["previous_sandbox"] != first || restored.Detail["checkpoint"] != name {
		t.Fatalf("the resumed pod's trail does not link to the suspended one: %+v", restored)
	}
	// Resumed: the template boots afresh from now on, and the image goes.
	k.waitEvent(t, ns, "counter", "Resumed", name, "removed from the node's store")
	if !eventually(t, 30*time.Second, func() bool {
		return k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.spec.podTemplate.metadata.annotations.agentbox\.dev/restore-from}`) == ""
	}) {
		t.Error("the Sandbox's pod template still names the checkpoint")
	}
	if sel := k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.spec.podTemplate.spec.nodeSelector.kubernetes\.io/hostname}{.metadata.annotations.agentbox\.dev/pinned-to}`); sel != "" {
		t.Errorf("the resumed Sandbox is still pinned: %s", sel)
	}
	if _, err := os.Stat(filepath.Join(k.dir, "varlib", "agentbox", "checkpoints", name)); err == nil {
		t.Error("the resumed Sandbox's image is still in the node's store")
	}
}
