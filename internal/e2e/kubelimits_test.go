//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestKubeRoleLimits: a role's memory and CPU limits hold in a Kubernetes
// pod. The kubelet makes a pod's cgroup before the runtime runs, and runsc
// sets limits only on a cgroup it makes, so the shim writes the role's on
// the pod's. A pod under a role of 256 MiB that allocates 600 MiB is
// OOM-killed (137, OOMKilled), though its BestEffort pod has no limit of
// its own; its twin that allocates 64 MiB holds them and exits 0, its
// pod's cgroup holding the role's 256 MiB and 1 CPU (baseline's).
func TestKubeRoleLimits(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "e2e-kube-limits")
	writeNodePolicy(t, k, "e2e-kube-limits.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-limits}
spec:
  inherits: baseline
  limits: {memory: 256Mi}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-limits}
spec:
  role: e2e-kube-limits
  subjects: [{namespace: %s}]
`, ns))
	pod := func(name, script string) obj {
		p := podSpec(ns, name, "agentbox", "e2e-kube-limits", "sh", "-c", script)
		p["spec"].(obj)["containers"].([]obj)[0]["image"] = probeImage
		return p
	}
	k.apply(t, pod("bomb", "exec abx-probe alloc 600"), pod("twin", "abx-probe alloc 64 && exec sleep 600"))
	tw := k.waitPod(t, ns, "twin", 2*time.Minute, "Running", running)
	if !eventually(t, time.Minute, func() bool { return strings.Contains(k.kubectl("-n", ns, "logs", "twin").stdout, "held 64 MiB") }) {
		t.Fatalf("the twin did not hold 64 MiB: %q", k.kubectl("-n", ns, "logs", "twin").stdout)
	}
	mem := podMemoryLimit(t, tw.Metadata.UID)
	_, quota := podCPU(t, tw.Metadata.UID)
	if mem != fmt.Sprint(256<<20) || quota != "100000" {
		t.Errorf("the twin's pod cgroup: memory limit %s, CPU quota %s; want the role's 256 MiB and 1 CPU", mem, quota)
	}
	b := k.waitPod(t, ns, "bomb", 2*time.Minute, "terminated", terminated)
	if st := b.Status.ContainerStatuses[0].State.Terminated; st.ExitCode != 137 || st.Reason != "OOMKilled" {
		t.Fatalf("the bomb: exit %d, reason %q; want 137, OOMKilled", st.ExitCode, st.Reason)
	}
	if strings.Contains(k.kubectl("-n", ns, "logs", "bomb").stdout, "held") {
		t.Fatal("the bomb held 600 MiB under a role of 256 MiB")
	}
}
