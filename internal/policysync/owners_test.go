package policysync

import (
	"agentbox.dev/agentbox/internal/broker"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/control"
)

func object(apiVersion, kind, ns, name, uid string, owner map[string]any, ann map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"namespace": ns, "name": name, "uid": uid}
	if owner != nil {
		meta["ownerReferences"] = []any{owner}
	}
	if ann != nil {
		meta["annotations"] = ann
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}}
}

func ownerRef(apiVersion, kind, name, uid string, controller bool) map[string]any {
	return map[string]any{"apiVersion": apiVersion, "kind": kind, "name": name, "uid": uid, "controller": controller}
}

// readyPod is pod with its Ready condition True (beside another).
func readyPod(pod *unstructured.Unstructured) *unstructured.Unstructured {
	pod.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "PodScheduled", "status": "True"}, map[string]any{"type": "Ready", "status": "True"}}}
	return pod
}

func TestOwnerOf(t *testing.T) {
	claim := ownerRef("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", "claim-uid", true)
	pool := ownerRef("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool", "pool", "pool-uid", true)
	sandboxes := map[string]*unstructured.Unstructured{
		"ns/sb":      object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "sb", "sb-uid", claim, nil),
		"ns/warm":    object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "warm", "warm-uid", pool, nil),
		"ns/alone":   object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "alone", "alone-uid", nil, nil),
		"ns/adopted": object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "adopted", "adopted-uid", nil, map[string]any{SandboxPodNameAnnotation: "pool-abc"}),
		"ns/foreign": object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "foreign", "foreign-uid", ownerRef("apps/v1", "Deployment", "d", "d-uid", true), nil),
		// A fork: src answered it naming copy (by name and UID); claims
		// says it is a copy and is not named.
		"ns/src":    object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "src", "5c", nil, map[string]any{broker.ForkedAnnotation: "fork-5c-9: copy=copy-uid"}),
		"ns/copy":   object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "copy", "copy-uid", nil, map[string]any{broker.ForkOfAnnotation: "fork-5c-9", broker.ForkedFromAnnotation: "ns/src"}),
		"ns/claims": object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "claims", "claims-uid", nil, map[string]any{broker.ForkOfAnnotation: "fork-5c-9", broker.ForkedFromAnnotation: "ns/src"}),
		"ns/far":    object("agents.x-k8s.io/v1beta1", "Sandbox", "ns", "far", "copy-uid", nil, map[string]any{broker.ForkOfAnnotation: "fork-5c-9", broker.ForkedFromAnnotation: "other/src"}),
	}
	byKey := func(k string) *unstructured.Unstructured { return sandboxes[k] }
	sbRef := func(name, uid string) map[string]any {
		return ownerRef("agents.x-k8s.io/v1beta1", "Sandbox", name, uid, true)
	}
	for _, tc := range []struct {
		name    string
		pod     *unstructured.Unstructured
		want    *control.Owner
		wantErr string
	}{
		{"claimed", object("v1", "Pod", "ns", "sb", "p1", sbRef("sb", "sb-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "sb", UID: "sb-uid"}, Holder: &control.ObjectRef{Kind: "SandboxClaim", Namespace: "ns", Name: "c1", UID: "claim-uid"}}, ""},
		{"warm", object("v1", "Pod", "ns", "warm", "p2", sbRef("warm", "warm-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "warm", UID: "warm-uid"}, Holder: &control.ObjectRef{Kind: "SandboxWarmPool", Namespace: "ns", Name: "pool", UID: "pool-uid"}}, ""},
		{"warm and ready", readyPod(object("v1", "Pod", "ns", "warm", "p2", sbRef("warm", "warm-uid"), nil)),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "warm", UID: "warm-uid"}, Holder: &control.ObjectRef{Kind: "SandboxWarmPool", Namespace: "ns", Name: "pool", UID: "pool-uid"}, Ready: true}, ""},
		{"no holder", object("v1", "Pod", "ns", "alone", "p3", sbRef("alone", "alone-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "alone", UID: "alone-uid"}}, ""},
		{"adopted by annotation", object("v1", "Pod", "ns", "pool-abc", "p4", sbRef("adopted", "adopted-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "adopted", UID: "adopted-uid"}}, ""},
		{"a holder of another kind is not named", object("v1", "Pod", "ns", "foreign", "p5", sbRef("foreign", "foreign-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "foreign", UID: "foreign-uid"}}, ""},
		{"a fork's copy its source named", object("v1", "Pod", "ns", "copy", "p13", sbRef("copy", "copy-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "copy", UID: "copy-uid"}, ForkOf: "fork-5c-9"}, ""},
		{"a Sandbox that only says it is a copy", object("v1", "Pod", "ns", "claims", "p14", sbRef("claims", "claims-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "claims", UID: "claims-uid"}}, ""},
		{"a copy of another namespace's Sandbox", object("v1", "Pod", "ns", "far", "p15", sbRef("far", "copy-uid"), nil),
			&control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: "ns", Name: "far", UID: "copy-uid"}}, ""},
		{"no owner", object("v1", "Pod", "ns", "x", "p6", nil, nil), nil, ""},
		{"not a controller", object("v1", "Pod", "ns", "sb", "p7", ownerRef("agents.x-k8s.io/v1beta1", "Sandbox", "sb", "sb-uid", false), nil), nil, ""},
		{"another group's Sandbox", object("v1", "Pod", "ns", "sb", "p8", ownerRef("evil.example/v1", "Sandbox", "sb", "sb-uid", true), nil), nil, ""},
		{"a forged UID", object("v1", "Pod", "ns", "sb", "p9", sbRef("sb", "other-uid"), nil), nil, "that Sandbox's UID is sb-uid"},
		{"a Sandbox that is not there", object("v1", "Pod", "ns", "gone", "p10", sbRef("gone", "gone-uid"), nil), nil, "there is none"},
		{"another namespace's Sandbox", object("v1", "Pod", "other", "sb", "p11", sbRef("sb", "sb-uid"), nil), nil, "there is none"},
		{"a pod the Sandbox does not name", object("v1", "Pod", "ns", "impostor", "p12", sbRef("sb", "sb-uid"), nil), nil, "whose pod is sb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := OwnerOf(tc.pod, byKey)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !sameOwner(got, tc.want) {
				t.Fatalf("got %+v (holder %+v), %v; want %+v", got, holder(got), err, tc.want)
			}
		})
	}
}

func holder(o *control.Owner) any {
	if o == nil {
		return nil
	}
	return o.Holder
}

func TestSuspendName(t *testing.T) {
	uid := "297a7bf9-d45e-4386-92c5-d92098b9e705"
	name := SuspendName(uid, time.Unix(1796340781, 0))
	if name != "sb-297a7bf9-d45e-4386-92c5-d92098b9e705-1796340781" {
		t.Fatalf("SuspendName: %q", name)
	}
	if err := checkpoint.ValidName(name); err != nil {
		t.Fatal(err)
	}
	if got, ok := suspendUID(name); !ok || got != uid {
		t.Fatalf("suspendUID: %q %v", got, ok)
	}
	for _, n := range []string{"cp-1", "sb-", "sb-uid-", "sb-uid-12x", "sandbox-uid-1"} {
		if _, ok := suspendUID(n); ok {
			t.Errorf("suspendUID(%q) took it for a suspend's", n)
		}
	}
}

// A running sandbox restored from the checkpoint its Sandbox's template
// names is that Sandbox's resume only when the image is its own suspend's:
// a fork's copy, restored from another Sandbox's, is not.
func TestResumed(t *testing.T) {
	own := SuspendName("AB-12", time.Unix(100, 0))
	other := SuspendName("cd-34", time.Unix(100, 0))
	for _, tc := range []struct {
		name, annotated, restored, state string
		want                             bool
	}{
		{"its own suspend image", own, own, "running", true},
		{"another Sandbox's image (a fork's copy)", other, other, "running", false},
		{"a checkpoint not a suspend's", "explore-7", "explore-7", "running", false},
		{"not restored from it", own, "", "running", false},
		{"not running yet", own, own, "created", false},
		{"no annotation", "", "", "running", false},
	} {
		sb := &control.Sandbox{RestoredFrom: tc.restored, State: tc.state}
		if got := resumed(tc.annotated, sb, "AB-12"); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A fork image goes once no Sandbox names it and it is older than
// forkKeep; a live Sandbox's suspend image, a named fork image and a
// fresh one stay. A deleted Sandbox's suspend image goes.
func TestGCForks(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-forkKeep - time.Minute)
	for _, n := range []string{"fork-5c-1", "fork-5c-2", "fork-5c-3", "sb-5c-4", "sb-6d-5"} {
		if err := os.MkdirAll(filepath.Join(dir, n), 0o700); err != nil {
			t.Fatal(err)
		}
		if n != "fork-5c-3" {
			os.Chtimes(filepath.Join(dir, n), old, old)
		}
	}
	a := &Agent{NodeName: "n1", CheckpointDir: dir, Log: logrus.NewEntry(logrus.New())}
	a.removeStale(dir, "the node's store", (&checkpoint.Store{Dir: dir}).Remove, map[string]bool{"5c": true}, map[string]bool{"fork-5c-2": true})
	for n, want := range map[string]bool{"fork-5c-1": false, "fork-5c-2": true, "fork-5c-3": true, "sb-5c-4": true, "sb-6d-5": false} {
		if _, err := os.Stat(filepath.Join(dir, n)); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", n, err == nil, want)
		}
	}
}
