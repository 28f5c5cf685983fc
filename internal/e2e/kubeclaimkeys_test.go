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

// brokerMayGet lets the cluster's broker get the named Secrets of ns, and
// no other.
func (k *kubeNode) brokerMayGet(t *testing.T, ns string, names ...string) {
	t.Helper()
	k.apply(t, obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": obj{"name": "agentbox-broker-keys", "namespace": ns},
		"rules": []obj{{"apiGroups": []string{""}, "resources": []string{"secrets"}, "resourceNames": names, "verbs": []string{"get"}}}},
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": obj{"name": "agentbox-broker-keys", "namespace": ns},
			"roleRef":  obj{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentbox-broker-keys"},
			"subjects": []obj{{"kind": "ServiceAccount", "name": "agentbox-broker", "namespace": "kube-system"}}})
}

// claimOf applies a SandboxClaim of pool in ns and waits for the pod of
// the Sandbox it names to run; it gives the pod's name and its sandbox.
func (k *kubeNode) claimOf(t *testing.T, ns, claim, pool string, annotations obj) (string, string) {
	t.Helper()
	k.apply(t, obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": obj{"name": claim, "namespace": ns, "annotations": annotations},
		"spec":     obj{"warmPoolRef": obj{"name": pool}}})
	var name string
	if !eventually(t, 2*time.Minute, func() bool {
		name = strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxclaim", claim, "-o", "jsonpath={.status.sandbox.name}").stdout)
		return name != ""
	}) {
		t.Fatalf("claim %s names no Sandbox:\n%s", claim, clip(k.kubectl("-n", ns, "get", "sandboxclaim", claim, "-o", "yaml").stdout))
	}
	p := k.waitPod(t, ns, name, time.Minute, "Running", running)
	return name, k.sandboxOf(t, p.Metadata.UID)
}

// TestKubeClaimKeys: a warm pool's role takes a key from its claim
// (fromClaim); the claim names a Secret of its own namespace
// (agentbox.dev/key.vendor). While the pod waits warm, its request to the
// vendor carries no key and the node holds none; from the claim on, the
// gateway injects the claim's key, which never enters the pod or its
// trail. A claim naming a key the role does not take binds nothing of the
// claim: its pod's request carries no key, and the claim gets an Event.
func TestKubeClaimKeys(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-claim-keys")
	const nodeIP = "10.97.0.1"
	origin, caPEM := newAuthOrigin(t, nodeIP, "vendor.kube.test")
	k.inspectedOnBridge(t, nodeIP, caPEM, "vendor.kube.test")
	t.Cleanup(func() {
		k.kubectl("-n", ns, "delete", "sandboxclaim,sandboxwarmpool,sandboxtemplate", "--all", "--wait=false")
		k.kubectl("delete", "agentrolebinding", "e2e-claim-keys", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "e2e-claim-keys", "--ignore-not-found")
	})
	key := "sk-e2e-task-" + uniqueID("k")
	k.apply(t, secretObj(ns, "task-keys", "token", key))
	k.brokerMayGet(t, ns, "task-keys")
	k.apply(t, agentRole("e2e-claim-keys", obj{"inherits": "baseline",
		"network": obj{"egress": "allowlist", "allow": []obj{{"host": "vendor.kube.test", "ports": []int{origin.port}, "allowPrivate": true}}},
		"credentials": obj{"secrets": []obj{{"env": "VENDOR_KEY", "fromClaim": "vendor",
			"inject": obj{"host": "vendor.kube.test", "header": "authorization", "format": "Bearer {secret}"}}}}}),
		agentBinding("e2e-claim-keys", "e2e-claim-keys", ns))
	k.waitPolicy(t, "agentrole", "e2e-claim-keys", "enforced", enforced)
	k.apply(t, obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate", "metadata": obj{"name": "agent", "namespace": ns},
		"spec": obj{"networkPolicyManagement": "Unmanaged", "podTemplate": obj{
			"metadata": obj{"annotations": obj{"agentbox.dev/role": "e2e-claim-keys"}},
			"spec": obj{"runtimeClassName": "agentbox", "terminationGracePeriodSeconds": 5, "containers": []obj{{
				"name": "agent", "image": probeImage, "imagePullPolicy": "IfNotPresent", "command": []string{"sh", "-c", "echo agent ready; exec sleep 600"}}}}}}},
		obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool", "metadata": obj{"name": "pool", "namespace": ns},
			"spec": obj{"replicas": 1, "sandboxTemplateRef": obj{"name": "agent"}}})
	if !eventually(t, 3*time.Minute, func() bool {
		return strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxwarmpool", "pool", "-o", "jsonpath={.status.readyReplicas}").stdout) == "1"
	}) {
		t.Fatalf("the warm pool has no ready Sandbox:\n%s", clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods", "-o", "wide").stdout))
	}
	k.waitWarm(t, ns)
	warm := strings.TrimSpace(k.mustKubectl(t, "-n", ns, "get", "pods", "-o", "jsonpath={.items[0].metadata.name}"))
	k.waitLogs(t, ns, warm, "agent ready", time.Minute)
	fetch := func(pod, path string) {
		t.Helper()
		if out := k.mustKubectl(t, "-n", ns, "exec", pod, "--", "abx-fetch", fmt.Sprintf("https://vendor.kube.test:%d%s", origin.port, path)); !strings.Contains(out, "status=200") {
			t.Fatalf("%s %s: %q", pod, path, out)
		}
	}

	// Warm: the twin request carries no key, and the node holds none.
	fetch(warm, "/warm")
	if got := origin.auth("/warm"); strings.Contains(got, key) || strings.HasPrefix(got, "Bearer sk-") {
		t.Fatalf("a warm pod's request carries a key: %q", got)
	}
	file := filepath.Join(k.dir, "varlib", "agentbox", "secrets", ns, "task-keys", "token")
	if _, err := os.Stat(file); err == nil {
		t.Fatalf("the node holds the task's key before any claim: %s", file)
	}

	// Claimed: the claim's key from its owner record on.
	name, sandbox := k.claimOf(t, ns, "task-1", "pool", obj{"agentbox.dev/task": "t-1", "agentbox.dev/key.vendor": "task-keys/token"})
	if name != warm {
		t.Fatalf("the claim took %s, not the warm %s", name, warm)
	}
	owners := k.waitOwners(t, sandbox, "the claim", func(last record) bool { return last.Detail["holder"] == "task-1" })
	rec := owners[len(owners)-1]
	if rec.Claim == nil || rec.Claim.Task != "t-1" || rec.Detail["claim_refused"] != "" ||
		rec.Detail["claim_keys"] != "vendor="+ns+"/task-keys[token] as Authorization toward vendor.kube.test" {
		t.Fatalf("the claim's record: claim %+v, detail %v", rec.Claim, rec.Detail)
	}
	fetch(name, "/claimed")
	if got := origin.auth("/claimed"); got != "Bearer "+key {
		t.Fatalf("the claimed agent's request carries %q, want the claim's key", got)
	}
	env := k.mustKubectl(t, "-n", ns, "exec", name, "--", "sh", "-c", "echo $VENDOR_KEY")
	if !strings.HasPrefix(env, "agentbox-placeholder-") {
		t.Errorf("the pod's VENDOR_KEY: %q", env)
	}
	if b, err := os.ReadFile(filepath.Join(k.dir, "varlog", "agentbox", "audit", sandbox+".jsonl")); err != nil || strings.Contains(string(b), key) {
		t.Errorf("the trail holds the claim's key (%v)", err)
	}

	// A claim naming a key its role does not take binds nothing.
	if !eventually(t, 3*time.Minute, func() bool {
		return strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxwarmpool", "pool", "-o", "jsonpath={.status.readyReplicas}").stdout) == "1"
	}) {
		t.Fatalf("the warm pool did not refill:\n%s", clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods").stdout))
	}
	other, otherSandbox := k.claimOf(t, ns, "task-2", "pool", obj{"agentbox.dev/task": "t-2", "agentbox.dev/key.vendor": "task-keys/token", "agentbox.dev/key.admin": "task-keys/token"})
	owners = k.waitOwners(t, otherSandbox, "the second claim", func(last record) bool { return last.Detail["holder"] == "task-2" })
	rec = owners[len(owners)-1]
	if !strings.Contains(rec.Detail["claim_refused"], `has no secret with fromClaim: admin`) || rec.Claim == nil || rec.Claim.Task != "" || rec.Detail["claim_keys"] != "" {
		t.Fatalf("the refused claim's record: claim %+v, detail %v", rec.Claim, rec.Detail)
	}
	k.waitLogs(t, ns, other, "agent ready", time.Minute)
	fetch(other, "/refused")
	if got := origin.auth("/refused"); strings.Contains(got, key) {
		t.Fatalf("the refused claim's request carries the key: %q", got)
	}
	if !eventually(t, 30*time.Second, func() bool {
		return strings.Contains(k.kubectl("-n", ns, "get", "events", "--field-selector", "involvedObject.kind=SandboxClaim,involvedObject.name=task-2",
			"-o", "jsonpath={.items[*].reason}").stdout, "AgentboxClaimNotBound")
	}) {
		t.Errorf("no AgentboxClaimNotBound event on the refused claim")
	}
	t.Logf("bound: %s; refused: %s", owners[0].Message, rec.Detail["claim_refused"])
}
