//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKubeFork: a running agent-sandbox Sandbox forked from Kubernetes.
// Annotated agentbox.dev/fork: "2" by whoever may edit it (agentbox
// sandbox fork writes it, and waits for the answer), it is
// checkpointed by its node while it runs (it goes on counting), and the
// broker makes two copies: new Sandboxes, restored from the fork image
// and pinned to that node. Each copy goes on from the count it was forked
// at, as its own sandbox with its own trail, which begins by linking to
// the source's; once it runs, its template boots afresh. The twins: a
// request for more copies than a fork may make is refused with an Event
// and makes none, and a Sandbox that only says it is a copy is refused
// the image. (TestKubeClaimBinding forks a claimed agent: its copy holds
// none of the claim's keys.)
func TestKubeFork(t *testing.T) {
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "e2e-asb-fork")
	writeNodePolicy(t, k, "e2e-asb-fork.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-asb-fork}
spec:
  inherits: baseline
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-asb-fork}
spec:
  role: e2e-asb-fork
  subjects: [{namespace: %s}]
`, ns))
	srcSandbox, uid := k.counterSandbox(t, ns, asbSandbox(ns, "src", "e2e-asb-fork", "sh", "-c", asbCounter))

	// Too many copies: refused, none made.
	k.mustKubectl(t, "-n", ns, "annotate", "sandbox", "src", "agentbox.dev/fork=11")
	t.Logf("refused: %s", k.waitEvent(t, ns, "src", "ForkRefused", "from 1 to 10"))
	k.mustKubectl(t, "-n", ns, "annotate", "sandbox", "src", "agentbox.dev/fork-")

	// agentbox sandbox fork asks (the annotation) and waits for the copies.
	r := k.run(3*time.Minute, nil, filepath.Join(repoRoot, "_output", "bin", "agentbox"), "sandbox", "fork", "--sandbox", ns+"/src", "--copies", "2")
	if r.code != 0 || !strings.Contains(r.stdout, "Sandbox "+ns+"/src forked into checkpoint fork-"+uid) {
		t.Fatalf("agentbox sandbox fork: %v", r)
	}
	t.Logf("agentbox sandbox fork: %s", strings.TrimSpace(r.stdout))
	t.Logf("%s", k.waitEvent(t, ns, "src", "Forked", "forked the agent into checkpoint fork-"+uid))
	forked := k.mustKubectl(t, "-n", ns, "get", "sandbox", "src", "-o", `jsonpath={.metadata.annotations.agentbox\.dev/forked}`)
	image, list, ok := strings.Cut(forked, ": ")
	var copies []string
	for _, c := range strings.Split(list, ", ") {
		name, _, _ := strings.Cut(c, "=")
		copies = append(copies, name)
	}
	if !ok || !strings.HasPrefix(image, "fork-"+uid+"-") || len(copies) != 2 {
		t.Fatalf("the source's answer: %q", forked)
	}
	if left := k.mustKubectl(t, "-n", ns, "get", "sandbox", "src", "-o", `jsonpath={.metadata.annotations.agentbox\.dev/fork}`); left != "" {
		t.Errorf("the request is still on the source: %q", left)
	}
	if n := strings.Count(k.mustKubectl(t, "-n", ns, "get", "sandbox", "-o", "name"), "\n"); n != 3 {
		t.Errorf("%d Sandboxes, want the source and 2 copies (the refused request made none)", n)
	}
	srcCP := findRecord(k.trail(t, srcSandbox), "agentbox/checkpointed")
	if srcCP == nil || srcCP.Detail["checkpoint"] != image || srcCP.Detail["suspended"] != "false" {
		t.Fatalf("the source's record of the fork: %+v", srcCP)
	}

	// Each copy goes on from the fork, as its own sandbox.
	at := 0
	for _, c := range copies {
		k.waitSandboxPod(t, ns, c)
		cp := k.waitPod(t, ns, c, 3*time.Minute, "Running", running)
		n := counts(k.waitLogs(t, ns, c, "count ", time.Minute))
		if len(n) == 0 || n[0] <= 10 {
			t.Fatalf("copy %s counted %v: it did not go on from the fork", c, n[:min(len(n), 5)])
		}
		if at == 0 {
			at = n[0]
		} else if n[0] != at {
			t.Errorf("copy %s went on from %d, the other from %d: one image, one count", c, n[0], at)
		}
		sandbox := k.sandboxOf(t, cp.Metadata.UID)
		if sandbox == srcSandbox {
			t.Fatalf("copy %s is the source's sandbox", c)
		}
		recs := k.trail(t, sandbox)
		if len(recs) == 0 || recs[0].Event != "agentbox/restored" || recs[0].Detail["previous_sandbox"] != srcSandbox || recs[0].Detail["checkpoint"] != image {
			t.Fatalf("copy %s's trail does not begin with the link to the source's: %+v", c, recs[:min(len(recs), 1)])
		}
		for _, r := range recs {
			if r.Claim != nil {
				t.Errorf("copy %s's record %s carries a claim: %+v", c, r.Event, r.Claim)
			}
		}
		if ann := k.mustKubectl(t, "-n", ns, "get", "sandbox", c, "-o", `jsonpath={.metadata.annotations.agentbox\.dev/fork-of} {.metadata.annotations.agentbox\.dev/forked-from}`); ann != image+" "+ns+"/src" {
			t.Errorf("copy %s's annotations: %q", c, ann)
		}
		// Running: its template boots afresh from now on.
		if !eventually(t, 30*time.Second, func() bool {
			return k.mustKubectl(t, "-n", ns, "get", "sandbox", c, "-o", `jsonpath={.spec.podTemplate.metadata.annotations.agentbox\.dev/restore-from}`) == ""
		}) {
			t.Errorf("copy %s's template still names the fork image", c)
		}
	}
	// A Sandbox that only says it is a copy (whoever may create Sandboxes
	// can write these annotations): refused, the source's answer does
	// not name it.
	thief := asbSandbox(ns, "thief", "e2e-asb-fork", "sh", "-c", asbCounter)
	thief["metadata"].(obj)["annotations"] = obj{"agentbox.dev/fork-of": image, "agentbox.dev/forked-from": ns + "/src"}
	thief["spec"].(obj)["podTemplate"].(obj)["metadata"].(obj)["annotations"].(obj)["agentbox.dev/restore-from"] = image
	k.apply(t, thief)
	k.waitSandboxPod(t, ns, "thief")
	t.Logf("a Sandbox that says it is a copy: %s", clip(k.waitEvent(t, ns, "thief", "FailedCreatePodSandBox", "which is no copy of it its fork named")))
	k.kubectl("-n", ns, "delete", "sandbox", "thief", "--wait=false")
	if r := k.waitLogs(t, ns, "src", fmt.Sprintf("count %d\n", at+10), time.Minute); !strings.Contains(r, fmt.Sprintf("count %d\n", at+10)) {
		t.Errorf("the source stopped after the fork")
	}
	t.Logf("forked at count %d into %v; each went on from it, and the source went on", at-1, copies)
}

// forkHoldsNoClaimKey: a claim that gives its agent the vendor's key
// (fromClaim), and a fork of the claimed Sandbox. The source's request
// carries the claim's key; its copy's, made from the same memory, carries
// none (its gateway waits for a claim that never comes, then sends it
// without one), and no record of the copy's trail carries a claim.
func (k *kubeNode) forkHoldsNoClaimKey(t *testing.T, ns string, origin *authOrigin, key string, fetch func(pod, path, want string)) {
	t.Helper()
	name, sandbox := k.claimOf(t, ns, "task-4", "pool", obj{"agentbox.dev/task": "t-4", "agentbox.dev/key.vendor": "task-keys/token"})
	k.waitOwners(t, sandbox, "task-4", func(last record) bool { return last.Detail["holder"] == "task-4" })
	k.waitLogs(t, ns, name, "agent ready", time.Minute)
	fetch(name, "/source", "status=200")
	if got := origin.auth("/source"); got != "Bearer "+key {
		t.Fatalf("the claimed source's request carries %q, want the claim's key", got)
	}
	k.mustKubectl(t, "-n", ns, "annotate", "sandbox", name, "agentbox.dev/fork=1")
	k.waitEvent(t, ns, name, "Forked", "forked the agent into checkpoint fork-")
	forked := k.mustKubectl(t, "-n", ns, "get", "sandbox", name, "-o", `jsonpath={.metadata.annotations.agentbox\.dev/forked}`)
	_, list, _ := strings.Cut(forked, ": ")
	c, _, _ := strings.Cut(list, "=")
	if c == "" {
		t.Fatalf("the claimed source's answer: %q", forked)
	}
	k.waitSandboxPod(t, ns, c)
	cp := k.waitPod(t, ns, c, 3*time.Minute, "Running", running)
	fetch(c, "/copy", "status=200")
	if got := origin.auth("/copy"); strings.Contains(got, key) || strings.HasPrefix(got, "Bearer sk-") {
		t.Fatalf("the copy's request carries the source's claim key: %q", got)
	}
	copySandbox := k.sandboxOf(t, cp.Metadata.UID)
	var req *record
	var recs []record
	eventually(t, 30*time.Second, func() bool {
		recs = k.trail(t, copySandbox)
		for _, r := range recs {
			if r.Event == "agentbox/egress_request" && r.Detail["path"] == "/copy" {
				req = &r
			}
		}
		return req != nil
	})
	for _, r := range recs {
		if r.Claim != nil {
			t.Errorf("the copy's record %s carries the claim %+v", r.Event, r.Claim)
		}
	}
	if req == nil || !strings.HasPrefix(req.Detail["claim_key"], "none") || req.Detail["injected"] != "" {
		t.Fatalf("the copy's request record: %+v", req)
	}
	t.Logf("the copy %s of claimed %s: its request went without a key (%s)", c, name, req.Detail["claim_key"])
}

// asbCounter is an agent whose state is in memory: it counts, 5 a second.
const asbCounter = `i=0; while :; do i=$((i+1)); echo "count $i"; sleep 0.2; done`

// counterSandbox applies a Sandbox (of asbCounter) and waits for its pod
// to run, linked to it by the node agent, and to count to 10: its
// sandbox and the Sandbox's UID.
func (k *kubeNode) counterSandbox(t *testing.T, ns string, sbx obj) (string, string) {
	t.Helper()
	name := sbx["metadata"].(obj)["name"].(string)
	k.apply(t, sbx)
	k.waitSandboxPod(t, ns, name)
	p := k.waitPod(t, ns, name, 3*time.Minute, "Running", running)
	sandbox := k.sandboxOf(t, p.Metadata.UID)
	uid := k.mustKubectl(t, "-n", ns, "get", "sandbox", name, "-o", "jsonpath={.metadata.uid}")
	if !eventually(t, time.Minute, func() bool { return len(k.ownerRecords(t, sandbox)) > 0 }) {
		t.Fatal("the node agent did not link the pod to its Sandbox")
	}
	k.waitLogs(t, ns, name, "count 10\n", time.Minute)
	return sandbox, uid
}
