//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
)

// claimedRecords checks a claimed sandbox's trail: from the warm pool's
// record on, each record names the pool, until the claim's record, from
// which each names the claim and its task (want); at least one of the
// agent's own records (an exec's processes) is among the latter.
func (k *kubeNode) claimedRecords(t *testing.T, sandbox string, want audit.Claim) {
	t.Helper()
	var recs []record
	var claimedAt, agentRecords int
	eventually(t, 30*time.Second, func() bool {
		recs = k.trail(t, sandbox)
		claimedAt, agentRecords = -1, 0
		for i, r := range recs {
			if r.Event == "agentbox/owner" && r.Detail["holder_kind"] == "SandboxClaim" && claimedAt < 0 {
				claimedAt = i
			}
			if claimedAt >= 0 && i > claimedAt && r.Process != nil && len(r.Process.Argv) > 0 && r.Process.Argv[0] == "sh" {
				agentRecords++
			}
		}
		return claimedAt >= 0 && agentRecords > 0
	})
	if claimedAt < 0 || agentRecords == 0 {
		t.Fatalf("no record of the exec after the claim (claim's record at %d) in %d records", claimedAt, len(recs))
	}
	warm := false
	for i, r := range recs {
		switch {
		case i >= claimedAt:
			if r.Claim == nil || *r.Claim != want || r.WarmPool != "" {
				t.Fatalf("record %d (%s) after the claim carries claim %+v, pool %q; want %+v", i, r.Event, r.Claim, r.WarmPool, want)
			}
		case r.Event == "agentbox/owner" || warm:
			warm = true
			if r.Claim != nil || r.WarmPool != "agents" {
				t.Fatalf("record %d (%s) of the warm Sandbox carries claim %+v, pool %q", i, r.Event, r.Claim, r.WarmPool)
			}
		}
	}
	t.Logf("%d records after the claim carry its task, %d of them the exec's", len(recs)-claimedAt, agentRecords)
}

// claimRefused: a claim with an agentbox.dev/ annotation the broker does
// not understand (a role, which a claim cannot set yet) binds none of its
// identity: the claim's record says why, and no record carries the tenant
// it also named.
func (k *kubeNode) claimRefused(t *testing.T, ns string) {
	t.Helper()
	k.apply(t, obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": obj{"name": "task-2", "namespace": ns, "annotations": obj{"agentbox.dev/tenant": "acme", "agentbox.dev/role": "admin"}},
		"spec":     obj{"warmPoolRef": obj{"name": "agents"}}})
	var name string
	if !eventually(t, 2*time.Minute, func() bool {
		name = strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxclaim", "task-2", "-o", "jsonpath={.status.sandbox.name}").stdout)
		return name != ""
	}) {
		t.Fatalf("the second claim names no Sandbox")
	}
	p := k.waitPod(t, ns, name, time.Minute, "Running", running)
	sandbox := k.sandboxOf(t, p.Metadata.UID)
	owners := k.waitOwners(t, sandbox, "the second claim", func(last record) bool { return last.Detail["holder"] == "task-2" })
	rec := owners[len(owners)-1]
	if !strings.Contains(rec.Detail["claim_refused"], `role "admin" is not defined`) || rec.Claim == nil || rec.Claim.Name != "task-2" ||
		rec.Claim.Tenant != "" || rec.Claim.Subject != "" || rec.Claim.Task != "" {
		t.Fatalf("the refused claim's record: claim %+v, detail %v", rec.Claim, rec.Detail)
	}
	t.Logf("refused: %s", rec.Message)
	if !eventually(t, 30*time.Second, func() bool {
		return strings.Contains(k.kubectl("-n", ns, "get", "events", "--field-selector", "involvedObject.kind=SandboxClaim,involvedObject.name=task-2",
			"-o", "jsonpath={.items[*].reason} {.items[*].message}").stdout, "AgentboxClaimNotBound")
	}) {
		t.Errorf("no AgentboxClaimNotBound event on the claim:\n%s", clip(k.kubectl("-n", ns, "get", "events").stdout))
	}
	for _, r := range k.trail(t, sandbox) {
		if r.Claim != nil && r.Claim.Tenant != "" {
			t.Fatalf("a record of the refused claim carries a tenant: %+v", r)
		}
	}
}

// waitWarm waits until the trail of each of ns's pods has the warm pool's
// owner record: the node agent links a pod to its Sandbox every few
// seconds, and a claim made before that would leave no warm record.
func (k *kubeNode) waitWarm(t *testing.T, ns string) {
	t.Helper()
	uids := strings.Fields(k.mustKubectl(t, "-n", ns, "get", "pods", "-o", "jsonpath={.items[*].metadata.uid}"))
	for _, uid := range uids {
		k.waitOwners(t, k.sandboxOf(t, uid), "the warm pool", func(last record) bool { return last.WarmPool != "" })
	}
}

// claimBound is how long after start the trail of pod's sandbox named
// claim with its task: the time its owner record carries.
func (k *kubeNode) claimBound(t *testing.T, ns, pod, claim string, start time.Time) time.Duration {
	t.Helper()
	sandbox := k.sandboxOf(t, k.mustKubectl(t, "-n", ns, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}"))
	var at time.Time
	if !eventually(t, 30*time.Second, func() bool {
		for _, r := range k.ownerRecords(t, sandbox) {
			if r.Claim != nil && r.Claim.Name == claim && r.Claim.Task == claim {
				at, _ = time.Parse(time.RFC3339Nano, r.Time)
				return true
			}
		}
		return false
	}) || at.IsZero() {
		t.Fatalf("the trail of %s never named claim %s with its task", pod, claim)
	}
	return at.Sub(start)
}

// waitOwners waits up to a minute for sandbox's trail to have owner
// records, the last of which is what (ok), and returns them.
func (k *kubeNode) waitOwners(t *testing.T, sandbox, what string, ok func(last record) bool) []record {
	t.Helper()
	var owners []record
	if !eventually(t, time.Minute, func() bool {
		owners = k.ownerRecords(t, sandbox)
		return len(owners) > 0 && ok(owners[len(owners)-1])
	}) {
		t.Fatalf("the trail of %s names no %s: %+v", sandbox, what, owners)
	}
	return owners
}

// claimOn claims a cold Sandbox (a pool of none) whose template runs its
// pod on node under role, the claim naming tenant, and returns its pod.
func (k *kubeNode) claimOn(t *testing.T, ns, node, role, tenant string) broker.Ref {
	t.Helper()
	name := "on-" + node
	pod := podSpec(ns, name, "agentbox", role, "sh", "-c", "echo ready; exec sleep 3600")
	onNode(pod["spec"].(obj), node)
	k.apply(t,
		obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate", "metadata": obj{"name": name, "namespace": ns},
			"spec": obj{"networkPolicyManagement": "Unmanaged", "podTemplate": obj{"metadata": obj{"annotations": pod["metadata"].(obj)["annotations"]}, "spec": pod["spec"]}}},
		obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool", "metadata": obj{"name": name, "namespace": ns},
			"spec": obj{"replicas": 0, "sandboxTemplateRef": obj{"name": name}}},
		obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
			"metadata": obj{"name": name, "namespace": ns, "annotations": obj{"agentbox.dev/tenant": tenant}},
			"spec":     obj{"warmPoolRef": obj{"name": name}}})
	var sb string
	if !eventually(t, 2*time.Minute, func() bool {
		sb = strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxclaim", name, "-o", "jsonpath={.status.sandbox.name}").stdout)
		return sb != ""
	}) {
		t.Fatalf("claim %s names no Sandbox", name)
	}
	p := k.waitPod(t, ns, sb, 3*time.Minute, "Running", running)
	if p.Spec.NodeName != node {
		t.Fatalf("the claimed pod %s is on %q, not %s", sb, p.Spec.NodeName, node)
	}
	return broker.Ref{Namespace: ns, Name: sb, UID: p.Metadata.UID}
}

// podCPU is the kernel's cpu.idle and cpu.cfs_quota_us of pod uid's
// cgroup on node 1 (where runsc puts its sandbox: the Sentry and gofers),
// whatever its QoS class.
func podCPU(t *testing.T, uid string) (idle, quota string) {
	t.Helper()
	dirs, _ := filepath.Glob("/sys/fs/cgroup/cpu/agentbox-kube/kubepods/*/pod" + uid)
	guaranteed, _ := filepath.Glob("/sys/fs/cgroup/cpu/agentbox-kube/kubepods/pod" + uid)
	if dirs = append(dirs, guaranteed...); len(dirs) != 1 {
		t.Fatalf("pod %s: cgroups %v", uid, dirs)
	}
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(dirs[0], f))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	return read("cpu.idle"), read("cpu.cfs_quota_us")
}

// podMemoryLimit is the memory limit of pod uid's cgroup on node 1.
func podMemoryLimit(t *testing.T, uid string) string {
	t.Helper()
	files, _ := filepath.Glob("/sys/fs/cgroup/memory/agentbox-kube/kubepods/*/pod" + uid + "/memory.limit_in_bytes")
	if len(files) != 1 {
		t.Fatalf("pod %s: memory cgroups %v", uid, files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// warmWaitsIdle: each of ns's warm pods, once ready, is in the idle CPU
// class (its cgroup's cpu.idle 1) and capped at 50m (its quota 5000 of
// 100000), as its owner records say.
func (k *kubeNode) warmWaitsIdle(t *testing.T, ns string) {
	t.Helper()
	for _, uid := range strings.Fields(k.mustKubectl(t, "-n", ns, "get", "pods", "-o", "jsonpath={.items[*].metadata.uid}")) {
		var idle, quota string
		var said string
		if !eventually(t, 30*time.Second, func() bool {
			idle, quota = podCPU(t, uid)
			said = ""
			for _, r := range k.ownerRecords(t, k.sandboxOf(t, uid)) {
				said += r.Detail["cpu_class"] + "; "
			}
			return idle == "1" && quota == "5000" && strings.Contains(said, "idle while the warm pool holds it") && strings.Contains(said, "capped at 50m while it waits ready")
		}) {
			t.Fatalf("warm pod %s: cpu.idle %s, quota %s; its owner records say %q", uid, idle, quota, said)
		}
	}
}
