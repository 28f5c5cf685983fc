//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/checkpoint"
)

// TestKubeNodeRestriction: what an attacker who owns node 1 holds (its node
// agent's service-account token, bound to that agent's pod) gives power over
// node 1's own workloads and nothing more. Each attack is refused, by the
// API server (RBAC, or the node-restriction admission policy) or by the
// broker, with its twin that node 1 may do.
func TestKubeNodeRestriction(t *testing.T) {
	k, n2 := kubeTwoNodes(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-two-nr")
	keys := k.namespace(t, "e2e-two-nr-keys")
	t.Cleanup(func() {
		k.kubectl("delete", "agentquarantine", "e2e-two-nr", "--ignore-not-found")
		k.kubectl("delete", "agentrolebinding", "e2e-two-key", "e2e-two-plain", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "e2e-two-key", "e2e-two-plain", "--ignore-not-found")
	})
	secret := "sk-e2e-node2-" + uniqueID("k")
	k.apply(t, secretObj(keys, "vendor", "token", secret),
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": obj{"name": "agentbox-broker-keys", "namespace": keys},
			"rules": []obj{{"apiGroups": []string{""}, "resources": []string{"secrets"}, "resourceNames": []string{"vendor"}, "verbs": []string{"get"}}}},
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": obj{"name": "agentbox-broker-keys", "namespace": keys},
			"roleRef":  obj{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentbox-broker-keys"},
			"subjects": []obj{{"kind": "ServiceAccount", "name": "agentbox-broker", "namespace": "kube-system"}}})
	k.apply(t,
		agentRole("e2e-two-key", obj{"inherits": "baseline",
			"network":     obj{"egress": "allowlist", "allow": []obj{{"host": "api.two.test", "ports": []int{443}}}},
			"credentials": obj{"secrets": []obj{{"env": "VENDOR_KEY", "secretRef": obj{"namespace": keys, "name": "vendor", "key": "token"}, "inject": obj{"host": "api.two.test", "header": "x-api-key"}}}}}),
		agentBinding("e2e-two-key", "e2e-two-key", ns),
		agentRole("e2e-two-plain", obj{"inherits": "baseline"}), agentBinding("e2e-two-plain", "e2e-two-plain", ns))
	k.activeOnBoth(t, "agentrole", "e2e-two-key")
	k.activeOnBoth(t, "agentrole", "e2e-two-plain")

	// The victim: a Sandbox whose pod runs on node 2 under the role with the
	// key. Node 1's own: a Sandbox on node 1.
	sandboxOn := func(name, role, node string) string {
		sbx := asbSandbox(ns, name, role, "sh", "-c", "echo ready; exec sleep 3600")
		onNode(sbx["spec"].(obj)["podTemplate"].(obj)["spec"].(obj), node)
		k.apply(t, sbx)
		k.waitSandboxPod(t, ns, name)
		if p := k.waitPod(t, ns, name, 3*time.Minute, "Running", running); p.Spec.NodeName != node {
			t.Fatalf("%s is on %q", name, p.Spec.NodeName)
		}
		return k.mustKubectl(t, "-n", ns, "get", "sandbox", name, "-o", "jsonpath={.metadata.uid}")
	}
	victimUID := sandboxOn("victim", "e2e-two-key", node2Name)
	ownUID := sandboxOn("own", "e2e-two-plain", node1Name)

	api := k.nodeToken(t, node1Name, "", false)
	b1 := k.brokerAs(t, k.nodeToken(t, node1Name, broker.Audience, false))
	b2 := k.brokerAs(t, k.nodeToken(t, node2Name, broker.Audience, false))
	refused := func(what string, r result, want string) {
		t.Helper()
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("%s: %v; want a refusal with %q", what, r, want)
		} else {
			t.Logf("%s: refused: %s", what, clip(strings.TrimSpace(r.stderr)))
		}
	}
	works := func(what string, r result) {
		t.Helper()
		if r.code != 0 {
			t.Errorf("the twin, %s: %v", what, r)
		}
	}

	// Sandboxes: node 1 writes none itself, its own included.
	for _, sb := range []string{"victim", "own"} {
		refused("patching Sandbox "+sb+"'s command", k.as(api, nil, "-n", ns, "patch", "sandbox", sb, "--type=merge", "-p",
			`{"spec":{"podTemplate":{"spec":{"containers":[{"name":"agent","command":["sh","-c","id"]}]}}}}`), "forbidden")
	}
	refused("setting another namespace's Sandbox's operatingMode", k.as(api, nil, "-n", ns, "patch", "sandbox", "victim", "--type=merge", "-p",
		`{"spec":{"operatingMode":"Suspended"}}`), "forbidden")

	// Through the broker: the checkpoint annotation and a pin, on its own
	// Sandbox only.
	write := func(c *broker.Client, sb, uid string, pin bool) error {
		_, err := c.WriteSandbox(context.Background(), broker.SandboxWrite{Op: broker.OpSuspended,
			Sandbox: broker.Ref{Namespace: ns, Name: sb, UID: uid}, Checkpoint: fmt.Sprintf("sb-%s-%d", uid, time.Now().Unix()), Pin: pin})
		return err
	}
	for _, pin := range []bool{false, true} {
		if err := write(b1, "victim", victimUID, pin); brokerStatus(err) != 403 || !strings.Contains(err.Error(), "no pod of Sandbox") {
			t.Errorf("node 1 annotating node 2's Sandbox (pin %v): %v", pin, err)
		}
	}
	if err := write(b1, "victim", ownUID, false); brokerStatus(err) != 403 {
		t.Errorf("node 1 naming its own Sandbox's UID for node 2's: %v", err)
	}
	if got := k.mustKubectl(t, "-n", ns, "get", "sandbox", "victim", "-o", `jsonpath={.spec.podTemplate.metadata.annotations.agentbox\.dev/restore-from}|{.spec.podTemplate.spec.nodeSelector.kubernetes\.io/hostname}|{.metadata.annotations.agentbox\.dev/pinned-to}`); got != "|"+node2Name+"|" {
		t.Errorf("node 2's Sandbox was written: %s", got)
	}
	// Its own Sandbox's template selects node 1 already: annotated, and
	// not pinned again.
	if err := write(b1, "own", ownUID, true); err != nil {
		t.Errorf("the twin, node 1 annotating its own Sandbox: %v", err)
	} else if got := k.mustKubectl(t, "-n", ns, "get", "sandbox", "own", "-o", `jsonpath={.spec.podTemplate.metadata.annotations.agentbox\.dev/restore-from}`); !strings.HasPrefix(got, "sb-"+ownUID) {
		t.Errorf("its own Sandbox's checkpoint annotation: %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(k.dir, "logs", "broker.log")); !strings.Contains(string(b), "no pod of Sandbox "+ns+"/victim") {
		t.Error("the broker's log does not record the refusal")
	}

	// A shared image's data key: not for a pod bound to another node.
	fake := &checkpoint.WrappedKey{Version: 1, Scheme: checkpoint.SchemeRSAOAEP, KeyID: "x", Checkpoint: "sb-" + victimUID + "-1", Wrapped: []byte{1}}
	victimPod := broker.Ref{Namespace: ns, Name: "victim", UID: k.mustKubectl(t, "-n", ns, "get", "pod", "victim", "-o", "jsonpath={.metadata.uid}")}
	if _, err := b1.Unwrap(context.Background(), victimPod, fake); brokerStatus(err) != 403 || !strings.Contains(err.Error(), node2Name) {
		t.Errorf("node 1 asking for node 2's pod's data key: %v", err)
	}

	// A claim's task: node 2's claimed pod's identity is node 2's to learn
	// from the broker, not node 1's; node 1 reads no claim itself.
	claimed := k.claimOn(t, ns, node2Name, "e2e-two-plain", "tenant-of-node2")
	if _, err := b1.Claim(context.Background(), claimed); brokerStatus(err) != 403 || !strings.Contains(err.Error(), node2Name) {
		t.Errorf("node 1 asking for node 2's pod's claim: %v", err)
	}
	if got, err := b2.Claim(context.Background(), claimed); err != nil || got.Identity.Tenant != "tenant-of-node2" {
		t.Errorf("the twin, node 2 asking for its own pod's claim: %+v %v", got, err)
	}
	refused("reading SandboxClaims", k.as(api, nil, "-n", ns, "get", "sandboxclaims"), "forbidden")

	// Keys: node 1 holds none of a role whose pod runs only on node 2, and
	// cannot read the Secret; node 2 holds it.
	refused("reading the Secret", k.as(api, nil, "-n", keys, "get", "secret", "vendor"), "forbidden")
	r1, err := b1.Keys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range r1.Keys {
		if key.Namespace == keys || string(key.Value) == secret {
			t.Errorf("the broker gave node 1 %s", key.SecretRef)
		}
	}
	r2, err := b2.Keys(context.Background())
	if err != nil || len(r2.Keys) != 1 || string(r2.Keys[0].Value) != secret {
		t.Errorf("the twin, node 2's keys: %+v %v", r2, err)
	}
	file := filepath.Join("varlib", "agentbox", "secrets", keys, "vendor", "token")
	if !eventually(t, 30*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(n2.dir, file))
		return err == nil && string(b) == secret
	}) {
		t.Error("node 2 does not hold its pod's key")
	}
	if _, err := os.Stat(filepath.Join(k.dir, file)); err == nil {
		t.Error("node 1 holds the key of a role whose pod runs on node 2")
	}

	// Its own objects only: node 2's AgentNodePolicy, node 2's entry of a
	// quarantine, Events in node 2's name.
	digest := k.mustKubectl(t, "get", "agentnodepolicy", node1Name, "-o", "jsonpath={.status.digest}")
	refused("writing node 2's AgentNodePolicy", k.patchStatusAs(api, "agentnodepolicies/"+node2Name, `{"status":{"digest":"sha256:forged"}}`), "may write only its own AgentNodePolicy")
	works("writing its own AgentNodePolicy", k.patchStatusAs(api, "agentnodepolicies/"+node1Name, fmt.Sprintf(`{"status":{"digest":%q}}`, digest)))
	k.apply(t, obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentQuarantine", "metadata": obj{"name": "e2e-two-nr"},
		"spec": obj{"reason": "e2e: nothing matches", "selector": obj{"namespace": ns, "matchLabels": obj{"app": "nobody"}}}})
	refused("writing node 2's entry of a quarantine", k.patchStatusAs(api, "agentquarantines/e2e-two-nr",
		fmt.Sprintf(`{"status":{"nodes":{%q:{"pods":["%s/victim"]}}}}`, node2Name, ns)), "may write only its own entry")
	works("writing its own entry", k.patchStatusAs(api, "agentquarantines/e2e-two-nr", fmt.Sprintf(`{"status":{"nodes":{%q:{"error":"e2e"}}}}`, node1Name)))
	event := func(name, host string) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Event","metadata":{"name":%q,"namespace":%q},"involvedObject":{"kind":"Sandbox","name":"victim","namespace":%q},"reason":"Resumed","message":"forged","source":{"component":"agentbox-sync","host":%q}}`, name, ns, ns, host)
	}
	refused("an Event in node 2's name", k.as(api, event("e2e-forged", node2Name), "create", "-f", "-"), "source.host is itself")
	works("an Event in its own name", k.as(api, event("e2e-own", node1Name), "create", "-f", "-"))

	// A token of the service account bound to nothing writes nothing; one
	// for the API server is not one for the broker, nor the reverse.
	unbound := k.nodeToken(t, node1Name, "", true)
	refused("an Event with an unbound token", k.as(unbound, event("e2e-unbound", node1Name), "create", "-f", "-"), "bound to its pod on a node")
	if _, err := k.brokerAs(t, api).Keys(context.Background()); brokerStatus(err) != 401 {
		t.Errorf("the API server's token at the broker: %v", err)
	}
	refused("the broker's token at the API server", k.as(k.nodeToken(t, node1Name, broker.Audience, false), nil, "get", "pods", "-n", ns), "Unauthorized")
}

// patchStatusAs merge-patches an agentbox.dev object's status with token
// alone, as the node agent writes it (kubectl patch --subresource would
// first read the status, which the node agent may not).
func (k *kubeNode) patchStatusAs(token, object, patch string) result {
	r := k.run(time.Minute, []byte(patch), "curl", "-sS", "--cacert", filepath.Join(k.dir, "pki", "ca.crt"),
		"-H", "Authorization: Bearer "+token, "-H", "Content-Type: application/merge-patch+json", "-X", "PATCH", "--data-binary", "@-",
		"-w", "\n%{http_code}", "https://127.0.0.1:16443/apis/agentbox.dev/v1/"+object+"/status")
	out := strings.TrimSpace(r.stdout)
	i := strings.LastIndexByte(out, '\n')
	body, code := out[:max(i, 0)], out[i+1:]
	if code != "200" {
		var st struct{ Message string }
		if json.Unmarshal([]byte(body), &st) == nil && st.Message != "" {
			body = st.Message
		}
		return result{code: 1, stderr: body + " (HTTP " + code + ")"}
	}
	return result{stdout: body}
}
