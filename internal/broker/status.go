package broker

// The status of the cluster's policy objects: the broker writes each
// AgentRole's and AgentRoleBinding's status from every node's
// AgentNodePolicy report (kubeapi.StatusOf). No node writes them: an
// aggregate no admission policy can check would let one node misreport
// what every node does.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"agentbox.dev/agentbox/internal/kubeapi"
)

var nodePoliciesGVR = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.NodesResource}

// StatusWriter keeps the policy objects' status.
type StatusWriter struct {
	Client dynamic.Interface
	Log    *logrus.Entry
}

// Run writes the objects' status whenever an object or a node's report
// changes, until ctx ends.
func (w *StatusWriter) Run(ctx context.Context) error {
	f := dynamicinformer.NewDynamicSharedInformerFactory(w.Client, 10*time.Minute)
	roles := f.ForResource(rolesGVR).Informer()
	bindings := f.ForResource(bindingsGVR).Informer()
	nodes := f.ForResource(nodePoliciesGVR).Informer()
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() }}
	for _, inf := range []cache.SharedIndexInformer{roles, bindings, nodes} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), roles.HasSynced, bindings.HasSynced, nodes.HasSynced) {
		return ctx.Err()
	}
	w.Log.Info("policy objects and node reports listed: writing their status")
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		var reports []kubeapi.AgentNodePolicy
		for _, item := range nodes.GetStore().List() {
			var n kubeapi.AgentNodePolicy
			if u, ok := item.(*unstructured.Unstructured); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &n) == nil {
				reports = append(reports, n)
			}
		}
		for _, src := range []struct {
			kind string
			gvr  schema.GroupVersionResource
			inf  cache.SharedIndexInformer
		}{{kubeapi.KindRole, rolesGVR, roles}, {kubeapi.KindRoleBinding, bindingsGVR, bindings}} {
			for _, item := range src.inf.GetStore().List() {
				if u, ok := item.(*unstructured.Unstructured); ok && w.write(ctx, src.gvr, src.kind, u.DeepCopy(), reports) {
					poke() // a newer version is on its way: write on top of it
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
			time.Sleep(200 * time.Millisecond) // let a burst of events settle
		case <-tick.C:
		}
	}
}

// write updates one object's status when it changed; it says whether the
// write lost a race to a newer version.
func (w *StatusWriter) write(ctx context.Context, gvr schema.GroupVersionResource, kind string, u *unstructured.Unstructured, reports []kubeapi.AgentNodePolicy) bool {
	var prev kubeapi.ObjectStatus
	if raw, ok := u.Object["status"].(map[string]any); ok {
		if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &prev) != nil {
			prev = kubeapi.ObjectStatus{}
		}
	}
	ref := kubeapi.ObjectRef{Kind: kind, Name: u.GetName(), Generation: u.GetGeneration()}
	st := kubeapi.StatusOf(prev, ref, reports, metav1.Now())
	if kubeapi.SameStatus(prev, st) {
		return false
	}
	b, err := json.Marshal(st)
	m := map[string]any{}
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		w.Log.WithError(err).Warn("status of " + kind + " " + u.GetName())
		return false
	}
	u.Object["status"] = m
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_, err = w.Client.Resource(gvr).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: "agentbox-broker"})
	switch {
	case apierrors.IsConflict(err):
		return true
	case err != nil && !apierrors.IsNotFound(err):
		w.Log.WithError(err).Warn("writing the status of " + kind + " " + u.GetName())
	}
	return false
}
