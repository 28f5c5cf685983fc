package policysync

// kubernetes-sigs/agent-sandbox: the node agent tells each sandbox's shim
// which Sandbox its pod belongs to, and what holds that Sandbox (the
// SandboxClaim that claimed it, or the SandboxWarmPool keeping it warm), so
// that the trail names them. The CRI gives the runtime neither: a pod's
// owner references and a Sandbox's are only in the API server.

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/sirupsen/logrus"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/control"
)

// agent-sandbox's API: its Sandbox, and what holds one (the broker's
// names for them).
const (
	SandboxGroup           = broker.SandboxGroup
	SandboxExtensionsGroup = broker.SandboxExtensionsGroup
	// SandboxPodNameAnnotation names a Sandbox's pod when it is not the
	// Sandbox's own name (a pod adopted by older versions).
	SandboxPodNameAnnotation = "agents.x-k8s.io/pod-name"
)

// SandboxesGVR is agent-sandbox's Sandbox resource.
var SandboxesGVR = schema.GroupVersionResource{Group: SandboxGroup, Version: "v1beta1", Resource: "sandboxes"}

// controllerRef is obj's owner reference with controller set.
func controllerRef(obj *unstructured.Unstructured) (metav1.OwnerReference, bool) {
	for _, r := range obj.GetOwnerReferences() {
		if r.Controller != nil && *r.Controller {
			return r, true
		}
	}
	return metav1.OwnerReference{}, false
}

// groupOf is the group of an apiVersion (GROUP/VERSION).
func groupOf(apiVersion string) string {
	g, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return g
}

// OwnerOf is the agent-sandbox Sandbox pod belongs to, and what holds it,
// when the API server proves it: the pod's controller is a Sandbox, the
// Sandbox of that name in the pod's namespace has that UID, and it names
// this pod as its own (its pod-name annotation, or its own name). nil
// without a Sandbox controller; an error when the proof fails. Pure.
func OwnerOf(pod *unstructured.Unstructured, sandboxByKey func(key string) *unstructured.Unstructured) (*control.Owner, error) {
	ref, ok := controllerRef(pod)
	if !ok || ref.Kind != "Sandbox" || groupOf(ref.APIVersion) != SandboxGroup {
		return nil, nil
	}
	ns := pod.GetNamespace()
	sb := sandboxByKey(ns + "/" + ref.Name)
	switch {
	case sb == nil:
		return nil, fmt.Errorf("pod %s/%s names Sandbox %s as its controller, and there is none", ns, pod.GetName(), ref.Name)
	case string(sb.GetUID()) != string(ref.UID):
		return nil, fmt.Errorf("pod %s/%s names Sandbox %s of UID %s, and that Sandbox's UID is %s", ns, pod.GetName(), ref.Name, ref.UID, sb.GetUID())
	}
	podName := sb.GetName()
	if n := sb.GetAnnotations()[SandboxPodNameAnnotation]; n != "" {
		podName = n
	}
	if podName != pod.GetName() {
		return nil, fmt.Errorf("pod %s/%s names Sandbox %s, whose pod is %s", ns, pod.GetName(), sb.GetName(), podName)
	}
	o := &control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: ns, Name: sb.GetName(), UID: string(sb.GetUID())}, Ready: podReady(pod)}
	if h, ok := controllerRef(sb); ok && groupOf(h.APIVersion) == SandboxExtensionsGroup && (h.Kind == "SandboxClaim" || h.Kind == "SandboxWarmPool") {
		o.Holder = &control.ObjectRef{Kind: h.Kind, Namespace: ns, Name: h.Name, UID: string(h.UID)}
	}
	// A fork's copy, when its source (of this namespace) answered its
	// fork naming it: its pod may restore the source's image.
	if img := sb.GetAnnotations()[broker.ForkOfAnnotation]; img != "" {
		from, same := strings.CutPrefix(sb.GetAnnotations()[broker.ForkedFromAnnotation], ns+"/")
		if src := sandboxByKey(ns + "/" + from); same && src != nil &&
			broker.ProvenCopy(img, string(src.GetUID()), src.GetAnnotations()[broker.ForkedAnnotation], sb.GetName(), string(sb.GetUID())) {
			o.ForkOf = img
		}
	}
	return o, nil
}

// podReady says whether pod's Ready condition is True.
func podReady(pod *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(pod.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			return m["status"] == "True"
		}
	}
	return false
}

// sameOwner says whether a and b name the same objects.
func sameOwner(a, b *control.Owner) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Same(b)
}

// sandboxCRDPoll is how often the node agent looks for agent-sandbox's
// Sandboxes until the cluster serves them (one LIST of at most one).
const sandboxCRDPoll = 10 * time.Second

// watchSandboxes starts watching agent-sandbox's Sandboxes once the
// cluster serves them (its CRDs may come after the node agent), checking
// every sandboxCRDPoll until then.
func (a *Agent) watchSandboxes(ctx context.Context, kick chan struct{}) {
	logged := false
	for {
		_, err := a.Client.Resource(SandboxesGVR).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			break
		}
		if !logged {
			what := "cannot be listed"
			if apierrors.IsNotFound(err) {
				what = "are not served (agent-sandbox is not installed)"
			}
			a.Log.WithError(err).Infof("agent-sandbox Sandboxes %s: pods are not linked to Sandboxes until they are", what)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(sandboxCRDPoll):
		}
	}
	f := dynamicinformer.NewDynamicSharedInformerFactory(a.Client, 10*time.Minute)
	inf := f.ForResource(SandboxesGVR).Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { pokeChan(kick) },
		UpdateFunc: func(any, any) { pokeChan(kick) },
		DeleteFunc: func(any) { pokeChan(kick) },
	}); err != nil {
		a.Log.WithError(err).Warn("watching agent-sandbox Sandboxes")
		return
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	a.sandboxInf.Store(&inf)
	a.Log.Info("agent-sandbox Sandboxes listed: this node's pods are linked to theirs")
	pokeChan(kick)
}

// sandboxByKey reads a Sandbox (NAMESPACE/NAME) from the informer's cache.
func (a *Agent) sandboxByKey(key string) *unstructured.Unstructured {
	inf := a.sandboxInf.Load()
	if inf == nil {
		return nil
	}
	item, ok, err := (*inf).GetStore().GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	u, _ := item.(*unstructured.Unstructured)
	return u
}

// linkOwners tells each listed sandbox's shim what its pod belongs to,
// when that changed.
func (a *Agent) linkOwners(ctx context.Context, listed []control.Listed) {
	if a.sandboxInf.Load() == nil || a.podInf == nil {
		return
	}
	live := map[string]bool{}
	for _, l := range listed {
		if l.Sandbox != nil {
			live[l.Sandbox.ID] = true
		}
	}
	for id := range a.ownerErrs {
		if !live[id] {
			delete(a.ownerErrs, id)
		}
	}
	for id := range a.suspends {
		if !live[id] {
			delete(a.suspends, id)
		}
	}
	for id := range a.forks {
		if !live[id] {
			delete(a.forks, id)
		}
	}
	a.gcCheckpoints()
	for _, l := range listed {
		sb := l.Sandbox
		if sb == nil || sb.Pod == "" {
			continue
		}
		item, ok, err := a.podInf.GetStore().GetByKey(sb.Pod)
		if err != nil || !ok {
			continue
		}
		pod, _ := item.(*unstructured.Unstructured)
		if pod == nil || (sb.PodUID != "" && string(pod.GetUID()) != sb.PodUID) {
			continue // another pod of that name: the sandbox's is gone
		}
		o, err := OwnerOf(pod, a.sandboxByKey)
		if err != nil {
			if a.ownerErrs[sb.ID] != err.Error() {
				a.ownerErrs[sb.ID] = err.Error()
				a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("not linking a pod to a Sandbox")
			}
			continue
		}
		if o == nil {
			continue
		}
		t0 := time.Now()
		if !a.bindClaim(ctx, o, sb.Owner, broker.Ref{Namespace: pod.GetNamespace(), Name: pod.GetName(), UID: string(pod.GetUID())}) {
			continue // the broker did not answer: the next round asks again
		}
		if !sameOwner(o, sb.Owner) {
			t1 := time.Now()
			resp, err := control.Call(l.Socket, control.Request{Op: control.OpOwner, Owner: o}, controlTimeout)
			if err != nil {
				a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("linking a pod to its Sandbox")
				continue
			}
			a.Log.WithFields(logrus.Fields{"sandbox": sb.ID, "claim_ms": t1.Sub(t0).Milliseconds(), "shim_ms": time.Since(t1).Milliseconds()}).Info(resp.Message)
			if now := resp.Sandbox; now != nil && now.Owner != nil {
				if o.Claim != nil && now.Owner.ClaimRefused != "" && now.Owner.SameHolder(o) {
					// The shim refused what the broker gave (its role, its keys).
					a.claimNotBound(ctx, o.Holder, now.Owner.ClaimRefused)
				}
				o = now.Owner
			}
			sb.Owner = o
		}
		sbObj := a.sandboxByKey(o.Sandbox.Namespace + "/" + o.Sandbox.Name)
		a.suspendAndResume(ctx, l, o, sbObj)
		a.forkAndCopies(ctx, l, o, sbObj)
	}
}

// operatingMode is a Sandbox's spec.operatingMode ("Running" when unset).
func operatingMode(sb *unstructured.Unstructured) string {
	if sb == nil {
		return ""
	}
	m, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode")
	if m == "" {
		return "Running"
	}
	return m
}

// restoreAnnotation is the pod annotation that names the checkpoint a pod
// is restored from (policy.RestoreAnnotation).
const restoreAnnotation = "agentbox.dev/restore-from"

// SuspendName is the checkpoint a suspend of Sandbox uid writes at t:
// "sb-UID-UNIXSECONDS" (a node's store keeps one name once).
func SuspendName(uid string, t time.Time) string {
	return fmt.Sprintf("sb-%s-%d", strings.ToLower(uid), t.Unix())
}

// suspendWait bounds the node agent's suspend request (gVisor writes the
// agent's memory meanwhile).
const suspendWait = 2 * time.Minute

// resumed says whether sb, running, is the resume of Sandbox uid from the
// checkpoint its template names (annotated): restored from it, and it is
// that Sandbox's own suspend image. A Sandbox restored from another's
// checkpoint (a fork's copy) is not a resume: that image stays for the
// other copies (and the broker would refuse the write).
func resumed(annotated string, sb *control.Sandbox, uid string) bool {
	return annotated != "" && sb.RestoredFrom == annotated && sb.State == "running" && broker.CheckpointOf(annotated, uid)
}

// suspendAndResume acts for the Sandboxes whose roles keep memory on
// suspend. A sandbox whose Sandbox is set to Suspended is checkpointed
// (its pod is about to be deleted: the shim holds the stop for the
// checkpoint), and the Sandbox's pod template then names the checkpoint,
// so that its next pod resumes from it. A pod restored from it is told
// apart by the shim only once this agent proved it is the Sandbox's; the
// annotation is then taken off the template and the image removed.
func (a *Agent) suspendAndResume(ctx context.Context, l control.Listed, o *control.Owner, sbObj *unstructured.Unstructured) {
	sb := l.Sandbox
	if sb.Suspend != "memory" || sbObj == nil {
		return
	}
	key := o.Sandbox.Namespace + "/" + o.Sandbox.Name
	annotated, _, _ := unstructured.NestedString(sbObj.Object, "spec", "podTemplate", "metadata", "annotations", restoreAnnotation)
	switch {
	case operatingMode(sbObj) == "Suspended" && (sb.State == "running" || sb.State == "frozen") && a.suspends[sb.ID] == "":
		name := SuspendName(o.Sandbox.UID, time.Now())
		a.suspends[sb.ID] = name
		// The broker's ticket first, while the pod is surely bound here:
		// once the suspend is done, it may be gone from the API already.
		w := broker.SandboxWrite{Op: broker.OpSuspending, Sandbox: brokerRef(o.Sandbox), Checkpoint: name}
		ticket, err := a.writeSandbox(ctx, w)
		if err != nil {
			a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("the broker's ticket for a suspend")
			a.recordRefusal(w, err)
			a.event(ctx, sbObj, "Warning", "SuspendFailed", fmt.Sprintf("agentbox did not save the agent's memory on node %s: the broker would not let it name a checkpoint on the Sandbox (%v); the pod is deleted without it", a.NodeName, err))
			return
		}
		reason := fmt.Sprintf("agent-sandbox: Sandbox %s (uid %s) was set to operatingMode Suspended", key, o.Sandbox.UID)
		resp, err := control.Call(l.Socket, control.Request{Op: control.OpSuspend, Name: name, Reason: reason}, suspendWait)
		if err != nil {
			a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("suspending for agent-sandbox")
			a.event(ctx, sbObj, "Warning", "SuspendFailed", fmt.Sprintf("agentbox could not save the agent's memory on node %s: %v; the pod is deleted without it", a.NodeName, err))
			return
		}
		cp := resp.Checkpoint
		// The image stays on this node without a shared store: so does the
		// Sandbox's next pod (the broker pins it to this node's hostname,
		// unless the template selects a host already).
		w = broker.SandboxWrite{Op: broker.OpSuspended, Sandbox: brokerRef(o.Sandbox), Checkpoint: name, Pin: a.SharedDir == "", Ticket: ticket.Ticket}
		written, err := a.writeSandbox(ctx, w)
		if err != nil {
			a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("naming the checkpoint in the Sandbox's pod template")
			a.recordRefusal(w, err)
			a.event(ctx, sbObj, "Warning", "SuspendFailed", fmt.Sprintf("agentbox saved the agent's memory into checkpoint %s on node %s, and could not name it in the Sandbox's pod template: %v", name, a.NodeName, err))
			return
		}
		pinned := written.Pinned
		a.Log.WithField("sandbox", sb.ID).Infof("Sandbox %s suspended into checkpoint %s", key, name)
		where := "the Sandbox's next pod resumes from it"
		switch {
		case pinned != "":
			where = "the Sandbox's next pod resumes from it on this node (" + broker.HostnameLabel + "=" + pinned + ": there is no shared store)"
		case a.SharedDir != "":
			where = "the Sandbox's next pod resumes from it on any node (the shared store)"
		}
		a.event(ctx, sbObj, "Normal", "Suspended", fmt.Sprintf("agentbox saved the agent's memory into checkpoint %s on node %s (%d bytes in %d ms); %s", name, a.NodeName, cp.Bytes, cp.Millis, where))
	case resumed(annotated, sb, o.Sandbox.UID):
		// Resumed: the template's next pods boot afresh, and the image
		// (memory, and so secrets) goes. The broker takes the annotation off,
		// and the pin it made.
		w := broker.SandboxWrite{Op: broker.OpResumed, Sandbox: brokerRef(o.Sandbox), Checkpoint: annotated}
		if _, err := a.writeSandbox(ctx, w); err != nil {
			a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("taking the checkpoint off the Sandbox's pod template")
			a.recordRefusal(w, err)
			return
		}
		removed := "it stays in the node's store"
		if a.CheckpointDir != "" {
			if err := (&checkpoint.Store{Dir: a.CheckpointDir}).Remove(annotated); err == nil {
				removed = "it is removed from the node's store"
			}
		}
		if a.SharedDir != "" && checkpoint.RemoveShared(a.SharedDir, annotated) == nil {
			removed += " and from the shared store"
		}
		a.event(ctx, sbObj, "Normal", "Resumed", fmt.Sprintf("agentbox resumed the agent from checkpoint %s on node %s; %s", annotated, a.NodeName, removed))
		if a.Trail != nil {
			a.Trail.Emit(audit.TypeCheckpointed.New("Success", fmt.Sprintf("Sandbox %s resumed from checkpoint %s in sandbox %s; %s", key, annotated, sb.ID, removed),
				map[string]string{"checkpoint": annotated, "sandbox_object": key, "sandbox_uid": o.Sandbox.UID, "node": a.NodeName}), true)
		}
	}
}

// brokerRef is a Sandbox as the broker names it.
func brokerRef(r control.ObjectRef) broker.Ref {
	return broker.Ref{Namespace: r.Namespace, Name: r.Name, UID: r.UID}
}

// writeSandbox asks the broker to write a checkpoint on a Sandbox: the node
// agent has no write on Sandboxes of its own (docs/security.md).
func (a *Agent) writeSandbox(ctx context.Context, w broker.SandboxWrite) (*broker.SandboxResponse, error) {
	if a.Broker == nil {
		return nil, errNoBroker
	}
	return a.Broker.WriteSandbox(ctx, w)
}

// recordRefusal writes a refused Sandbox write into the node's trail,
// once for each reason (the loop asks again every second).
func (a *Agent) recordRefusal(w broker.SandboxWrite, err error) {
	k := w.Sandbox.UID + " " + w.Op + " " + w.Checkpoint
	if a.Trail == nil || a.writeErrs[k] == err.Error() {
		return
	}
	if a.writeErrs == nil || len(a.writeErrs) >= 1024 {
		a.writeErrs = map[string]string{} // bounded: at worst, one is recorded again
	}
	a.writeErrs[k] = err.Error()
	a.Trail.Emit(audit.TypeCheckpointed.New("Failure", fmt.Sprintf("Sandbox %s: the broker did not write %s %s for this node: %v", w.Sandbox, w.Op, w.Checkpoint, err),
		map[string]string{"checkpoint": w.Checkpoint, "sandbox_object": w.Sandbox.String(), "sandbox_uid": w.Sandbox.UID, "node": a.NodeName, "op": w.Op}), true)
}

// event writes a Kubernetes Event on a Sandbox, as kubectl describe shows.
func (a *Agent) event(ctx context.Context, obj *unstructured.Unstructured, kind, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata": map[string]any{"generateName": obj.GetName() + ".agentbox-", "namespace": obj.GetNamespace()},
		"involvedObject": map[string]any{"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(), "name": obj.GetName(),
			"namespace": obj.GetNamespace(), "uid": string(obj.GetUID())},
		"reason": reason, "message": msg, "type": kind,
		"source":         map[string]any{"component": "agentbox-sync", "host": a.NodeName},
		"firstTimestamp": now.UTC().Format(time.RFC3339), "lastTimestamp": now.UTC().Format(time.RFC3339), "count": int64(1),
	}}
	if _, err := a.Client.Resource(EventsGVR).Namespace(obj.GetNamespace()).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		a.Log.WithError(err).WithField("reason", reason).Warn("writing an event on " + obj.GetKind() + " " + obj.GetName())
	}
}

// EventsGVR is the core Event resource.
var EventsGVR = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// suspendUID is the Sandbox UID a suspend's checkpoint name holds
// (SuspendName), if it is one.
func suspendUID(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "sb-")
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 || strings.Trim(rest[i+1:], "0123456789") != "" || rest[i+1:] == "" {
		return "", false
	}
	return rest[:i], true
}
