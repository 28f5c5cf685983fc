//go:build e2e

package e2e

// The two-node tests run on `hack/kube.sh up --nodes 2`: two kubelets, each
// with its own containerd, shim and node agent, a shared checkpoint store
// and the cluster's broker. They come last in the suite (this file sorts
// after every other TestKube file): the first of them brings the cluster up
// again with two nodes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/checkpoint"
)

const (
	node1Name = "agentbox-node"
	node2Name = "agentbox-node-2"
	node2IP   = "10.97.1.1"
	brokerURL = "https://127.0.0.1:18443"
)

var (
	twoOnce sync.Once
	twoErr  error
)

// kubeTwoNodes returns the cluster's two nodes, bringing the cluster up
// with two if it has one.
func kubeTwoNodes(t *testing.T) (k, n2 *kubeNode) {
	t.Helper()
	k = kubeCluster(t)
	twoOnce.Do(func() {
		if b, _ := os.ReadFile(filepath.Join(k.dir, "nodes")); strings.TrimSpace(string(b)) == "2" {
			return
		}
		// The single-node cluster goes: its trails count in the suite's
		// conformance figure first.
		if dirs := kubeAuditDirs(); len(dirs) > 0 {
			checkOCSF(t, dirs...)
		}
		log := filepath.Join(repoRoot, "_output", "kube-up-2.log")
		start := time.Now()
		// No agent CLI runs here: node 1 goes without their images.
		if err := kubeScriptEnv([]string{"AGENTBOX_KUBE_AGENT_IMAGES="}, log, "up", "--nodes", "2"); err != nil {
			b, _ := os.ReadFile(log)
			twoErr = fmt.Errorf("hack/kube.sh up --nodes 2: %v\n%s", err, clip(string(b)))
			return
		}
		kubeOurs = true
		fmt.Fprintf(os.Stderr, "e2e: hack/kube.sh up --nodes 2 took %s (log %s)\n", time.Since(start).Round(time.Second), log)
	})
	if twoErr != nil {
		t.Fatal(twoErr)
	}
	sock := filepath.Join(k.dir, "node2", "containerd.sock")
	env := append(slices.Clone(k.env), "CONTAINER_RUNTIME_ENDPOINT=unix://"+sock, "IMAGE_SERVICE_ENDPOINT=unix://"+sock, "CONTAINERD_ADDRESS="+sock)
	return k, &kubeNode{dir: filepath.Join(k.dir, "node2"), sock: sock, env: env}
}

// onNode pins a pod spec or a Sandbox's pod template to a node.
func onNode(spec obj, node string) obj {
	spec["nodeSelector"] = obj{"kubernetes.io/hostname": node}
	return spec
}

// activeOnBoth waits for a cluster object to be enforced by both nodes.
func (k *kubeNode) activeOnBoth(t *testing.T, kind, name string) {
	t.Helper()
	k.waitPolicy(t, kind, name, "enforced on both nodes", func(o policyObject) bool {
		st, _ := o.condition("Accepted")
		return st == "True" && o.Status.ObservedGeneration == o.Metadata.Generation && o.Status.ActiveNodes == 2
	})
}

// nodeToken is a token of the node agent's service account bound to its
// pod on node (as an attacker who owns that node holds it), for audience
// ("": the API server's); unbound, one bound to nothing.
func (k *kubeNode) nodeToken(t *testing.T, node, audience string, unbound bool) string {
	t.Helper()
	pod := k.mustKubectl(t, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=agentbox-installer",
		"--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[0].metadata.name}")
	args := []string{"-n", "kube-system", "create", "token", "agentbox-sync", "--duration=1h"}
	if !unbound {
		args = append(args, "--bound-object-kind", "Pod", "--bound-object-name", pod)
	}
	if audience != "" {
		args = append(args, "--audience", audience)
	}
	return k.mustKubectl(t, args...)
}

// as runs kubectl with token alone (no admin credentials).
func (k *kubeNode) as(token string, stdin []byte, args ...string) result {
	base := []string{"--kubeconfig=/dev/null", "--server=https://127.0.0.1:16443", "--certificate-authority=" + filepath.Join(k.dir, "pki", "ca.crt"), "--token=" + token}
	return k.run(time.Minute, stdin, "kubectl", append(base, args...)...)
}

// brokerAs is a broker client with token.
func (k *kubeNode) brokerAs(t *testing.T, token string) *broker.Client {
	t.Helper()
	tf := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tf, []byte(token), 0o600)
	c, err := broker.NewClient(brokerURL, filepath.Join(k.dir, "pki", "ca.crt"), tf)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func brokerStatus(err error) int {
	var be *broker.Error
	if errors.As(err, &be) {
		return be.Status
	}
	return 0
}

// TestKubeTwoNodeResume: a Sandbox suspended on node 1 resumes on node 2
// through the shared store, for real: node 2's store never had the image.
// The image is encrypted there with a data key of its own, which node 2's
// agent gets from the broker only because the Sandbox's own pod is bound to
// node 2; the agent's counter goes on, and the trails link. Node 1, which
// took the image, cannot have its data key unwrapped once the pod is on
// node 2; node 2 can.
func TestKubeTwoNodeResume(t *testing.T) {
	k, n2 := kubeTwoNodes(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-two-resume")
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "e2e-two-mem", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "e2e-two-mem", "--ignore-not-found")
	})
	k.apply(t, agentRole("e2e-two-mem", obj{"inherits": "baseline", "suspend": "memory"}), agentBinding("e2e-two-mem", "e2e-two-mem", ns))
	k.activeOnBoth(t, "agentrole", "e2e-two-mem")
	const counter = `i=0; while :; do i=$((i+1)); echo "count $i"; sleep 0.2; done`
	sbx := asbSandbox(ns, "counter", "e2e-two-mem", "sh", "-c", counter)
	tmpl := sbx["spec"].(obj)["podTemplate"].(obj)
	tmpl["spec"].(obj)["terminationGracePeriodSeconds"] = 30
	onNode(tmpl["spec"].(obj), node1Name)
	k.apply(t, sbx)
	k.waitSandboxPod(t, ns, "counter")
	p := k.waitPod(t, ns, "counter", 3*time.Minute, "Running", running)
	if p.Spec.NodeName != node1Name {
		t.Fatalf("the Sandbox's pod is on %q", p.Spec.NodeName)
	}
	first := k.sandboxOf(t, p.Metadata.UID)
	uid := k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", "jsonpath={.metadata.uid}")
	if !eventually(t, time.Minute, func() bool { return len(k.ownerRecords(t, first)) > 0 }) {
		t.Fatal("node 1's agent did not link the pod to its Sandbox")
	}
	k.waitLogs(t, ns, "counter", "count 10\n", time.Minute)
	last := counts(k.logs(t, ns, "counter"))

	// Suspended on node 1: the image goes to the shared store, encrypted,
	// and the Sandbox is not pinned.
	k.mustKubectl(t, "-n", ns, "patch", "sandbox", "counter", "--type=merge", "-p", `{"spec":{"operatingMode":"Suspended"}}`)
	t.Logf("%s", k.waitEvent(t, ns, "counter", "Suspended", "on any node (the shared store)"))
	if !eventually(t, 2*time.Minute, func() bool { return k.kubectl("-n", ns, "get", "pod", "counter").code != 0 }) {
		t.Fatal("the suspended Sandbox's pod was not deleted")
	}
	name := k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.spec.podTemplate.metadata.annotations.agentbox\.dev/restore-from}`)
	if !strings.HasPrefix(name, "sb-"+uid+"-") {
		t.Fatalf("the Sandbox's pod template names checkpoint %q", name)
	}
	if pin := k.mustKubectl(t, "-n", ns, "get", "sandbox", "counter", "-o", `jsonpath={.metadata.annotations.agentbox\.dev/pinned-to}`); pin != "" {
		t.Errorf("pinned to %q with a shared store", pin)
	}
	shared := filepath.Join(k.dir, "shared", name)
	wrappedRaw, err := os.ReadFile(filepath.Join(shared, checkpoint.DataKeyFile))
	if err != nil {
		t.Fatalf("the shared image has no wrapped data key: %v", err)
	}
	wrapped, err := checkpoint.ParseWrappedKey(wrappedRaw)
	if err != nil || wrapped.Scheme != checkpoint.SchemeRSAOAEP {
		t.Fatalf("the shared image's data key: %+v %v", wrapped, err)
	}
	marker := []byte(`i=$((i+1))`)
	local, err := os.ReadFile(filepath.Join(k.dir, "varlib", "agentbox", "checkpoints", name, "pages.img"))
	if err != nil || !strings.Contains(string(local), string(marker)) {
		t.Fatalf("node 1's image does not hold the agent's script (%v): the check below would prove nothing", err)
	}
	ents, _ := os.ReadDir(shared)
	for _, e := range ents {
		if b, _ := os.ReadFile(filepath.Join(shared, e.Name())); strings.Contains(string(b), string(marker)) {
			t.Errorf("the shared store's %s holds the agent's memory in plaintext", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(n2.dir, "varlib", "agentbox", "checkpoints", name)); err == nil {
		t.Fatal("node 2's store has the image already: the resume would not cross the shared store")
	}

	// Running again, on node 2.
	k.mustKubectl(t, "-n", ns, "patch", "sandbox", "counter", "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"operatingMode":"Running","podTemplate":{"spec":{"nodeSelector":{"kubernetes.io/hostname":%q}}}}}`, node2Name))
	k.waitSandboxPod(t, ns, "counter")
	p2 := k.waitPod(t, ns, "counter", 3*time.Minute, "Running", running)
	if p2.Spec.NodeName != node2Name {
		t.Fatalf("the resumed pod is on %q", p2.Spec.NodeName)
	}
	after := counts(k.waitLogs(t, ns, "counter", "count ", time.Minute))
	if len(last) == 0 || len(after) == 0 || after[0] <= last[len(last)-1] {
		t.Fatalf("the counter did not go on: it was at %v before the suspend, and the resumed pod printed %v", last[max(0, len(last)-1):], after[:min(len(after), 5)])
	}
	t.Logf("suspended on node 1 after count %d; resumed on node 2 at %d", last[len(last)-1], after[0])
	second := n2.sandboxOf(t, p2.Metadata.UID)
	restored := findRecord(n2.trail(t, second), "agentbox/restored")
	if restored == nil || restored.Detail["previous_sandbox"] != first || !strings.Contains(restored.Detail["shared_store"], "taken from the shared store") {
		t.Fatalf("node 2's restore: %+v", restored)
	}
	unwrapped := false
	for _, r := range n2.trail(t, "node-"+node2Name) {
		if r.Event == "agentbox/checkpoint_shared" && r.Status == "Success" && r.Detail["checkpoint"] == name && strings.Contains(r.Message, "broker unwrapped") {
			unwrapped = true
		}
	}
	if !unwrapped {
		t.Error("node 2's trail does not record the broker unwrapping the image's data key")
	}
	if _, err := os.Stat(filepath.Join(n2.dir, "varlib", "agentbox", "checkpoint-keys", name)); err == nil {
		t.Error("the image's data key stays on node 2 after the restore")
	}
	t.Logf("%s", k.waitEvent(t, ns, "counter", "Resumed", name, "and from the shared store"))

	// Node 1 (a token bound to its node agent's pod) cannot have the data
	// key unwrapped for the pod on node 2 (its twin, node 2's agent, had it
	// for the restore: the record above). Once resumed, the pod no longer
	// asks for the image (agent-sandbox takes the annotation off it too),
	// and not even node 2 gets the key again.
	pod := broker.Ref{Namespace: ns, Name: "counter", UID: p2.Metadata.UID}
	_, err = k.brokerAs(t, k.nodeToken(t, node1Name, broker.Audience, false)).Unwrap(context.Background(), pod, wrapped)
	if brokerStatus(err) != 403 || !strings.Contains(err.Error(), node2Name) {
		t.Errorf("node 1 unwrapping node 2's pod's image: %v", err)
	}
	if !eventually(t, 30*time.Second, func() bool {
		_, err = k.brokerAs(t, k.nodeToken(t, node2Name, broker.Audience, false)).Unwrap(context.Background(), pod, wrapped)
		return brokerStatus(err) == 403 && strings.Contains(err.Error(), "asks to be restored from")
	}) {
		t.Errorf("node 2 unwrapping the image again after the resume: %v", err)
	}
	if _, err := os.Stat(filepath.Join(k.dir, "varlib", "agentbox", "checkpoint-keys", name)); err == nil {
		t.Error("node 1 holds the image's data key")
	}
}

// TestKubeTwoNodeResponse: quarantine and live tightening reach a pod on
// node 2: its node's agent applies the AgentQuarantine and reports its own
// entry, and the role's edit tightens the running sandbox there.
func TestKubeTwoNodeResponse(t *testing.T) {
	k, n2 := kubeTwoNodes(t)
	ns := k.namespace(t, "e2e-two-aq")
	srv, err := serveHTTPReply(node2IP+":0", "hello-from-allowed\n")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.ln.Close()
	t.Cleanup(func() {
		k.kubectl("delete", "agentquarantine", "e2e-two-bots", "--ignore-not-found")
		k.kubectl("delete", "agentrolebinding", "e2e-two-aq", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "e2e-two-aq", "--ignore-not-found")
	})
	role := func(memory string) obj {
		return obj{"inherits": "baseline", "limits": obj{"memory": memory},
			"network": obj{"egress": "allowlist", "allow": []obj{{"cidr": node2IP + "/32", "ports": []int{srv.port}}}}}
	}
	k.apply(t, agentRole("e2e-two-aq", role("512Mi")), agentBinding("e2e-two-aq", "e2e-two-aq", ns))
	k.activeOnBoth(t, "agentrole", "e2e-two-aq")
	script := fmt.Sprintf(`while :; do r=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 %s %d 2>&1 | tr '\r\n' '  '); echo "== try $(date +%%s): $r"; sleep 0.5; done`, node2IP, srv.port)
	pod := podSpec(ns, "bot", "agentbox", "e2e-two-aq", "sh", "-c", script)
	pod["metadata"].(obj)["labels"] = obj{"app": "bot"}
	onNode(pod["spec"].(obj), node2Name)
	k.apply(t, pod)
	p := k.waitPod(t, ns, "bot", 3*time.Minute, "Running", running)
	sandbox := n2.sandboxOf(t, p.Metadata.UID)
	if logs := k.waitLogs(t, ns, "bot", "hello-from-allowed", time.Minute); !strings.Contains(logs, "hello-from-allowed") {
		t.Fatalf("before the quarantine, the allowed server: %s", clip(logs))
	}

	// Live tightening: the role's edit (a lower memory limit) reaches the
	// running sandbox on node 2.
	k.apply(t, agentRole("e2e-two-aq", role("384Mi")))
	var tightened *record
	if !eventually(t, time.Minute, func() bool {
		tightened = findRecord(n2.trail(t, sandbox), "agentbox/policy_tightened")
		return tightened != nil
	}) {
		t.Fatal("no agentbox/policy_tightened in the node 2 pod's trail within a minute of the role's edit")
	}
	t.Logf("tightened on node 2: %s", tightened.Message)

	k.apply(t, obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentQuarantine", "metadata": obj{"name": "e2e-two-bots"},
		"spec": obj{"reason": "e2e: a bot on node 2", "selector": obj{"namespace": ns, "matchLabels": obj{"app": "bot"}}}})
	var q *record
	if !eventually(t, 30*time.Second, func() bool { q = findRecord(n2.trail(t, sandbox), "agentbox/quarantined"); return q != nil }) {
		t.Fatal("no quarantine record on node 2 within 30s")
	}
	var status struct {
		Status struct {
			Nodes map[string]struct {
				Pods []string `json:"pods"`
			} `json:"nodes"`
		} `json:"status"`
	}
	eventually(t, 20*time.Second, func() bool {
		json.Unmarshal([]byte(k.mustKubectl(t, "get", "agentquarantine", "e2e-two-bots", "-o", "json")), &status)
		return len(status.Status.Nodes[node2Name].Pods) == 1
	})
	if n := status.Status.Nodes[node2Name]; len(n.Pods) != 1 || n.Pods[0] != ns+"/bot" {
		t.Errorf("status.nodes: %+v", status.Status.Nodes)
	}
	if n, ok := status.Status.Nodes[node1Name]; ok && len(n.Pods) > 0 {
		t.Errorf("node 1 reports node 2's pod: %+v", n)
	}
	cut := time.Now()
	time.Sleep(3 * time.Second)
	tries := triesOf(k.logs(t, ns, "bot"), "", cut.Add(time.Second))
	if len(tries) == 0 {
		t.Fatal("the pod printed nothing while quarantined")
	}
	for _, l := range tries {
		if strings.Contains(l, "hello-from-allowed") {
			t.Errorf("a connection went through while quarantined: %s", l)
		}
	}
}
