package policysync

import (
	"fmt"
	"testing"

	"agentbox.dev/agentbox/internal/kubeapi"
)

func aq(name, reason string, pods []kubeapi.PodRef, sel *kubeapi.PodSelector) kubeapi.AgentQuarantine {
	q := kubeapi.AgentQuarantine{Spec: kubeapi.QuarantineSpec{Reason: reason, Pods: pods, Selector: sel}}
	q.Name = name
	return q
}

// The node agent quarantines what an object selects, keeps it quarantined
// while the object exists whatever the pod's labels become, lifts it when
// the object is deleted, and leaves an admin's own quarantine alone.
func TestPlanQuarantines(t *testing.T) {
	byName := aq("incident-7", "exfiltration", []kubeapi.PodRef{{Namespace: "agents", Name: "coder-1"}}, nil)
	byLabel := aq("bots", "prompt injection", nil, &kubeapi.PodSelector{Namespace: "agents", MatchLabels: map[string]string{"app": "bot"}})
	bot := map[string]string{"app": "bot", "team": "x"}
	for _, tc := range []struct {
		name                string
		objs                []kubeapi.AgentQuarantine
		running             []Running
		quarantine, release string
		pods                string
	}{
		{name: "by name", objs: []kubeapi.AgentQuarantine{byName},
			running:    []Running{{ID: "s1", Pod: "agents/coder-1"}, {ID: "s2", Pod: "agents/coder-2"}, {ID: "s3", Pod: "other/coder-1"}},
			quarantine: "map[s1:AgentQuarantine incident-7: exfiltration]", pods: "map[incident-7:[agents/coder-1]]"},
		{name: "by label, in its namespace only", objs: []kubeapi.AgentQuarantine{byLabel},
			running:    []Running{{ID: "s1", Pod: "agents/a", Labels: bot}, {ID: "s2", Pod: "agents/b", Labels: map[string]string{"app": "web"}}, {ID: "s3", Pod: "other/c", Labels: bot}, {ID: "s4", Pod: "agents/d"}},
			quarantine: "map[s1:AgentQuarantine bots: prompt injection]", pods: "map[bots:[agents/a]]"},
		{name: "relabelled by its author: stays quarantined", objs: []kubeapi.AgentQuarantine{byLabel},
			running:    []Running{{ID: "s1", Pod: "agents/a", Labels: map[string]string{"app": "innocent"}, Quarantined: true, Reason: "AgentQuarantine bots: prompt injection"}},
			quarantine: "map[]", pods: "map[bots:[agents/a]]"},
		{name: "object deleted: lifted", objs: nil,
			running:    []Running{{ID: "s1", Pod: "agents/a", Quarantined: true, Reason: "AgentQuarantine bots: prompt injection"}},
			quarantine: "map[]", release: "[s1]", pods: "map[]"},
		{name: "an admin's own quarantine is not the agent's", objs: nil,
			running:    []Running{{ID: "s1", Pod: "agents/a", Quarantined: true, Reason: "by hand: AgentQuarantine x: y"}},
			quarantine: "map[]", pods: "map[]"},
		{name: "the first object by name", objs: []kubeapi.AgentQuarantine{byName, aq("a-first", "first", []kubeapi.PodRef{{Namespace: "agents", Name: "coder-1"}}, nil)},
			running:    []Running{{ID: "s1", Pod: "agents/coder-1"}},
			quarantine: "map[s1:AgentQuarantine a-first: first]", pods: "map[a-first:[agents/coder-1]]"},
		{name: "not a pod (ctr)", objs: []kubeapi.AgentQuarantine{byLabel},
			running:    []Running{{ID: "s1", Labels: bot}},
			quarantine: "map[]", pods: "map[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acts := PlanQuarantines(tc.objs, tc.running)
			if got := fmt.Sprint(acts.Quarantine); got != tc.quarantine {
				t.Errorf("quarantine %s, want %s", got, tc.quarantine)
			}
			if got := fmt.Sprint(acts.Release); (tc.release == "" && len(acts.Release) > 0) || (tc.release != "" && got != tc.release) {
				t.Errorf("release %s, want %s", got, tc.release)
			}
			if got := fmt.Sprint(acts.Pods); got != tc.pods {
				t.Errorf("pods %s, want %s", got, tc.pods)
			}
		})
	}
}
