package policysync

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
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

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/kubeapi"
	"agentbox.dev/agentbox/internal/policy"
)

// Resources of agentbox's API.
var (
	RolesGVR    = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.RolesResource}
	BindingsGVR = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.BindingsResource}
	NodesGVR    = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.NodesResource}
)

// Agent keeps one node's policy snapshot in step with the cluster's
// objects, and reports on it.
type Agent struct {
	Client    dynamic.Interface
	NodeName  string
	PolicyDir string
	// Trail is the node-level audit trail: every snapshot change, and every
	// newest set refused.
	Trail *audit.Trail
	Log   *logrus.Entry
	// Resync re-validates even when nothing changed (the node admin's
	// files may have).
	Resync time.Duration

	// ControlDir, when set, holds this node's sandbox control sockets:
	// the agent applies the AgentQuarantine objects to them.
	ControlDir string

	// SecretsDir, when set, is where the agent keeps the keys the broker
	// gives this node (secretRef), asked every SecretsEvery and whenever a
	// pod is bound here.
	SecretsDir   string
	SecretsEvery time.Duration
	// Broker is the cluster's broker (nil: none: no secretRef key is kept,
	// and no Sandbox is written).
	Broker *broker.Client
	// PublicKeyFile is where the broker's public key is kept for the shim
	// (checkpoint.shared_public_key; "": not kept).
	PublicKeyFile string
	// KeysDir is where the data keys the broker unwraps for this node's
	// restores are placed (checkpoint.keys_dir).
	KeysDir string
	// secretState is each key's last outcome ("ok" or the error);
	// keysState the broker's last failure, keysErrors its last errors on
	// keys it could not read; pubState the public key's last outcome (the
	// secrets loop's alone).
	secretState                     map[policy.SecretRef]string
	keysState, keysErrors, pubState string
	// dataKeys are the images whose data key was asked for, with the last
	// outcome; writeErrs the last refusal of each Sandbox write (the
	// quarantine loop's alone).
	dataKeys     map[string]string
	dataKeyAsked map[string]time.Time
	writeErrs    map[string]string
	podsKick     chan struct{}

	roles, bindings, nodes cache.SharedIndexInformer
	quarantineInf, podInf  cache.SharedIndexInformer
	// sandboxInf watches agent-sandbox's Sandboxes once the cluster
	// serves them; ownerErrs is the last proof that failed, by sandbox
	// (logged once each; the quarantine loop's alone).
	sandboxInf atomic.Pointer[cache.SharedIndexInformer]
	ownerErrs  map[string]string
	// suspends are the checkpoints asked of sandboxes whose Sandbox was
	// set to Suspended, by sandbox (the quarantine loop's alone).
	suspends map[string]string
	// forks are the fork requests (ForkAnnotation's value) taken up, by
	// sandbox, until the Sandbox asks for none (the quarantine loop's
	// alone). fork.go.
	forks map[string]string
	// CheckpointDir is the node's checkpoint store (where a resumed
	// Sandbox's image is removed; "" keeps them).
	CheckpointDir string
	// SharedDir is the cluster's shared checkpoint store ("": none).
	SharedDir   string
	lastGC      time.Time
	kick        chan struct{}
	lastRefused string
}

// Run watches until ctx ends. Until the informers have listed the objects
// once, and whenever the API server cannot be reached, the node keeps the
// snapshot it has: the agent never writes a set it has not seen whole.
func (a *Agent) Run(ctx context.Context) error {
	if a.Resync == 0 {
		a.Resync = time.Minute
	}
	a.kick = make(chan struct{}, 1)
	a.podsKick = make(chan struct{}, 1)
	factory := dynamicinformer.NewDynamicSharedInformerFactory(a.Client, 10*time.Minute)
	a.roles = factory.ForResource(RolesGVR).Informer()
	a.bindings = factory.ForResource(BindingsGVR).Informer()
	a.nodes = factory.ForResource(NodesGVR).Informer()
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke() },
		UpdateFunc: func(any, any) { a.poke() },
		DeleteFunc: func(any) { a.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{a.roles, a.bindings, a.nodes} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
	}
	if a.ControlDir != "" {
		if err := a.startQuarantines(ctx, factory); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	a.Log.Info("waiting for the policy objects (the node keeps its snapshot meanwhile)")
	if !cache.WaitForCacheSync(ctx.Done(), a.roles.HasSynced, a.bindings.HasSynced, a.nodes.HasSynced) {
		return ctx.Err()
	}
	a.Log.Info("policy objects listed; syncing")
	tick := time.NewTicker(a.Resync)
	defer tick.Stop()
	if a.SecretsEvery <= 0 {
		a.SecretsEvery = 10 * time.Second
	}
	secretsTick := time.NewTicker(a.SecretsEvery)
	defer secretsTick.Stop()
	policyToo := true
	for {
		if policyToo {
			if err := a.Sync(ctx); err != nil {
				a.Log.WithError(err).Warn("sync")
			}
		}
		if err := a.SyncSecrets(ctx); err != nil {
			a.Log.WithError(err).Warn("secrets")
		}
		policyToo = true
		select {
		case <-ctx.Done():
			return nil
		case <-secretsTick.C:
			policyToo = false
		case <-a.podsKick:
			// A pod bound here may need its keys now.
			policyToo = false
		case <-a.kick:
			// Let a burst of events (kubectl apply -f dir) settle.
			time.Sleep(200 * time.Millisecond)
			select {
			case <-a.kick:
			default:
			}
		case <-tick.C:
		}
	}
}

// startQuarantines watches the AgentQuarantine objects and this node's
// pods, and once both are listed applies them in a loop of their own (a
// cluster without the AgentQuarantine CRD still syncs its policies).
func (a *Agent) startQuarantines(ctx context.Context, factory dynamicinformer.DynamicSharedInformerFactory) error {
	a.quarantineInf = factory.ForResource(QuarantinesGVR).Informer()
	pods := dynamicinformer.NewFilteredDynamicSharedInformerFactory(a.Client, 10*time.Minute, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + a.NodeName
	})
	a.podInf = pods.ForResource(PodsGVR).Informer()
	kick := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { pokeChan(kick) },
		UpdateFunc: func(any, any) { pokeChan(kick) },
		DeleteFunc: func(any) { pokeChan(kick) },
	}
	if _, err := a.quarantineInf.AddEventHandler(poke); err != nil {
		return err
	}
	if _, err := a.podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { pokeChan(kick); pokeChan(a.podsKick) },
		UpdateFunc: func(any, any) { pokeChan(kick) },
		DeleteFunc: func(any) { pokeChan(kick); pokeChan(a.podsKick) },
	}); err != nil {
		return err
	}
	pods.Start(ctx.Done())
	a.ownerErrs = map[string]string{}
	a.suspends = map[string]string{}
	a.forks = map[string]string{}
	go a.watchSandboxes(ctx, kick)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), a.quarantineInf.HasSynced, a.podInf.HasSynced) {
			return
		}
		a.Log.WithField("control_dir", a.ControlDir).Info("AgentQuarantine objects listed; applying them to this node's sandboxes")
		a.runQuarantines(ctx, kick)
	}()
	return nil
}

func pokeChan(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (a *Agent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// objects reads the roles and bindings from the informers' caches.
func (a *Agent) objects() ([]Object, error) {
	var objs []Object
	for _, src := range []struct {
		kind string
		inf  cache.SharedIndexInformer
	}{{kubeapi.KindRole, a.roles}, {kubeapi.KindRoleBinding, a.bindings}} {
		for _, item := range src.inf.GetStore().List() {
			u, ok := item.(*unstructured.Unstructured)
			if !ok {
				return nil, fmt.Errorf("unexpected %T in the %s cache", item, src.kind)
			}
			spec, err := json.Marshal(u.Object["spec"])
			if err != nil {
				return nil, err
			}
			objs = append(objs, Object{Kind: src.kind, Name: u.GetName(), Generation: u.GetGeneration(), Spec: spec})
		}
	}
	return objs, nil
}

// Sync renders the cached objects, applies them on the node if they load,
// records the change, and reports.
func (a *Agent) Sync(ctx context.Context) error {
	objs, err := a.objects()
	if err != nil {
		return err
	}
	snap := Render(objs)
	out, err := Apply(a.PolicyDir, snap)
	if err != nil {
		return err
	}
	refused := !out.Applied && !out.Unchanged
	switch {
	case out.Applied:
		a.lastRefused = ""
		a.Log.WithFields(logrus.Fields{"old": out.OldDigest, "new": out.NewDigest, "changes": strings.Join(out.Changes, "; ")}).Info("policy snapshot applied")
		if a.Trail != nil {
			a.Trail.Emit(audit.TypePolicySnapshot.New("Success", "policy snapshot applied",
				map[string]string{"old_digest": out.OldDigest, "new_digest": out.NewDigest, "changes": strings.Join(out.Changes, "; "), "node": a.NodeName}), true)
		}
	case refused && a.lastRefused != snap.Digest:
		a.lastRefused = snap.Digest
		problems := out.problemLines()
		a.Log.WithField("problems", strings.Join(problems, "; ")).Warn("the newest policy set does not load; keeping the last good snapshot")
		if a.Trail != nil {
			a.Trail.Emit(audit.TypePolicyRefused.New("Failure", "the newest policy set does not load; the node keeps its snapshot",
				map[string]string{"kept_digest": out.OldDigest, "refused_digest": out.NewDigest, "problems": strings.Join(problems, "\n"), "changes": strings.Join(out.Changes, "; "), "node": a.NodeName}), true)
		}
	}
	gens := make(map[string]int64, len(objs))
	for _, o := range objs {
		gens[o.Key()] = o.Generation
	}
	if err := a.reportNode(ctx, out, snap, gens); err != nil {
		a.Log.WithError(err).Warn("report the node's snapshot")
	}
	return nil
}

// reportNode writes the node's AgentNodePolicy (creating it the first
// time).
func (a *Agent) reportNode(ctx context.Context, out Outcome, snap *Snapshot, gens map[string]int64) error {
	client := a.Client.Resource(NodesGVR)
	var cur *unstructured.Unstructured
	if item, ok, _ := a.nodes.GetStore().GetByKey(a.NodeName); ok {
		cur = item.(*unstructured.Unstructured).DeepCopy()
	} else {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(kubeapi.Group + "/" + kubeapi.Version)
		u.SetKind(kubeapi.KindNodePolicy)
		u.SetName(a.NodeName)
		created, err := client.Create(ctx, u, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			created, err = client.Get(ctx, a.NodeName, metav1.GetOptions{})
		}
		if err != nil {
			return err
		}
		cur = created
	}
	var node kubeapi.AgentNodePolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cur.Object, &node); err != nil {
		return err
	}
	st := NodeStatus(node.Status, out, snap, gens, metav1.Now())
	if sameNode(node.Status, st) {
		return nil
	}
	if err := setStatus(cur, st); err != nil {
		return err
	}
	_, err := client.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return err
}

func sameNode(a, b kubeapi.NodeStatus) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func setStatus(u *unstructured.Unstructured, status any) error {
	b, err := json.Marshal(status)
	if err != nil {
		return err
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	u.Object["status"] = m
	return nil
}
