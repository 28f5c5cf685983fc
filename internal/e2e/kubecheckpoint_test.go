//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKubeSuspendResume: on the cluster, an agent pod is suspended
// (agentbox sandbox suspend --pod, on the node), the pod deleted, and a new
// pod that asks for the checkpoint (agentbox.dev/restore-from) resumes it:
// its counter goes on, and its trail begins with the link to the suspended
// pod's.
func TestKubeSuspendResume(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-cp")
	writeNodePolicy(t, k, "e2e-kube-cp.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-cp}
spec:
  inherits: baseline
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-cp}
spec:
  role: e2e-kube-cp
  subjects: [{namespace: %s}]
`, ns))
	script := `i=0; exec 3>>/tmp/state; while :; do i=$((i+1)); echo "count $i"; echo "count $i" >&3; sleep 0.2; done`
	k.apply(t, podSpec(ns, "agent", "agentbox", "e2e-kube-cp", "sh", "-c", script))
	p := k.waitPod(t, ns, "agent", 3*time.Minute, "Running", running)
	sandbox := k.sandboxOf(t, p.Metadata.UID)
	if logs := k.waitLogs(t, ns, "agent", "count 5\n", 60*time.Second); !strings.Contains(logs, "count 5\n") {
		t.Fatalf("the agent did not count: %s", clip(logs))
	}
	name := uniqueID("kube-cp")
	r := k.run(2*time.Minute, nil, filepath.Join(repoRoot, "hack", "kube.sh"), "node", filepath.Join(repoRoot, "_output", "bin", "agentbox"),
		"sandbox", "suspend", "--config", "/etc/agentbox/config.toml", "--name", name, "--reason", "e2e: the agent waits for a review", "--pod", ns+"/agent")
	if r.code != 0 || !strings.Contains(r.stdout, "suspended into") {
		t.Fatalf("suspend on the node: %v", r)
	}
	k.waitPod(t, ns, "agent", time.Minute, "Succeeded", func(p kubePod) bool { return p.Status.Phase == "Succeeded" })
	before := counts(k.logs(t, ns, "agent"))
	if len(before) < 5 {
		t.Fatalf("counted %v before the suspend", before)
	}
	last := before[len(before)-1]
	k.mustKubectl(t, "-n", ns, "delete", "pod", "agent", "--wait=true")
	resumed := podSpec(ns, "agent-resumed", "agentbox", "e2e-kube-cp", "sh", "-c", script)
	resumed["metadata"].(obj)["annotations"].(obj)["agentbox.dev/restore-from"] = name
	k.apply(t, resumed)
	p2 := k.waitPod(t, ns, "agent-resumed", 3*time.Minute, "Running", running)
	logs := k.waitLogs(t, ns, "agent-resumed", fmt.Sprintf("count %d\n", last+2), 60*time.Second)
	after := counts(logs)
	if len(after) == 0 || after[0] != last+1 {
		t.Fatalf("suspended at %d, the resumed pod printed %v", last, after[:min(len(after), 5)])
	}
	t.Logf("suspended at count %d; the new pod went on at %d", last, after[0])
	recs := k.trail(t, k.sandboxOf(t, p2.Metadata.UID))
	if recs[0].Event != "agentbox/restored" || recs[0].Detail["previous_sandbox"] != sandbox || recs[0].Detail["checkpoint"] != name {
		t.Fatalf("the resumed pod's trail begins with %+v", recs[0])
	}
}
