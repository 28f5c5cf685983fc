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

	"agentbox.dev/agentbox/internal/control"
)

// agent-sandbox's API: its Sandbox, and what holds one.
const (
	SandboxGroup           = "agents.x-k8s.io"
	SandboxExtensionsGroup = "extensions.agents.x-k8s.io"
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
	o := &control.Owner{Sandbox: control.ObjectRef{Kind: "Sandbox", Namespace: ns, Name: sb.GetName(), UID: string(sb.GetUID())}}
	if h, ok := controllerRef(sb); ok && groupOf(h.APIVersion) == SandboxExtensionsGroup && (h.Kind == "SandboxClaim" || h.Kind == "SandboxWarmPool") {
		o.Holder = &control.ObjectRef{Kind: h.Kind, Namespace: ns, Name: h.Name, UID: string(h.UID)}
	}
	return o, nil
}

// sameOwner says whether a and b name the same objects.
func sameOwner(a, b *control.Owner) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Sandbox != b.Sandbox || (a.Holder == nil) != (b.Holder == nil) {
		return false
	}
	return a.Holder == nil || *a.Holder == *b.Holder
}

// watchSandboxes starts watching agent-sandbox's Sandboxes once the
// cluster serves them (its CRDs may come after the node agent), checking
// every minute until then.
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
		case <-time.After(time.Minute):
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
func (a *Agent) linkOwners(listed []control.Listed) {
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
		if o == nil || sameOwner(o, sb.Owner) {
			continue
		}
		resp, err := control.Call(l.Socket, control.Request{Op: control.OpOwner, Owner: o}, controlTimeout)
		if err != nil {
			a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("linking a pod to its Sandbox")
			continue
		}
		a.Log.WithField("sandbox", sb.ID).Info(resp.Message)
	}
}
