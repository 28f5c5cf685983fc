//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestKubeQuarantine: a cluster admin quarantines agent pods with an
// AgentQuarantine object (by label selector): the node agent cuts the
// pod's egress through its sandbox's control socket, the pod keeps
// running, the object's status names the pod under the node; the pod's
// author relabelling the pod does not lift it; deleting the object does.
func TestKubeQuarantine(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-aq")
	const nodeIP = "10.97.0.1"
	srv, err := serveHTTPReply(nodeIP+":0", "hello-from-allowed\n")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.ln.Close()
	writeNodePolicy(t, k, "e2e-kube-aq.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-aq}
spec:
  inherits: baseline
  network:
    egress: allowlist
    allow: [{cidr: %s/32, ports: [%d]}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-aq}
spec:
  role: e2e-kube-aq
  subjects: [{namespace: %s}]
`, nodeIP, srv.port, ns))
	t.Cleanup(func() { k.kubectl("delete", "agentquarantine", "e2e-bots", "--ignore-not-found") })
	script := fmt.Sprintf(`while :; do r=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 %s %d 2>&1 | tr '\r\n' '  '); echo "== try $(date +%%s): $r"; sleep 0.5; done`, nodeIP, srv.port)
	pod := podSpec(ns, "bot", "agentbox", "e2e-kube-aq", "sh", "-c", script)
	pod["metadata"].(obj)["labels"] = obj{"app": "bot"}
	k.apply(t, pod)
	p := k.waitPod(t, ns, "bot", 3*time.Minute, "Running", running)
	sandbox := k.sandboxOf(t, p.Metadata.UID)
	if logs := k.waitLogs(t, ns, "bot", "hello-from-allowed", 60*time.Second); !strings.Contains(logs, "hello-from-allowed") {
		t.Fatalf("before the quarantine, the allowed server: %s", clip(logs))
	}

	t0 := time.Now()
	k.apply(t, obj{"apiVersion": "agentbox.dev/v1", "kind": "AgentQuarantine", "metadata": obj{"name": "e2e-bots"},
		"spec": obj{"reason": "e2e: the bots were prompt-injected", "selector": obj{"namespace": ns, "matchLabels": obj{"app": "bot"}}}})
	var q *record
	eventually(t, 30*time.Second, func() bool {
		q = findRecord(k.trail(t, sandbox), "agentbox/quarantined")
		return q != nil
	})
	if q == nil {
		t.Fatal("no quarantine record within 30s of kubectl apply")
	}
	t.Logf("quarantined %.1fs after kubectl apply: %s", time.Since(t0).Seconds(), q.Message)
	if q.Detail["reason"] != "AgentQuarantine e2e-bots: e2e: the bots were prompt-injected" {
		t.Errorf("reason %q", q.Detail["reason"])
	}
	var status struct {
		Status struct {
			Nodes map[string]struct {
				AppliedAt string   `json:"appliedAt"`
				Pods      []string `json:"pods"`
			} `json:"nodes"`
		} `json:"status"`
	}
	eventually(t, 20*time.Second, func() bool {
		json.Unmarshal([]byte(k.mustKubectl(t, "get", "agentquarantine", "e2e-bots", "-o", "json")), &status)
		n := status.Status.Nodes["agentbox-node"]
		return len(n.Pods) == 1 && n.AppliedAt != ""
	})
	if n := status.Status.Nodes["agentbox-node"]; len(n.Pods) != 1 || n.Pods[0] != ns+"/bot" || n.AppliedAt == "" {
		t.Errorf("status.nodes: %+v", status.Status.Nodes)
	}
	cut := time.Now()
	time.Sleep(3 * time.Second)
	tries := triesOf(k.logs(t, ns, "bot"), "", cut.Add(time.Second))
	if len(tries) == 0 {
		t.Fatal("the pod printed nothing while quarantined: is it running?")
	}
	for _, l := range tries {
		if strings.Contains(l, "hello-from-allowed") {
			t.Errorf("a connection went through while quarantined: %s", l)
		}
	}
	if p := k.pod(t, ns, "bot"); !running(p) {
		t.Errorf("the pod is %s while quarantined, want Running", p.Status.Phase)
	}

	// The pod's author relabels it: the quarantine holds.
	k.mustKubectl(t, "-n", ns, "label", "pod", "bot", "app=innocent", "--overwrite")
	relabelled := time.Now()
	time.Sleep(4 * time.Second)
	for _, l := range triesOf(k.logs(t, ns, "bot"), "", relabelled.Add(time.Second)) {
		if strings.Contains(l, "hello-from-allowed") {
			t.Errorf("relabelling the pod lifted the quarantine: %s", l)
		}
	}
	if findRecord(k.trail(t, sandbox), "agentbox/released") != nil {
		t.Error("relabelling the pod released it")
	}

	// Deleting the object lifts it.
	k.mustKubectl(t, "delete", "agentquarantine", "e2e-bots")
	var rel *record
	eventually(t, 30*time.Second, func() bool {
		rel = findRecord(k.trail(t, sandbox), "agentbox/released")
		return rel != nil
	})
	if rel == nil {
		t.Fatal("no release record within 30s of deleting the AgentQuarantine")
	}
	released := time.Now()
	if !eventually(t, 20*time.Second, func() bool {
		for _, l := range triesOf(k.logs(t, ns, "bot"), "", released) {
			if strings.Contains(l, "hello-from-allowed") {
				return true
			}
		}
		return false
	}) {
		t.Error("egress did not come back after the AgentQuarantine was deleted")
	}
}
