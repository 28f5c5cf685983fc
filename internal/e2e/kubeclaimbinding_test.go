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

// TestKubeClaimBinding: a warm pool's role takes a key from its claim
// (fromClaim); the claim names a Secret of its own namespace
// (agentbox.dev/key.vendor) and a role of its task, narrower than the
// pool's (agentbox.dev/role). While the pod waits warm, its request to the
// vendor carries no key, any path passes, and the node holds no key; from
// the claim on, the sandbox runs under the claim's role (a path outside it
// is refused) and the gateway injects the claim's key, which never enters
// the pod or its trail. A claim naming a key its role does not take, or a
// role looser than the pool's, binds nothing of the claim: its pod's
// request carries no key, and the claim gets an Event.
func TestKubeClaimBinding(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-claim-keys")
	const nodeIP = "10.97.0.1"
	origin, caPEM := newAuthOrigin(t, nodeIP, "vendor.kube.test")
	k.inspectedOnBridge(t, nodeIP, caPEM, "vendor.kube.test")
	roles := []string{"e2e-claim-keys", "e2e-claim-task", "e2e-claim-loose"}
	t.Cleanup(func() {
		k.kubectl("-n", ns, "delete", "sandboxclaim,sandboxwarmpool,sandboxtemplate", "--all", "--wait=false")
		k.kubectl(append([]string{"delete", "agentrolebinding", "--ignore-not-found"}, roles...)...)
		k.kubectl(append([]string{"delete", "agentrole", "--ignore-not-found"}, roles...)...)
	})
	key := "sk-e2e-task-" + uniqueID("k")
	k.apply(t, secretObj(ns, "task-keys", "token", key))
	k.brokerMayGet(t, ns, "task-keys")
	vendor := obj{"host": "vendor.kube.test", "ports": []int{origin.port}, "allowPrivate": true}
	task := obj{"host": "vendor.kube.test", "ports": []int{origin.port}, "allowPrivate": true, "http": obj{"paths": []string{"/task/*"}}}
	k.apply(t, agentRole("e2e-claim-keys", obj{"inherits": "baseline",
		"network": obj{"egress": "allowlist", "allow": []obj{vendor}},
		"credentials": obj{"secrets": []obj{{"env": "VENDOR_KEY", "fromClaim": "vendor",
			"inject": obj{"host": "vendor.kube.test", "header": "authorization", "format": "Bearer {secret}"}}}}}),
		agentRole("e2e-claim-task", obj{"inherits": "e2e-claim-keys", "network": obj{"egress": "allowlist", "allow": []obj{task}}}),
		agentRole("e2e-claim-loose", obj{"inherits": "e2e-claim-keys", "network": obj{"egress": "allowlist",
			"allow": []obj{vendor, {"host": "elsewhere.kube.test", "ports": []int{443}}}}}),
		agentBinding("e2e-claim-keys", "e2e-claim-keys", ns), agentBinding("e2e-claim-task", "e2e-claim-task", ns), agentBinding("e2e-claim-loose", "e2e-claim-loose", ns))
	for _, r := range roles {
		k.waitPolicy(t, "agentrole", r, "enforced", enforced)
	}
	k.apply(t, obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate", "metadata": obj{"name": "agent", "namespace": ns},
		"spec": obj{"networkPolicyManagement": "Unmanaged", "podTemplate": obj{
			"metadata": obj{"annotations": obj{"agentbox.dev/role": "e2e-claim-keys"}},
			"spec": obj{"runtimeClassName": "agentbox", "terminationGracePeriodSeconds": 5, "containers": []obj{{
				"name": "agent", "image": probeImage, "imagePullPolicy": "IfNotPresent", "command": []string{"sh", "-c", "echo agent ready; exec sleep 600"}}}}}}},
		obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool", "metadata": obj{"name": "pool", "namespace": ns},
			"spec": obj{"replicas": 2, "sandboxTemplateRef": obj{"name": "agent"}}})
	poolReady := func(what string) {
		t.Helper()
		if !eventually(t, 3*time.Minute, func() bool {
			return strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxwarmpool", "pool", "-o", "jsonpath={.status.readyReplicas}").stdout) == "2"
		}) {
			t.Fatalf("%s: the warm pool has not 2 ready Sandboxes:\n%s", what, clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods", "-o", "wide").stdout))
		}
	}
	poolReady("start")
	k.waitWarm(t, ns)
	warm := strings.Fields(k.mustKubectl(t, "-n", ns, "get", "pods", "-o", "jsonpath={.items[*].metadata.name}"))
	fetch := func(pod, path, want string) {
		t.Helper()
		if out := k.mustKubectl(t, "-n", ns, "exec", pod, "--", "abx-fetch", fmt.Sprintf("https://vendor.kube.test:%d%s", origin.port, path)); !strings.Contains(out, want) {
			t.Fatalf("%s %s: %q, want %s", pod, path, out, want)
		}
	}

	// Warm: the twin request waits for a claim (3 s), then goes with no
	// key, on any path, and says so; the node holds no key.
	for _, w := range warm {
		k.waitLogs(t, ns, w, "agent ready", time.Minute)
		fetch(w, "/warm", "status=200")
		var rec *record
		for _, r := range k.trail(t, k.sandboxOf(t, k.mustKubectl(t, "-n", ns, "get", "pod", w, "-o", "jsonpath={.metadata.uid}"))) {
			if r.Event == "agentbox/egress_request" && r.Detail["path"] == "/warm" {
				rec = &r
			}
		}
		if rec == nil || !strings.HasPrefix(rec.Detail["claim_key"], "none") || rec.Detail["injected"] != "" {
			t.Fatalf("the warm request's record: %+v", rec)
		}
	}
	if got := origin.auth("/warm"); strings.Contains(got, key) || strings.HasPrefix(got, "Bearer sk-") {
		t.Fatalf("a warm pod's request carries a key: %q", got)
	}
	file := filepath.Join(k.dir, "varlib", "agentbox", "secrets", ns, "task-keys", "token")
	if _, err := os.Stat(file); err == nil {
		t.Fatalf("the node holds the task's key before any claim: %s", file)
	}

	// Claimed: the claim's role and key from its owner record on.
	name, sandbox := k.claimOf(t, ns, "task-1", "pool", obj{"agentbox.dev/task": "t-1", "agentbox.dev/role": "e2e-claim-task", "agentbox.dev/key.vendor": "task-keys/token"})
	// The claimed agent's first request, at once: it carries the claim's
	// key even if it races the claim's binding (the gateway holds it).
	fetch(name, "/task/1", "status=200")
	if got := origin.auth("/task/1"); got != "Bearer "+key {
		t.Fatalf("the claimed agent's first request carries %q, want the claim's key", got)
	}
	owners := k.waitOwners(t, sandbox, "the claim", func(last record) bool { return last.Detail["holder"] == "task-1" })
	rec := owners[len(owners)-1]
	if rec.Claim == nil || rec.Claim.Task != "t-1" || rec.Detail["claim_refused"] != "" || rec.Role != "e2e-claim-task" || rec.Detail["claim_role"] != "e2e-claim-task" ||
		!strings.Contains(rec.Detail["claim_role_applied"], "narrowed") ||
		rec.Detail["claim_keys"] != "vendor="+ns+"/task-keys[token] as Authorization toward vendor.kube.test" {
		t.Fatalf("the claim's record: role %q, claim %+v, detail %v", rec.Role, rec.Claim, rec.Detail)
	}
	// The pool's role allowed this path; the claim's does not.
	fetch(name, "/claimed", "status=403")
	if got := origin.auth("/claimed"); got != "" {
		t.Fatalf("a path outside the claim's role reached the vendor (with %q)", got)
	}
	env := k.mustKubectl(t, "-n", ns, "exec", name, "--", "sh", "-c", "echo $VENDOR_KEY")
	if !strings.HasPrefix(env, "agentbox-placeholder-") {
		t.Errorf("the pod's VENDOR_KEY: %q", env)
	}
	b, err := os.ReadFile(filepath.Join(k.dir, "varlog", "agentbox", "audit", sandbox+".jsonl"))
	if err != nil || strings.Contains(string(b), key) {
		t.Errorf("the trail holds the claim's key (%v)", err)
	}
	for _, r := range k.trail(t, sandbox) {
		if r.Seq > rec.Seq && r.Role != "e2e-claim-task" {
			t.Errorf("a record after the claim names role %q: %s %s", r.Role, r.Event, r.Message)
			break
		}
	}

	// What binds nothing: a key its role does not take (the broker
	// refuses), a role looser than the pool's (the shim refuses).
	for _, c := range []struct{ claim, annotation, value, why string }{
		{"task-2", "agentbox.dev/key.admin", "task-keys/token", `has no secret with fromClaim: admin`},
		{"task-3", "agentbox.dev/role", "e2e-claim-loose", `role e2e-claim-loose is not as tight as what the sandbox runs under: allow[1] host elsewhere.kube.test ports [443] (loosens)`},
	} {
		poolReady(c.claim)
		other, otherSandbox := k.claimOf(t, ns, c.claim, "pool", obj{"agentbox.dev/task": c.claim, "agentbox.dev/key.vendor": "task-keys/token", c.annotation: c.value})
		owners = k.waitOwners(t, otherSandbox, c.claim, func(last record) bool { return last.Detail["holder"] == c.claim })
		rec = owners[len(owners)-1]
		if !strings.Contains(rec.Detail["claim_refused"], c.why) || rec.Claim == nil || rec.Claim.Task != "" || rec.Detail["claim_keys"] != "" || rec.Role != "e2e-claim-keys" {
			t.Fatalf("%s's record: role %q, claim %+v, detail %v", c.claim, rec.Role, rec.Claim, rec.Detail)
		}
		k.waitLogs(t, ns, other, "agent ready", time.Minute)
		fetch(other, "/"+c.claim, "status=200")
		if got := origin.auth("/" + c.claim); strings.Contains(got, key) {
			t.Fatalf("%s: the request carries the key: %q", c.claim, got)
		}
		if !eventually(t, 30*time.Second, func() bool {
			return strings.Contains(k.kubectl("-n", ns, "get", "events", "--field-selector", "involvedObject.kind=SandboxClaim,involvedObject.name="+c.claim,
				"-o", "jsonpath={.items[*].reason}").stdout, "AgentboxClaimNotBound")
		}) {
			t.Errorf("no AgentboxClaimNotBound event on %s", c.claim)
		}
		t.Logf("%s refused: %s", c.claim, rec.Detail["claim_refused"])
	}

	// A fork of a claimed agent: its copy is no claim's, and holds none
	// of the claim's keys.
	poolReady("task-4")
	k.forkHoldsNoClaimKey(t, ns, origin, key, fetch)
}
