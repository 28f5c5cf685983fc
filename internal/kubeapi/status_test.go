package kubeapi

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func applied(ok bool) []metav1.Condition {
	st := metav1.ConditionTrue
	if !ok {
		st = metav1.ConditionFalse
	}
	return []metav1.Condition{{Type: ConditionApplied, Status: st}}
}

// An object's status from every node's report: active where a node
// enforces its generation, Invalid with any node's findings on that
// generation, ValidButSetRefused while a node refuses the set for another
// object.
func TestStatusOf(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Hour))
	ref := ObjectRef{Kind: KindRole, Name: "coder", Generation: 4}
	nodes := []AgentNodePolicy{
		{Status: NodeStatus{Objects: []ObjectRef{ref}, Conditions: applied(true)}},
		{Status: NodeStatus{Objects: []ObjectRef{{Kind: KindRole, Name: "coder", Generation: 3}}, Conditions: applied(true)}},
		{Status: NodeStatus{Objects: []ObjectRef{{Kind: KindRoleBinding, Name: "coder", Generation: 4}}, Conditions: applied(true)}},
	}
	st := StatusOf(ObjectStatus{}, ref, nodes, t0)
	if st.ActiveNodes != 1 || st.ObservedGeneration != 4 || len(st.Conditions) != 1 || st.Conditions[0].Status != metav1.ConditionTrue || st.Conditions[0].Reason != "Loaded" {
		t.Fatalf("%+v", st)
	}
	// Unchanged: the transition time stays, and SameStatus says so.
	st2 := StatusOf(st, ref, nodes, t1)
	if !st2.Conditions[0].LastTransitionTime.Equal(&t0) || !SameStatus(st, st2) {
		t.Fatalf("an unchanged condition moved: %+v", st2)
	}
	bad := append([]AgentNodePolicy(nil), nodes...)
	bad[1].Status.Conditions = applied(false)
	bad[1].Status.Refused = []ObjectProblems{
		{ObjectRef: ref, Problems: []string{"agentbox-cluster.yaml:9: spec.limits.memory: bad"}},
		{ObjectRef: ObjectRef{Kind: KindRole, Name: "coder", Generation: 3}, Problems: []string{"an older generation's"}},
	}
	b := StatusOf(st2, ref, bad, t1)
	c := b.Conditions[0]
	if c.Status != metav1.ConditionFalse || c.Reason != "Invalid" || c.Message != "agentbox-cluster.yaml:9: spec.limits.memory: bad" || !c.LastTransitionTime.Equal(&t1) || SameStatus(st2, b) {
		t.Fatalf("%+v", b)
	}
	other := StatusOf(st2, ObjectRef{Kind: KindRoleBinding, Name: "coder", Generation: 4}, bad, t1)
	if other.Conditions[0].Status != metav1.ConditionTrue || other.Conditions[0].Reason != "ValidButSetRefused" || other.ActiveNodes != 1 {
		t.Fatalf("%+v", other)
	}
	long := StatusOf(st, ref, []AgentNodePolicy{{Status: NodeStatus{Refused: []ObjectProblems{{ObjectRef: ref, Problems: []string{strings.Repeat("x", 10*MaxMessage)}}}}}}, t1)
	if len(long.Conditions[0].Message) > MaxMessage {
		t.Fatalf("message of %d bytes", len(long.Conditions[0].Message))
	}
}
