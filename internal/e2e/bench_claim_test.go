//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var claimsGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}

// claimReady polls a SandboxClaim every 10 ms until its Ready condition is
// True, and returns its Sandbox's name.
func claimReady(ctx context.Context, c dynamic.Interface, ns, name string) (string, error) {
	for {
		u, err := c.Resource(claimsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			sb, _, _ := unstructured.NestedString(u.Object, "status", "sandbox", "name")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Ready" && m["status"] == "True" && sb != "" {
					return sb, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("claim %s/%s not ready: %w", ns, name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// benchRole writes a node role name (baseline, with a wall clock of 2
// hours) bound to namespaces.
func benchRole(t *testing.T, k *kubeNode, name string, namespaces ...string) {
	t.Helper()
	var subjects []string
	for _, ns := range namespaces {
		subjects = append(subjects, "{namespace: "+ns+"}")
	}
	writeNodePolicy(t, k, name+".yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: %[1]s}
spec:
  inherits: baseline
  limits: {wallClock: 2h}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: %[1]s}
spec:
  role: %[1]s
  subjects: [%[2]s]
`, name, strings.Join(subjects, ", ")))
}

// sandboxTemplate is a SandboxTemplate in ns whose pod runs argv under
// runtimeClass and role.
func sandboxTemplate(ns, name, runtimeClass, role string, argv ...string) obj {
	pod := podSpec(ns, name, runtimeClass, role, argv...)
	return obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": obj{"name": name, "namespace": ns},
		"spec": obj{"networkPolicyManagement": "Unmanaged", "podTemplate": obj{
			"metadata": obj{"annotations": pod["metadata"].(obj)["annotations"]}, "spec": pod["spec"]}}}
}

// warmPool is a SandboxWarmPool in ns of replicas Sandboxes of template
// tmpl.
func warmPool(ns, name, tmpl string, replicas int) obj {
	return obj{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": obj{"name": name, "namespace": ns}, "spec": obj{"replicas": replicas, "sandboxTemplateRef": obj{"name": tmpl}}}
}

// TestBenchmarkClaim: agent-sandbox's SandboxClaim to the agent answering
// an exec, on the hack/kube.sh cluster, interleaved: from a warm pool of
// agentbox Sandboxes, a cold agentbox Sandbox, one whose role names a
// template (restored from a checkpoint of the agent instead of booting),
// and a cold runc Sandbox (the reference). Each round's claim-to-Ready is
// polled every 10 ms with the API's client; the exec goes through the API
// server as an SDK's does (WebSocket), in this process. A kubectl exec into
// the same pod follows, reported apart: kubectl's own start (about 170 ms
// here) is not the runtime's. AGENTBOX_BENCH=1 only.
func TestBenchmarkClaim(t *testing.T) {
	requireBench(t)
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "bench-claim")
	benchRole(t, k, "bench-claim", ns)
	template := func(name, rc string) obj {
		return sandboxTemplate(ns, name, rc, "bench-claim", "sh", "-c", "exec sleep infinity")
	}
	pool := func(name, tmpl string, replicas int) obj { return warmPool(ns, name, tmpl, replicas) }
	k.apply(t, template("abx", "agentbox"), template("runc", "runc"),
		pool("warm", "abx", 2), pool("cold-abx", "abx", 0), pool("cold-runc", "runc", 0))
	// A warm pool whose role takes a vendor's key from its claim, and a
	// narrower role the claim names (docs/agent-sandbox.md, A claim's
	// keys): its claims bind both.
	vendorURL, vendorKey := k.benchClaimBinding(t, ns)
	bind := template("abx-bind", "agentbox")
	bind["spec"].(obj)["podTemplate"].(obj)["metadata"].(obj)["annotations"].(obj)["agentbox.dev/role"] = "bench-claim-pool"
	bind["spec"].(obj)["podTemplate"].(obj)["spec"].(obj)["containers"].([]obj)[0]["image"] = probeImage
	k.apply(t, bind, pool("warm-bind", "abx-bind", 2))
	// A role whose template is a checkpoint of the agent, taken on the
	// node: its Sandboxes restore instead of booting.
	k.apply(t, podSpec(ns, "seed", "agentbox", "bench-claim", "sh", "-c", "exec sleep infinity"))
	k.waitPod(t, ns, "seed", 2*time.Minute, "Running", running)
	tmplName := uniqueID("bench-claim-tmpl")
	if r := k.run(2*time.Minute, nil, filepath.Join(repoRoot, "hack", "kube.sh"), "node", filepath.Join(repoRoot, "_output", "bin", "agentbox"),
		"sandbox", "checkpoint", "--config", "/etc/agentbox/config.toml", "--name", tmplName, "--reason", "bench: the role's template", "--pod", ns+"/seed"); r.code != 0 {
		t.Fatalf("checkpoint on the node: %v", r)
	}
	k.kubectl("-n", ns, "delete", "pod", "seed", "--wait=false")
	writeNodePolicy(t, k, "bench-claim-tmpl.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: bench-claim-tmpl}
spec:
  inherits: bench-claim
  template: %s
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: bench-claim-tmpl}
spec:
  role: bench-claim-tmpl
  subjects: [{namespace: %s}]
`, tmplName, ns))
	tmpl := template("tmpl", "agentbox")
	tmpl["spec"].(obj)["podTemplate"].(obj)["metadata"].(obj)["annotations"].(obj)["agentbox.dev/role"] = "bench-claim-tmpl"
	k.apply(t, tmpl, pool("cold-tmpl", "tmpl", 0))
	rc := k.restConfig(t)
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// settled: the warm pool is full and every other pod is gone, so that
	// no variant runs beside another's refill or teardown (on 2 cores a
	// gVisor sandbox booting next to a measurement doubles it).
	settled := func() bool {
		for _, p := range []string{"warm", "warm-bind"} {
			r := k.kubectl("-n", ns, "get", "sandboxwarmpool", p, "-o", "jsonpath={.status.readyReplicas}")
			if strings.TrimSpace(r.stdout) != "2" {
				return false
			}
		}
		r := k.kubectl("-n", ns, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.phase}{"\n"}{end}`)
		n := 0
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			if f := strings.Fields(l); len(f) != 2 || f[1] != "Running" {
				return false
			}
			n++
		}
		return n == 4
	}
	rounds := benchRounds("AGENTBOX_BENCH_CLAIM_ROUNDS", 7)
	variants := []struct{ name, pool string }{{"warm pool (agentbox)", "warm"}, {"warm, binds role+key", "warm-bind"}, {"cold (agentbox)", "cold-abx"},
		{"role template (agentbox)", "cold-tmpl"}, {"cold (runc)", "cold-runc"}}
	vendorCall := map[string][]time.Duration{}
	ready := map[string][]time.Duration{}
	answered := map[string][]time.Duration{}
	kubectlExec := map[string][]time.Duration{}
	bound := map[string][]time.Duration{}
	for i := 0; i < rounds; i++ {
		for _, v := range variants {
			if !eventually(t, 3*time.Minute, settled) {
				t.Fatalf("the warm pool did not refill or a claim's pod stayed:\n%s", clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods").stdout))
			}
			claim := fmt.Sprintf("%s-%d", v.pool, i)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			start := time.Now()
			if _, err := client.Resource(claimsGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: obj{
				"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
				"metadata": obj{"name": claim, "namespace": ns, "annotations": claimAnnotations(v.pool, claim)},
				"spec":     obj{"warmPoolRef": obj{"name": v.pool}}}}, metav1.CreateOptions{}); err != nil {
				cancel()
				t.Fatal(err)
			}
			sb, err := claimReady(ctx, client, ns, claim)
			cancel()
			if err != nil {
				t.Fatalf("%s: %v\n%s", v.name, err, clip(k.kubectl("-n", ns, "get", "sandboxclaim", claim, "-o", "yaml").stdout))
			}
			ready[v.name] = append(ready[v.name], time.Since(start))
			ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
			out, err := apiExec(ctx, rc, ns, sb, "echo", "answered")
			cancel()
			if err != nil || out != "answered\n" {
				t.Fatalf("%s: exec in %s: %q, %v", v.name, sb, out, err)
			}
			answered[v.name] = append(answered[v.name], time.Since(start))
			if v.pool == "warm-bind" {
				// The agent's first call to the vendor carries the claim's key.
				ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
				out, err := apiExec(ctx, rc, ns, sb, "abx-fetch", vendorURL+"/"+claim)
				cancel()
				if err != nil || !strings.Contains(out, "status=200") || vendorKey(claim) != "Bearer "+claim+"-key" {
					t.Fatalf("%s: the first vendor call from %s: %q %v, the vendor saw %q", v.name, sb, out, err, vendorKey(claim))
				}
				vendorCall[v.name] = append(vendorCall[v.name], time.Since(start))
			}
			// kubectl exec into the same pod, for comparison: its own
			// start (a process, its kubeconfig, discovery) is in it.
			s := time.Now()
			if r := k.kubectl("-n", ns, "exec", sb, "--", "true"); r.code != 0 {
				t.Fatalf("%s: kubectl exec in %s: %v", v.name, sb, r)
			}
			kubectlExec[v.name] = append(kubectlExec[v.name], time.Since(s))
			if v.pool != "cold-runc" {
				bound[v.name] = append(bound[v.name], k.claimBound(t, ns, sb, claim, start))
			}
			k.kubectl("-n", ns, "delete", "sandboxclaim", claim, "--wait=false")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "agent-sandbox SandboxClaim to the agent (hack/kube.sh cluster, %d rounds each, interleaved; median, p90):\n", rounds)
	ref := stats(answered["cold (runc)"]).median
	for _, v := range variants {
		r, a := stats(ready[v.name]), stats(answered[v.name])
		fmt.Fprintf(&b, "  %-25s claim Ready %s (p90 %s); exec answered %s (p90 %s); %.2fx runc's cold; then kubectl exec %s\n", v.name, ms(r.median), ms(r.p90), ms(a.median), ms(a.p90), float64(a.median)/float64(ref), ms(stats(kubectlExec[v.name]).median))
		if d := vendorCall[v.name]; len(d) > 0 {
			vd := stats(d)
			fmt.Fprintf(&b, "  %-25s then its first vendor call, with the claim's key, answered %s after the claim (p90 %s)\n", "", ms(vd.median), ms(vd.p90))
		}
		if d := bound[v.name]; len(d) > 0 {
			bd := stats(d)
			fmt.Fprintf(&b, "  %-25s the claim's task bound on the trail (its owner record's time) %s after the claim (p90 %s): %s after the exec answered\n", "", ms(bd.median), ms(bd.p90), ms(bd.median-a.median))
		}
	}
	t.Log(b.String())
	benchOut(t, b.String())
}

// claimAnnotations are a benchmark claim's: its task, and for the
// warm-bind pool a narrower role and the vendor key its own Secret holds.
func claimAnnotations(pool, claim string) obj {
	a := obj{"agentbox.dev/tenant": "bench", "agentbox.dev/task": claim}
	if pool == "warm-bind" {
		a["agentbox.dev/role"] = "bench-claim-task"
		a["agentbox.dev/key.vendor"] = claim + "/token"
	}
	return a
}

// benchClaimBinding makes the warm-bind pool's cluster roles, a stand-in
// vendor on the node's bridge, and a Secret per claim the broker may read;
// it gives the vendor's URL and what it saw of a claim's call.
func (k *kubeNode) benchClaimBinding(t *testing.T, ns string) (string, func(claim string) string) {
	t.Helper()
	const nodeIP = "10.97.0.1"
	origin, caPEM := newAuthOrigin(t, nodeIP, "vendor.kube.test")
	k.inspectedOnBridge(t, nodeIP, caPEM, "vendor.kube.test")
	var names []string
	for i := 0; i < benchRounds("AGENTBOX_BENCH_CLAIM_ROUNDS", 7); i++ {
		claim := fmt.Sprintf("warm-bind-%d", i)
		names = append(names, claim)
		k.apply(t, secretObj(ns, claim, "token", claim+"-key"))
	}
	k.brokerMayGet(t, ns, names...)
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "bench-claim-pool", "bench-claim-task", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "bench-claim-pool", "bench-claim-task", "--ignore-not-found")
	})
	vendor := obj{"host": "vendor.kube.test", "ports": []int{origin.port}, "allowPrivate": true}
	narrow := obj{"host": "vendor.kube.test", "ports": []int{origin.port}, "allowPrivate": true, "http": obj{"paths": []string{"/warm-bind-*"}}}
	k.apply(t, agentRole("bench-claim-pool", obj{"inherits": "baseline", "limits": obj{"wallClock": "2h"},
		"network": obj{"egress": "allowlist", "allow": []obj{vendor}},
		"credentials": obj{"secrets": []obj{{"env": "VENDOR_KEY", "fromClaim": "vendor",
			"inject": obj{"host": "vendor.kube.test", "header": "authorization", "format": "Bearer {secret}"}}}}}),
		agentRole("bench-claim-task", obj{"inherits": "bench-claim-pool", "network": obj{"egress": "allowlist", "allow": []obj{narrow}}}),
		agentBinding("bench-claim-pool", "bench-claim-pool", ns), agentBinding("bench-claim-task", "bench-claim-task", ns))
	k.waitPolicy(t, "agentrole", "bench-claim-task", "enforced", enforced)
	return fmt.Sprintf("https://vendor.kube.test:%d", origin.port), func(claim string) string { return origin.auth("/" + claim) }
}
