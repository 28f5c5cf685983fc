package policysync

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sirupsen/logrus"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/kubeapi"
)

// QuarantinesGVR is the AgentQuarantine resource; PodsGVR the core pods
// the node agent reads labels of (its own node's only).
var (
	QuarantinesGVR = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.QuarantinesResource}
	PodsGVR        = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// quarantinePrefix starts the reason of a quarantine the node agent
// applied for an AgentQuarantine: "AgentQuarantine NAME: REASON". The
// agent lifts only those, and only when their object is gone.
const quarantinePrefix = "AgentQuarantine "

// QuarantineReason is the reason the node agent gives a sandbox's shim.
func QuarantineReason(object, reason string) string {
	return quarantinePrefix + object + ": " + reason
}

// quarantineOwner is the AgentQuarantine a sandbox's quarantine reason
// names ("" when an admin quarantined it by hand).
func quarantineOwner(reason string) string {
	rest, ok := strings.CutPrefix(reason, quarantinePrefix)
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, ": ")
	if !ok {
		return ""
	}
	return name
}

// Running is a sandbox on this node, as its shim and the API say.
type Running struct {
	ID, Pod     string
	Quarantined bool
	Reason      string
	// Labels are the pod's labels (nil when the API does not know it).
	Labels map[string]string
}

// QuarantineActions is what the node agent does for the AgentQuarantine
// objects.
type QuarantineActions struct {
	// Quarantine maps a sandbox to the reason to quarantine it with.
	Quarantine map[string]string
	// Release lists sandboxes whose AgentQuarantine is gone.
	Release []string
	// Pods are the pods each object holds quarantined on this node, by
	// object name (sorted).
	Pods map[string][]string
}

// selects says whether q names pod (NAMESPACE/NAME) with labels.
func selects(q kubeapi.AgentQuarantine, pod string, labels map[string]string) bool {
	ns, name, _ := strings.Cut(pod, "/")
	for _, p := range q.Spec.Pods {
		if p.Namespace == ns && p.Name == name {
			return true
		}
	}
	s := q.Spec.Selector
	if s == nil || len(s.MatchLabels) == 0 || labels == nil || (s.Namespace != "" && s.Namespace != ns) {
		return false
	}
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// PlanQuarantines decides, for the objects and this node's sandboxes: a
// pod an object selects is quarantined (by the first object, by name); a
// pod quarantined for an object stays so while the object exists, whatever
// its labels have become since (its author cannot lift it); a quarantine
// whose object is gone is lifted; a quarantine an admin made by hand is
// left alone. Pure.
func PlanQuarantines(objs []kubeapi.AgentQuarantine, running []Running) QuarantineActions {
	sort.Slice(objs, func(i, j int) bool { return objs[i].Name < objs[j].Name })
	exists := map[string]bool{}
	for _, q := range objs {
		exists[q.Name] = true
	}
	out := QuarantineActions{Quarantine: map[string]string{}, Pods: map[string][]string{}}
	for _, sb := range running {
		if sb.Pod == "" {
			continue
		}
		if sb.Quarantined {
			switch owner := quarantineOwner(sb.Reason); {
			case owner == "":
			case exists[owner]:
				out.Pods[owner] = append(out.Pods[owner], sb.Pod)
			default:
				out.Release = append(out.Release, sb.ID)
			}
			continue
		}
		for _, q := range objs {
			if selects(q, sb.Pod, sb.Labels) {
				out.Quarantine[sb.ID] = QuarantineReason(q.Name, q.Spec.Reason)
				out.Pods[q.Name] = append(out.Pods[q.Name], sb.Pod)
				break
			}
		}
	}
	for k := range out.Pods {
		sort.Strings(out.Pods[k])
	}
	return out
}

// quarantines reads the AgentQuarantine objects from the informer's cache.
func (a *Agent) quarantines() ([]kubeapi.AgentQuarantine, map[string]*unstructured.Unstructured) {
	var out []kubeapi.AgentQuarantine
	byName := map[string]*unstructured.Unstructured{}
	for _, item := range a.quarantineInf.GetStore().List() {
		u, ok := item.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var q kubeapi.AgentQuarantine
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &q); err != nil {
			a.Log.WithError(err).WithField("object", u.GetName()).Warn("an AgentQuarantine that does not decode")
			continue
		}
		out = append(out, q)
		byName[q.Name] = u
	}
	return out, byName
}

// podLabels is the labels of this node's pods, by NAMESPACE/NAME.
func (a *Agent) podLabels() map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, item := range a.podInf.GetStore().List() {
		if u, ok := item.(*unstructured.Unstructured); ok {
			l := u.GetLabels()
			if l == nil {
				l = map[string]string{}
			}
			out[u.GetNamespace()+"/"+u.GetName()] = l
		}
	}
	return out
}

// controlTimeout bounds one request to a sandbox's shim.
const controlTimeout = 10 * time.Second

// Quarantine applies the AgentQuarantine objects to this node's sandboxes
// and reports in their status.
func (a *Agent) Quarantine(ctx context.Context) error {
	if a.ControlDir == "" || a.quarantineInf == nil {
		return nil
	}
	objs, byName := a.quarantines()
	listed, err := control.List(a.ControlDir, controlTimeout)
	if err != nil {
		return err
	}
	a.linkOwners(ctx, listed)
	labels := a.podLabels()
	var running []Running
	sockets := map[string]string{}
	for _, l := range listed {
		if l.Sandbox == nil {
			continue
		}
		sb := l.Sandbox
		sockets[sb.ID] = l.Socket
		running = append(running, Running{ID: sb.ID, Pod: sb.Pod, Quarantined: sb.Quarantined, Reason: sb.QuarantineReason, Labels: labels[sb.Pod]})
	}
	acts := PlanQuarantines(objs, running)
	errs := map[string]string{}
	applied := map[string]bool{}
	for id, reason := range acts.Quarantine {
		owner := quarantineOwner(reason)
		resp, err := control.Call(sockets[id], control.Request{Op: control.OpQuarantine, Reason: reason}, controlTimeout)
		if err != nil {
			errs[owner] = fmt.Sprintf("sandbox %s: %v", id, err)
			a.Log.WithError(err).WithField("sandbox", id).Warn("AgentQuarantine " + owner)
			continue
		}
		applied[owner] = true
		a.Log.WithFields(map[string]any{"sandbox": id, "object": owner}).Info(resp.Message)
	}
	for _, id := range acts.Release {
		if _, err := control.Call(sockets[id], control.Request{Op: control.OpRelease}, controlTimeout); err != nil {
			a.Log.WithError(err).WithField("sandbox", id).Warn("lifting a quarantine whose AgentQuarantine is gone")
			continue
		}
		a.Log.WithField("sandbox", id).Info("quarantine lifted: its AgentQuarantine was deleted")
	}
	for _, q := range objs {
		if err := a.reportQuarantine(ctx, byName[q.Name], q, acts.Pods[q.Name], errs[q.Name], applied[q.Name]); err != nil {
			a.Log.WithError(err).WithField("object", q.Name).Warn("report an AgentQuarantine's status")
		}
	}
	return nil
}

// reportQuarantine writes this node's entry of an object's status when it
// changed (a merge patch of status.nodes.NODE: other nodes' entries stay).
func (a *Agent) reportQuarantine(ctx context.Context, u *unstructured.Unstructured, q kubeapi.AgentQuarantine, pods []string, errText string, applied bool) error {
	cur, had := q.Status.Nodes[a.NodeName]
	if had && slices.Equal(cur.Pods, pods) && cur.Error == errText && !applied {
		return nil
	}
	if !had && len(pods) == 0 && errText == "" {
		return nil
	}
	entry := kubeapi.NodeQuarantine{AppliedAt: cur.AppliedAt, Pods: pods, Error: errText}
	if applied || entry.AppliedAt == nil {
		now := metav1.Now()
		entry.AppliedAt = &now
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"nodes": map[string]any{a.NodeName: entry}}})
	if err != nil {
		return err
	}
	_, err = a.Client.Resource(QuarantinesGVR).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// runQuarantines applies the objects whenever one or a pod of this node
// changes, and every second (a sandbox appears on the node a moment after
// its pod does).
// slowRound is how long a round over the node's sandboxes may take before
// the node agent says so (what it links and quarantines waits for it).
const slowRound = 250 * time.Millisecond

func (a *Agent) runQuarantines(ctx context.Context, kick <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		start := time.Now()
		if err := a.Quarantine(ctx); err != nil {
			a.Log.WithError(err).Warn("quarantine")
		}
		mid := time.Now()
		a.placeDataKeys(ctx)
		if d := time.Since(start); d > slowRound {
			a.Log.WithFields(logrus.Fields{"sandboxes_ms": mid.Sub(start).Milliseconds(), "data_keys_ms": time.Since(mid).Milliseconds()}).
				Warnf("a round over this node's sandboxes took %s: quarantines, owners and claims wait for it", d.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-tick.C:
		}
	}
}
