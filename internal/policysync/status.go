package policysync

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"agentbox.dev/agentbox/internal/kubeapi"
)

// MaxMessage bounds a condition's message (the API allows 32768 bytes).
const MaxMessage = 4096

// ObjectStatus is the status one node's agent writes on a role or
// binding: Accepted (with the loader's findings when False) for the
// object's current generation, and how many nodes enforce that generation,
// counted from the nodes' AgentNodePolicy reports. Conditions keep their
// transition time while their status does not change.
func ObjectStatus(prev kubeapi.ObjectStatus, obj Object, problems []string, snapshotRefused bool, nodes []kubeapi.AgentNodePolicy, now metav1.Time) kubeapi.ObjectStatus {
	cond := metav1.Condition{Type: kubeapi.ConditionAccepted, ObservedGeneration: obj.Generation}
	switch {
	case len(problems) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, "Invalid"
		cond.Message = truncate(strings.Join(problems, "\n"))
	case snapshotRefused:
		// Valid itself, but the set it belongs to is not: it is not
		// enforced until the other objects are fixed.
		cond.Status, cond.Reason = metav1.ConditionTrue, "ValidButSetRefused"
		cond.Message = "this object loads, but another object of the set does not: nodes keep their last good snapshot"
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, "Loaded"
		cond.Message = "loads with the shim's loader, with every other policy object and the node's own files"
	}
	cond.LastTransitionTime = now
	return kubeapi.ObjectStatus{
		ObservedGeneration: obj.Generation,
		Conditions:         keepTransition(prev.Conditions, cond),
		ActiveNodes:        ActiveNodes(nodes, obj),
	}
}

// ActiveNodes counts the nodes whose enforced snapshot holds obj at its
// current generation.
func ActiveNodes(nodes []kubeapi.AgentNodePolicy, obj Object) int32 {
	var n int32
	for _, node := range nodes {
		for _, o := range node.Status.Objects {
			if o.Kind == obj.Kind && o.Name == obj.Name && o.Generation == obj.Generation {
				n++
				break
			}
		}
	}
	return n
}

// SameStatus reports whether writing b over a would change nothing a
// reader sees (so the agent does not write, and wake every other agent,
// for nothing).
func SameStatus(a, b kubeapi.ObjectStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.ActiveNodes != b.ActiveNodes || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}

// NodeStatus is a node's report after an outcome: the snapshot it
// enforces (applied now, or kept), and Applied False with the reasons
// while the newest set is refused.
func NodeStatus(prev kubeapi.NodeStatus, out Outcome, s *Snapshot, now metav1.Time) kubeapi.NodeStatus {
	st := prev
	cond := metav1.Condition{Type: "Applied", LastTransitionTime: now}
	if out.Applied || out.Unchanged {
		if out.Applied || st.Digest != s.Digest {
			st.AppliedAt = &now
		}
		st.Digest, st.Objects = s.Digest, s.Objects
		cond.Status, cond.Reason = metav1.ConditionTrue, "Enforced"
		cond.Message = fmt.Sprintf("enforcing %d object(s), snapshot %s", len(s.Objects), short(s.Digest))
	} else {
		cond.Status, cond.Reason = metav1.ConditionFalse, "Refused"
		cond.Message = truncate(fmt.Sprintf("the newest set (%s) does not load; still enforcing %s:\n%s", short(s.Digest), orNone(short(st.Digest)), strings.Join(out.problemLines(), "\n")))
	}
	st.Conditions = keepTransition(prev.Conditions, cond)
	return st
}

// problemLines lists the outcome's problems, one per line: the objects'
// (by key, each in the loader's order), then the node's own files'.
func (out Outcome) problemLines() []string {
	keys := make([]string, 0, len(out.ObjectProblems))
	for k := range out.ObjectProblems {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var lines []string
	for _, k := range keys {
		for _, p := range out.ObjectProblems[k] {
			lines = append(lines, k+": "+p)
		}
	}
	return append(lines, out.NodeProblems...)
}

// keepTransition returns c as the only condition, with the transition time
// of prev's condition of its type when its status did not change.
func keepTransition(prev []metav1.Condition, c metav1.Condition) []metav1.Condition {
	if old := meta.FindStatusCondition(prev, c.Type); old != nil && old.Status == c.Status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	return []metav1.Condition{c}
}

func short(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

func orNone(s string) string {
	if s == "" {
		return "no snapshot"
	}
	return s
}

func truncate(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	return s[:MaxMessage-len(" ...(truncated)")] + " ...(truncated)"
}
