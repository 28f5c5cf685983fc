package kubeapi

// The status of the cluster's policy objects, computed from every node's
// AgentNodePolicy report: pure, so the broker writes it and the node agents
// (whose writes reach no further than their own node) only report.

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxMessage bounds a condition's message (the API allows 32768 bytes).
const MaxMessage = 4096

// ConditionApplied is a node report's condition: False while the newest
// set of objects is refused on that node.
const ConditionApplied = "Applied"

// StatusOf is a role's or binding's status at generation: Accepted
// (with the loaders' findings when False) from the nodes' reports, and how
// many nodes enforce that generation. Conditions keep their transition
// time while their status does not change.
func StatusOf(prev ObjectStatus, ref ObjectRef, nodes []AgentNodePolicy, now metav1.Time) ObjectStatus {
	var problems []string
	setRefused := false
	for _, n := range nodes {
		if c := meta.FindStatusCondition(n.Status.Conditions, ConditionApplied); c != nil && c.Status == metav1.ConditionFalse {
			setRefused = true
		}
		for _, r := range n.Status.Refused {
			if r.ObjectRef == ref {
				for _, p := range r.Problems {
					if !slices.Contains(problems, p) {
						problems = append(problems, p)
					}
				}
			}
		}
	}
	cond := metav1.Condition{Type: ConditionAccepted, ObservedGeneration: ref.Generation}
	switch {
	case len(problems) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, "Invalid"
		cond.Message = Truncate(strings.Join(problems, "\n"))
	case setRefused:
		// Valid itself, but the set it belongs to is not: it is not
		// enforced until the other objects are fixed.
		cond.Status, cond.Reason = metav1.ConditionTrue, "ValidButSetRefused"
		cond.Message = "this object loads, but another object of the set does not: nodes keep their last good snapshot"
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, "Loaded"
		cond.Message = "loads with the shim's loader, with every other policy object and the node's own files"
	}
	cond.LastTransitionTime = now
	return ObjectStatus{
		ObservedGeneration: ref.Generation,
		Conditions:         KeepTransition(prev.Conditions, cond),
		ActiveNodes:        ActiveNodes(nodes, ref),
	}
}

// ActiveNodes counts the nodes whose enforced snapshot holds ref at its
// generation.
func ActiveNodes(nodes []AgentNodePolicy, ref ObjectRef) int32 {
	var n int32
	for _, node := range nodes {
		if slices.Contains(node.Status.Objects, ref) {
			n++
		}
	}
	return n
}

// SameStatus reports whether writing b over a would change nothing a
// reader sees (so nothing is written, and no watcher woken, for nothing).
func SameStatus(a, b ObjectStatus) bool {
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

// KeepTransition returns c as the only condition, with the transition time
// of prev's condition of its type when its status did not change.
func KeepTransition(prev []metav1.Condition, c metav1.Condition) []metav1.Condition {
	if old := meta.FindStatusCondition(prev, c.Type); old != nil && old.Status == c.Status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	return []metav1.Condition{c}
}

// Truncate bounds a condition's message.
func Truncate(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	return s[:MaxMessage-len(" ...(truncated)")] + " ...(truncated)"
}
