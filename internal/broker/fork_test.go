package broker

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"agentbox.dev/agentbox/internal/policy"
)

// forkSource is Sandbox agents/sb1 (uid), asking for copies, held by a
// claim, with a template of its own.
func forkSource(ask string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"spec": map[string]any{"operatingMode": "Running", "podTemplate": map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{"agentbox.dev/role": "coder"}},
			"spec":     map[string]any{"runtimeClassName": "agentbox", "containers": []any{map[string]any{"name": "agent", "image": "a"}}},
		}},
	}}
	u.SetNamespace("agents")
	u.SetName("sb1")
	u.SetUID(types.UID(uid))
	if ask != "" {
		u.SetAnnotations(map[string]string{ForkAnnotation: ask})
	}
	u.SetLabels(map[string]string{"agents.x-k8s.io/claim": "task-1"})
	return u
}

// A fork's copies are the source's spec, restored from its fork image and
// pinned to the node; the node gets them only for its own running pod's
// Sandbox, as many as the Sandbox asks for, from that Sandbox's image.
func TestForkCopies(t *testing.T) {
	cp := ForkName(uid, time180())
	w := SandboxWrite{Op: OpForked, Sandbox: testSandbox().Ref, Checkpoint: cp, Copies: 2}
	running := ownPod("n1")
	copies, err := ForkCopies("n1", "host-n1", w, forkSource("2"), []Pod{running})
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 2 {
		t.Fatalf("%d copies", len(copies))
	}
	for i, c := range copies {
		want := "sb1-fork-180-" + string(rune('1'+i))
		restore, _, _ := unstructured.NestedString(c.Object, "spec", "podTemplate", "metadata", "annotations", policy.RestoreAnnotation)
		role, _, _ := unstructured.NestedString(c.Object, "spec", "podTemplate", "metadata", "annotations", "agentbox.dev/role")
		host, _, _ := unstructured.NestedString(c.Object, "spec", "podTemplate", "spec", "nodeSelector", HostnameLabel)
		_, hasMode, _ := unstructured.NestedString(c.Object, "spec", "operatingMode")
		switch {
		case c.GetName() != want || c.GetNamespace() != "agents" || c.GetKind() != "Sandbox":
			t.Errorf("copy %d: %s/%s %s, want agents/%s", i, c.GetNamespace(), c.GetName(), c.GetKind(), want)
		case restore != cp || role != "coder" || host != "host-n1" || hasMode:
			t.Errorf("copy %d: restore %q role %q host %q operatingMode kept %v", i, restore, role, host, hasMode)
		case c.GetAnnotations()[ForkOfAnnotation] != cp || c.GetAnnotations()[ForkedFromAnnotation] != "agents/sb1":
			t.Errorf("copy %d: annotations %v", i, c.GetAnnotations())
		case c.GetLabels()["agents.x-k8s.io/claim"] != "" || len(c.GetOwnerReferences()) > 0 || c.GetUID() != "":
			t.Errorf("copy %d holds the source's claim, owner or identity: %v %v %q", i, c.GetLabels(), c.GetOwnerReferences(), c.GetUID())
		}
	}
	// Each copy is its own: changing one changes neither the other nor
	// the source.
	unstructured.SetNestedField(copies[0].Object, "x", "spec", "podTemplate", "spec", "runtimeClassName")
	if rc, _, _ := unstructured.NestedString(copies[1].Object, "spec", "podTemplate", "spec", "runtimeClassName"); rc != "agentbox" {
		t.Errorf("the copies share their spec: %q", rc)
	}
	done := running
	done.Done = true
	other := ownPod("n1")
	other.ControllerUID = "someone-else"
	for _, tc := range []struct {
		name string
		node string
		ask  string
		w    func(*SandboxWrite)
		pods []Pod
		want string
	}{
		{"another node", "n2", "2", nil, []Pod{running}, "no running pod"},
		{"its pod ended", "n1", "2", nil, []Pod{done}, "no running pod"},
		{"a pod that is not the Sandbox's", "n1", "2", nil, []Pod{other}, "no running pod"},
		{"more copies than asked for", "n1", "2", func(w *SandboxWrite) { w.Copies = 5 }, []Pod{running}, "asks for 2 copies, not 5"},
		{"no fork asked for", "n1", "", nil, []Pod{running}, "asks for no fork"},
		{"too many", "n1", "11", func(w *SandboxWrite) { w.Copies = 11 }, []Pod{running}, "from 1 to 10"},
		{"not a number", "n1", "three", nil, []Pod{running}, "not a number of copies"},
		{"another Sandbox's image", "n1", "2", func(w *SandboxWrite) { w.Checkpoint = "fork-0000-180" }, []Pod{running}, "not a fork image"},
		{"a suspend image", "n1", "2", func(w *SandboxWrite) { w.Checkpoint = "sb-" + strings.ToLower(uid) + "-180" }, []Pod{running}, "not a fork image"},
		{"a stale UID", "n1", "2", func(w *SandboxWrite) { w.Sandbox.UID = "old" }, []Pod{running}, "has uid"},
		{"another op", "n1", "2", func(w *SandboxWrite) { w.Op = OpSuspended }, []Pod{running}, "is not forked"},
	} {
		ww := w
		if tc.w != nil {
			tc.w(&ww)
		}
		if c, err := ForkCopies(tc.node, "host-"+tc.node, ww, forkSource(tc.ask), tc.pods); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %d copies, %v; want an error with %q", tc.name, len(c), err, tc.want)
		}
	}
}

func time180() time.Time { return time.Unix(180, 0) }

// A long source name leaves a copy's name a DNS label.
func TestCopyName(t *testing.T) {
	long := strings.Repeat("a", 39) + "-" + strings.Repeat("b", 60)
	n := copyName(long, "fork-x-1796205600", 10)
	if len(n) > 63 || strings.Contains(n, "--") {
		t.Errorf("%q (%d)", n, len(n))
	}
}

// A copy is proven by its source's answer, by name and UID, for the
// source's own image; a Sandbox that only says it is a copy is not.
func TestProvenCopy(t *testing.T) {
	img := ForkName(uid, time180())
	forked := img + ": sb1-fork-180-1=u1, sb1-fork-180-2=u2"
	for _, tc := range []struct {
		name                       string
		image, src, forked, n, uid string
		want                       bool
	}{
		{"a copy the answer names", img, uid, forked, "sb1-fork-180-2", "u2", true},
		{"the same name, made again", img, uid, forked, "sb1-fork-180-2", "u3", false},
		{"another name", img, uid, forked, "mine", "u2", false},
		{"another image", ForkName(uid, time.Unix(181, 0)), uid, forked, "sb1-fork-180-1", "u1", false},
		{"another source's answer", img, "0000", forked, "sb1-fork-180-1", "u1", false},
		{"no answer", img, uid, "", "sb1-fork-180-1", "u1", false},
		{"no UID", img, uid, img + ": x=", "x", "", false},
	} {
		if got := ProvenCopy(tc.image, tc.src, tc.forked, tc.n, tc.uid); got != tc.want {
			t.Errorf("%s: %v", tc.name, got)
		}
	}
}
