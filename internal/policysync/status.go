package policysync

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"agentbox.dev/agentbox/internal/kubeapi"
)

// NodeStatus is a node's report after an outcome: the snapshot it
// enforces (applied now, or kept), Applied False with the reasons while
// the newest set is refused, and the objects its loader refused, at the
// generations tried (gens, by object key), with its findings: the broker
// writes each object's status from every node's report.
func NodeStatus(prev kubeapi.NodeStatus, out Outcome, s *Snapshot, gens map[string]int64, now metav1.Time) kubeapi.NodeStatus {
	st := prev
	st.Refused = nil
	for _, k := range slices.Sorted(maps.Keys(out.ObjectProblems)) {
		kind, name, _ := strings.Cut(k, "/")
		st.Refused = append(st.Refused, kubeapi.ObjectProblems{ObjectRef: kubeapi.ObjectRef{Kind: kind, Name: name, Generation: gens[k]},
			Problems: out.ObjectProblems[k]})
	}
	cond := metav1.Condition{Type: kubeapi.ConditionApplied, LastTransitionTime: now}
	if out.Applied || out.Unchanged {
		if out.Applied || st.Digest != s.Digest {
			st.AppliedAt = &now
		}
		st.Digest, st.Objects = s.Digest, s.Objects
		cond.Status, cond.Reason = metav1.ConditionTrue, "Enforced"
		cond.Message = fmt.Sprintf("enforcing %d object(s), snapshot %s", len(s.Objects), short(s.Digest))
	} else {
		cond.Status, cond.Reason = metav1.ConditionFalse, "Refused"
		cond.Message = kubeapi.Truncate(fmt.Sprintf("the newest set (%s) does not load; still enforcing %s:\n%s", short(s.Digest), orNone(short(st.Digest)), strings.Join(out.problemLines(), "\n")))
	}
	st.Conditions = kubeapi.KeepTransition(prev.Conditions, cond)
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
