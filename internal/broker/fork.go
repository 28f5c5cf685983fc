package broker

// Fork from Kubernetes. Whoever may edit a Sandbox asks for copies of its
// running agent with an annotation (ForkAnnotation: "3"); the node its pod
// runs on checkpoints it while it runs and asks the broker (OpForked) to
// make the copies: new Sandboxes, each the source's spec with its pod
// template naming the checkpoint and pinned to that node, whose store
// holds the image. A node cannot make Sandboxes: the broker makes only
// copies of a Sandbox whose own pod is bound to the asking node, only as
// many as the Sandbox's own annotation asks for, and only from that
// Sandbox's fork image. Pure and table-tested, as grant.go.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"agentbox.dev/agentbox/internal/policy"
)

const (
	// ForkAnnotation on a Sandbox asks for that many copies of its agent.
	ForkAnnotation = "agentbox.dev/fork"
	// ForkedAnnotation is the broker's answer on the source: the
	// checkpoint and the copies made from it.
	ForkedAnnotation = "agentbox.dev/forked"
	// ForkOfAnnotation on a copy names the fork image it was made from;
	// ForkedFromAnnotation the source Sandbox (namespace/name).
	ForkOfAnnotation     = "agentbox.dev/fork-of"
	ForkedFromAnnotation = "agentbox.dev/forked-from"
	// MaxForkCopies bounds one fork.
	MaxForkCopies = 10
	// OpForked asks the broker for a fork's copies.
	OpForked = "forked"
)

// forkRE is the name of a fork's image: fork-UID-UNIXSECONDS.
var forkRE = regexp.MustCompile(`^fork-([0-9a-f-]{1,40})-([0-9]{1,19})$`)

// ForkName is the image a fork of Sandbox uid takes at t.
func ForkName(uid string, t time.Time) string {
	return fmt.Sprintf("fork-%s-%d", strings.ToLower(uid), t.Unix())
}

// ForkImage says whether checkpoint is a fork image (of any Sandbox).
func ForkImage(checkpoint string) bool { return forkRE.MatchString(checkpoint) }

// forkImageOf says whether checkpoint is a fork image of Sandbox uid.
func forkImageOf(checkpoint, uid string) bool { return imageOf(forkRE, checkpoint, uid) }

// ForkCount reads ForkAnnotation's value: a number of copies, 1 to
// MaxForkCopies.
func ForkCount(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 || n > MaxForkCopies {
		return 0, fmt.Errorf("%s: %q is not a number of copies from 1 to %d", ForkAnnotation, v, MaxForkCopies)
	}
	return n, nil
}

// copyName is a fork's i-th copy: the source's name (cut to leave room),
// the image's time and i; a DNS label, as a pod's name must be.
func copyName(src, checkpoint string, i int) string {
	ts := checkpoint[strings.LastIndexByte(checkpoint, '-')+1:]
	if len(src) > 40 {
		src = strings.TrimRight(src[:40], "-.")
	}
	return fmt.Sprintf("%s-fork-%s-%d", src, ts, i)
}

// ForkCopies decides a node's OpForked on src, the Sandbox as the API has
// it: the copies to create. hostname is the node's, which each copy is
// pinned to.
func ForkCopies(node, hostname string, w SandboxWrite, src *unstructured.Unstructured, pods []Pod) ([]*unstructured.Unstructured, error) {
	sb := sandboxOf(src)
	switch {
	case w.Op != OpForked:
		return nil, fmt.Errorf("op %q is not %s", w.Op, OpForked)
	case w.Sandbox.UID != sb.UID || w.Sandbox.Namespace != sb.Namespace || w.Sandbox.Name != sb.Name:
		return nil, fmt.Errorf("Sandbox %s has uid %s, not %s", sb, sb.UID, w.Sandbox.UID)
	case !forkImageOf(w.Checkpoint, sb.UID):
		return nil, fmt.Errorf("checkpoint %q is not a fork image of Sandbox %s (uid %s)", w.Checkpoint, sb, sb.UID)
	case hostname == "":
		return nil, fmt.Errorf("node %q has no hostname to pin the copies to", node)
	}
	asked, ok := src.GetAnnotations()[ForkAnnotation]
	if !ok {
		return nil, fmt.Errorf("Sandbox %s asks for no fork (%s)", sb, ForkAnnotation)
	}
	n, err := ForkCount(asked)
	if err != nil {
		return nil, err
	}
	if w.Copies != n {
		return nil, fmt.Errorf("Sandbox %s asks for %d copies, not %d", sb, n, w.Copies)
	}
	if pod := ownPodOn(node, sb, pods); pod == nil || pod.Done || pod.Deleting {
		return nil, fmt.Errorf("no running pod of Sandbox %s is bound to node %q", sb, node)
	}
	spec, ok, _ := unstructured.NestedMap(src.Object, "spec")
	if !ok {
		return nil, fmt.Errorf("Sandbox %s has no spec", sb)
	}
	var copies []*unstructured.Unstructured
	for i := 1; i <= n; i++ {
		c := &unstructured.Unstructured{Object: map[string]any{"spec": runtime.DeepCopyJSON(spec)}}
		c.SetAPIVersion(src.GetAPIVersion())
		c.SetKind(src.GetKind())
		c.SetNamespace(sb.Namespace)
		c.SetName(copyName(sb.Name, w.Checkpoint, i))
		c.SetLabels(map[string]string{"agentbox.dev/fork": "copy"})
		c.SetAnnotations(map[string]string{ForkOfAnnotation: w.Checkpoint, ForkedFromAnnotation: sb.String()})
		// A copy runs, whatever the source was asked to do next.
		unstructured.RemoveNestedField(c.Object, "spec", "operatingMode")
		if err := unstructured.SetNestedField(c.Object, w.Checkpoint, "spec", "podTemplate", "metadata", "annotations", policy.RestoreAnnotation); err != nil {
			return nil, err
		}
		if err := unstructured.SetNestedField(c.Object, hostname, "spec", "podTemplate", "spec", "nodeSelector", HostnameLabel); err != nil {
			return nil, err
		}
		copies = append(copies, c)
	}
	return copies, nil
}

// ForkedPatch answers a source's request: ForkAnnotation off, and
// ForkedAnnotation naming the image and the copies made, each NAME=UID:
// the proof a copy's pod may restore the image (ProvenCopy).
func ForkedPatch(image string, made []Ref) ([]byte, error) {
	var list []string
	for _, r := range made {
		list = append(list, r.Name+"="+r.UID)
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		ForkAnnotation:   nil,
		ForkedAnnotation: image + ": " + strings.Join(list, ", "),
	}}})
}

// ProvenCopy says whether Sandbox name (uid) is a copy of image, by its
// source's answer forked (ForkedAnnotation) and the source's uid: the
// image is the source's, and the answer names it and the copy by name
// and UID. A Sandbox that only says it is a copy (ForkOfAnnotation) is
// none: whoever may create Sandboxes could say so.
func ProvenCopy(image, srcUID, forked, name, uid string) bool {
	img, list, ok := strings.Cut(forked, ": ")
	if !ok || img != image || !forkImageOf(image, srcUID) || uid == "" {
		return false
	}
	for _, c := range strings.Split(list, ", ") {
		if c == name+"="+uid {
			return true
		}
	}
	return false
}
