//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// policyObject is the part of an AgentRole, AgentRoleBinding or
// AgentNodePolicy the tests read.
type policyObject struct {
	Metadata struct {
		Generation int64 `json:"generation"`
	} `json:"metadata"`
	Status struct {
		ObservedGeneration int64 `json:"observedGeneration"`
		ActiveNodes        int   `json:"activeNodes"`
		Digest             string
		Objects            []struct {
			Kind       string `json:"kind"`
			Name       string `json:"name"`
			Generation int64  `json:"generation"`
		} `json:"objects"`
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

func (o policyObject) condition(typ string) (status, message string) {
	for _, c := range o.Status.Conditions {
		if c.Type == typ {
			return c.Status, c.Message
		}
	}
	return "", ""
}

func (k *kubeNode) policyObject(t *testing.T, kind, name string) (policyObject, bool) {
	t.Helper()
	r := k.kubectl("get", kind, name, "-o", "json")
	if r.code != 0 {
		return policyObject{}, false
	}
	var o policyObject
	if err := json.Unmarshal([]byte(r.stdout), &o); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return o, true
}

// waitPolicy polls an object until ok says so.
func (k *kubeNode) waitPolicy(t *testing.T, kind, name, what string, ok func(policyObject) bool) policyObject {
	t.Helper()
	var o policyObject
	if !eventually(t, 90*time.Second, func() bool {
		var found bool
		o, found = k.policyObject(t, kind, name)
		return found && ok(o)
	}) {
		t.Fatalf("%s %s: not %s after 90s: %+v\n%s", kind, name, what, o.Status, clip(k.kubectl("-n", "kube-system", "logs", "daemonset/agentbox-installer", "-c", "sync", "--tail=20").stdout))
	}
	return o
}

// enforced: the object's current generation is accepted and active on the
// node.
func enforced(o policyObject) bool {
	st, _ := o.condition("Accepted")
	return st == "True" && o.Status.ObservedGeneration == o.Metadata.Generation && o.Status.ActiveNodes == 1
}

func agentRole(name string, spec obj) obj {
	return obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentRole", "metadata": obj{"name": name}, "spec": spec}
}

func agentBinding(name, role, ns string) obj {
	return obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentRoleBinding", "metadata": obj{"name": name},
		"spec": obj{"role": role, "subjects": []obj{{"namespace": ns}}}}
}

// runOnce runs a pod to its end and returns its logs.
func (k *kubeNode) runOnce(t *testing.T, ns, name, role string, argv ...string) string {
	t.Helper()
	k.apply(t, podSpec(ns, name, "agentbox", role, argv...))
	st := k.waitPod(t, ns, name, 3*time.Minute, "terminated", terminated).Status.ContainerStatuses[0].State.Terminated
	if st.ExitCode != 0 {
		t.Fatalf("pod %s: exit %d (%s)", name, st.ExitCode, st.Reason)
	}
	return k.logs(t, ns, name)
}

// TestKubePolicyObjects: cluster admins write roles with kubectl. A role
// and a binding applied as AgentRole and AgentRoleBinding reach the node
// (the installer's sync container) and a pod runs under them; an edit
// that tightens the role applies to the next pod; the API server refuses
// what its schema and CEL rules can see; what only the loader finds gets a
// status condition naming file, line and field, the node keeps its last
// good snapshot, and a pod claiming the refused role is told why; with
// the API server stopped the node still starts pods under the last good
// set; deleting the binding makes the next claim fail. Every snapshot
// change is in the node's audit trail, which verifies.
func TestKubePolicyObjects(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-crd")
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "e2e-crd", "e2e-crd-bad", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "e2e-crd", "e2e-crd-bad", "--ignore-not-found")
	})
	nproc := func(n int) obj { return obj{"inherits": "baseline", "process": obj{"maxProcesses": n}} }

	// Apply: a pod under the role starts within seconds.
	t0 := time.Now()
	k.apply(t, agentRole("e2e-crd", nproc(100)), agentBinding("e2e-crd", "e2e-crd", ns))
	k.waitPolicy(t, "agentrolebinding", "e2e-crd", "enforced", enforced)
	k.waitPolicy(t, "agentrole", "e2e-crd", "enforced", enforced)
	t.Logf("applied and active on the node %.1fs after kubectl apply", time.Since(t0).Seconds())
	if logs := k.runOnce(t, ns, "first", "e2e-crd", "sh", "-c", "echo nproc=$(ulimit -u)"); !strings.Contains(logs, "nproc=100") {
		t.Fatalf("the pod did not run under the cluster's role: %q", logs)
	}
	t.Logf("a pod under it ran to its end %.1fs after kubectl apply", time.Since(t0).Seconds())
	if out := k.mustKubectl(t, "get", "agentroles"); !strings.Contains(out, "e2e-crd") || !strings.Contains(out, "True") {
		t.Errorf("kubectl get agentroles:\n%s", out)
	}

	// kubectl explain documents the fields, from the loader's types.
	if out := k.mustKubectl(t, "explain", "agentrole.spec.process.allowUsers"); !strings.Contains(out, "uids a pod may ask for") {
		t.Errorf("kubectl explain:\n%s", out)
	}

	// An edit that tightens the role applies to the next pod.
	k.apply(t, agentRole("e2e-crd", nproc(50)))
	k.waitPolicy(t, "agentrole", "e2e-crd", "generation 2 enforced", func(o policyObject) bool { return o.Metadata.Generation == 2 && enforced(o) })
	if logs := k.runOnce(t, ns, "second", "e2e-crd", "sh", "-c", "echo nproc=$(ulimit -u)"); !strings.Contains(logs, "nproc=50") {
		t.Fatalf("the tightened role did not apply to the next pod: %q", logs)
	}

	// The API server refuses what CEL and the schema can check.
	for what, c := range map[string]struct {
		spec obj
		want string
	}{
		"allow without allowlist": {obj{"network": obj{"egress": "none", "allow": []obj{{"cidr": "10.0.0.0/8"}}}}, "allow is only for egress: allowlist"},
		"egress value":            {obj{"network": obj{"egress": "everywhere"}}, "Unsupported value: \"everywhere\""},
		"inherits format":         {obj{"inherits": "Not_A_Role"}, "spec.inherits"},
	} {
		b, _ := json.Marshal(agentRole("e2e-crd-cel", c.spec))
		r := k.run(time.Minute, b, "kubectl", "apply", "-f", "-")
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: want the API server to refuse with %q, got %v", what, c.want, r)
		}
	}

	// What only the loader finds: a status condition, the last good
	// snapshot kept, a pod claiming the role refused with the reason.
	before, err := os.ReadFile(filepath.Join(k.dir, "etc", "agentbox", "policies", "agentbox-cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	k.apply(t, agentRole("e2e-crd-bad", obj{"inherits": "baseline", "limits": obj{"memory": "lots"}}), agentBinding("e2e-crd-bad", "e2e-crd-bad", ns))
	bad := k.waitPolicy(t, "agentrole", "e2e-crd-bad", "refused", func(o policyObject) bool { st, _ := o.condition("Accepted"); return st == "False" })
	if _, msg := bad.condition("Accepted"); !strings.Contains(msg, "agentbox-cluster.yaml:") || !strings.Contains(msg, "spec.limits.memory") {
		t.Errorf("the condition must name file, line and field: %q", msg)
	}
	node := k.waitPolicy(t, "agentnodepolicy", "agentbox-node", "refusing the newest set", func(o policyObject) bool { st, _ := o.condition("Applied"); return st == "False" })
	if _, msg := node.condition("Applied"); !strings.Contains(msg, "AgentRole/e2e-crd-bad") {
		t.Errorf("the node's report: %q", msg)
	}
	after, _ := os.ReadFile(filepath.Join(k.dir, "etc", "agentbox", "policies", "agentbox-cluster.yaml"))
	if string(before) != string(after) {
		t.Fatal("the node's snapshot changed although the newest set does not load")
	}
	k.apply(t, podSpec(ns, "claims-bad", "agentbox", "e2e-crd-bad", "true"))
	line := k.waitEvent(t, ns, "claims-bad", "FailedCreatePodSandBox", `"e2e-crd-bad"`, "was refused on this node", "spec.limits.memory")
	t.Logf("refused: %s", clip(line))
	k.mustKubectl(t, "delete", "agentrolebinding", "e2e-crd-bad")
	k.mustKubectl(t, "delete", "agentrole", "e2e-crd-bad")
	k.waitPolicy(t, "agentnodepolicy", "agentbox-node", "applying again", func(o policyObject) bool { st, _ := o.condition("Applied"); return st == "True" })

	// Without the API server, the node keeps its snapshot: a pod started
	// through the CRI (the kubelet cannot start one) runs under the role.
	if err := kubeScript(filepath.Join(repoRoot, "_output", "kube-up.log"), "apiserver", "stop"); err != nil {
		t.Fatal(err)
	}
	restarted := false
	restart := func() {
		if !restarted {
			restarted = true
			if err := kubeScript(filepath.Join(repoRoot, "_output", "kube-up.log"), "apiserver", "start"); err != nil {
				t.Errorf("restart the API server: %v", err)
			}
		}
	}
	defer restart()
	time.Sleep(3 * time.Second) // the agent's watch notices
	dir := t.TempDir()
	podJSON := writeJSON(t, filepath.Join(dir, "pod.json"), obj{
		"metadata":      obj{"name": "no-apiserver", "namespace": ns, "uid": uniqueID("uid"), "attempt": 0},
		"annotations":   obj{"agentbox.dev/role": "e2e-crd"},
		"log_directory": filepath.Join(dir, "logs"),
		"linux":         obj{},
	})
	r := k.run(2*time.Minute, nil, "crictl", "runp", "--runtime", "agentbox", podJSON)
	if r.code != 0 {
		t.Fatalf("with the API server stopped, a pod under the last good set must start: %v", r)
	}
	sandbox := strings.TrimSpace(r.stdout)
	role := ""
	for _, rec := range k.trail(t, sandbox) {
		if rec.Event == "agentbox/role_resolved" {
			role = rec.Role
		}
	}
	k.run(time.Minute, nil, "crictl", "stopp", sandbox)
	k.run(time.Minute, nil, "crictl", "rmp", "-f", sandbox)
	if role != "e2e-crd" {
		t.Errorf("pod started without the API server: role %q, want e2e-crd", role)
	}
	restart()

	// Deleting the binding makes the next claim fail.
	k.mustKubectl(t, "delete", "agentrolebinding", "e2e-crd")
	k.waitPolicy(t, "agentnodepolicy", "agentbox-node", "without the binding", func(o policyObject) bool {
		for _, obj := range o.Status.Objects {
			if obj.Kind == "AgentRoleBinding" && obj.Name == "e2e-crd" {
				return false
			}
		}
		st, _ := o.condition("Applied")
		return st == "True"
	})
	k.apply(t, podSpec(ns, "unbound", "agentbox", "e2e-crd", "true"))
	k.waitEvent(t, ns, "unbound", "FailedCreatePodSandBox", `role "e2e-crd" is not bound`)

	// The node's trail: every snapshot change, chained, verified.
	trails, _ := filepath.Glob(filepath.Join(k.dir, "varlog", "agentbox", "audit", "node-agentbox-node*.jsonl"))
	if len(trails) == 0 {
		t.Fatal("no node trail")
	}
	var changes []string
	for _, f := range trails {
		b, _ := os.ReadFile(f)
		for _, rec := range parseTrail(t, b) {
			if rec.Event == "agentbox/policy_snapshot" || rec.Event == "agentbox/policy_refused" {
				changes = append(changes, fmt.Sprintf("%s %s", rec.Event, rec.Detail["changes"]))
			}
		}
	}
	all := strings.Join(changes, "\n")
	for _, want := range []string{"added AgentRole/e2e-crd (generation 1)", "changed AgentRole/e2e-crd (generation 1 -> 2)", "agentbox/policy_refused", "removed AgentRoleBinding/e2e-crd"} {
		if !strings.Contains(all, want) {
			t.Errorf("node trail lacks %q:\n%s", want, all)
		}
	}
	v := k.run(time.Minute, nil, filepath.Join(repoRoot, "_output", "bin", "agentbox"), append([]string{"audit", "verify", "--open"}, trails...)...)
	if v.code != 0 || !strings.Contains(v.stdout, "OK") {
		t.Errorf("node trail does not verify: %v", v)
	}
}
