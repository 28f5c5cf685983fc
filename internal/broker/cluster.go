package broker

// What the broker reads and writes in the API server, with its own
// credentials (examples/kubernetes/broker.yaml): pods, RuntimeClasses,
// Nodes, the policy objects, the Secrets roles name, agent-sandbox's
// Sandboxes (and a merge patch on them), and TokenReviews.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"agentbox.dev/agentbox/internal/kubeapi"
	"agentbox.dev/agentbox/internal/policy"
)

// Resources the broker reads.
var (
	podsGVR           = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	nodesGVR          = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	secretsGVR        = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	runtimeClassesGVR = schema.GroupVersionResource{Group: "node.k8s.io", Version: "v1", Resource: "runtimeclasses"}
	tokenReviewsGVR   = schema.GroupVersionResource{Group: "authentication.k8s.io", Version: "v1", Resource: "tokenreviews"}
	sandboxesGVR      = schema.GroupVersionResource{Group: SandboxGroup, Version: "v1beta1", Resource: "sandboxes"}
	claimsGVR         = schema.GroupVersionResource{Group: SandboxExtensionsGroup, Version: "v1beta1", Resource: "sandboxclaims"}
	rolesGVR          = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.RolesResource}
	bindingsGVR       = schema.GroupVersionResource{Group: kubeapi.Group, Version: kubeapi.Version, Resource: kubeapi.BindingsResource}
)

// NodeNameExtra is the user-info key under which the API server names the
// node a bound service-account token's pod is on.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// podNameExtra names that pod.
const podNameExtra = "authentication.kubernetes.io/pod-name"

// Cluster is the broker's view of the API server.
type Cluster struct {
	Client dynamic.Interface
}

// apiTimeout bounds each call to the API server.
const apiTimeout = 10 * time.Second

// Caller is who presented a token.
type Caller struct {
	User string
	Node string
	Pod  string
}

// Review asks the API server who token is, for audience. A token that is
// not valid, not for audience, or not bound to a pod on a node, is refused.
func (c *Cluster) Review(ctx context.Context, token, audience string) (Caller, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	tr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
		"spec": map[string]any{"token": token, "audiences": []any{audience}},
	}}
	out, err := c.Client.Resource(tokenReviewsGVR).Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return Caller{}, fmt.Errorf("TokenReview: %w", err)
	}
	ok, _, _ := unstructured.NestedBool(out.Object, "status", "authenticated")
	if !ok {
		msg, _, _ := unstructured.NestedString(out.Object, "status", "error")
		return Caller{}, fmt.Errorf("the token is not valid for audience %q: %s", audience, msg)
	}
	user, _, _ := unstructured.NestedString(out.Object, "status", "user", "username")
	extra, _, _ := unstructured.NestedMap(out.Object, "status", "user", "extra")
	one := func(k string) string {
		v, _ := extra[k].([]any)
		if len(v) != 1 {
			return ""
		}
		s, _ := v[0].(string)
		return s
	}
	return Caller{User: user, Node: one(NodeNameExtra), Pod: one(podNameExtra)}, nil
}

// podOf reads what the broker needs of a pod object.
func podOf(u *unstructured.Unstructured) Pod {
	p := Pod{Ref: Ref{Namespace: u.GetNamespace(), Name: u.GetName(), UID: string(u.GetUID())}}
	p.Node, _, _ = unstructured.NestedString(u.Object, "spec", "nodeName")
	p.Role = u.GetAnnotations()[policy.RoleAnnotation]
	p.RestoreFrom = u.GetAnnotations()[policy.RestoreAnnotation]
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	p.Done = phase == "Succeeded" || phase == "Failed"
	p.Deleting = u.GetDeletionTimestamp() != nil
	p.ControllerKind, p.ControllerGroup, p.ControllerName, p.ControllerUID = controllerOf(u)
	return p
}

// controllerOf is an object's controlling owner: kind, group, name, UID.
func controllerOf(u *unstructured.Unstructured) (kind, group, name, uid string) {
	for _, r := range u.GetOwnerReferences() {
		if r.Controller != nil && *r.Controller {
			return r.Kind, schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).Group, r.Name, string(r.UID)
		}
	}
	return "", "", "", ""
}

// handlers resolves each pod's RuntimeClass to its handler (a class that
// cannot be read leaves "": no binding by handler matches it).
func (c *Cluster) handlers(ctx context.Context, pods []Pod, classes map[string]string) {
	for i := range pods {
		name := pods[i].Handler
		pods[i].Handler = ""
		if name == "" {
			continue
		}
		h, ok := classes[name]
		if !ok {
			if rc, err := c.Client.Resource(runtimeClassesGVR).Get(ctx, name, metav1.GetOptions{}); err == nil {
				h, _, _ = unstructured.NestedString(rc.Object, "handler")
			}
			classes[name] = h
		}
		pods[i].Handler = h
	}
}

// PodsOn lists the pods bound to node, with their runtime handlers.
func (c *Cluster) PodsOn(ctx context.Context, node string) ([]Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	l, err := c.Client.Resource(podsGVR).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("listing node %s's pods: %w", node, err)
	}
	pods := make([]Pod, 0, len(l.Items))
	for i := range l.Items {
		p := podOf(&l.Items[i])
		p.Handler, _, _ = unstructured.NestedString(l.Items[i].Object, "spec", "runtimeClassName")
		pods = append(pods, p)
	}
	c.handlers(ctx, pods, map[string]string{})
	return pods, nil
}

// Pod reads one pod.
func (c *Cluster) Pod(ctx context.Context, ns, name string) (Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	u, err := c.Client.Resource(podsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Pod{}, err
	}
	return podOf(u), nil
}

// Roles reads the cluster's AgentRoles and AgentRoleBindings. One that
// does not decode is left out (it grants nothing) and named in the error.
// When they cannot be listed, Roles.Roles is nil: the caller must not
// answer as if the cluster had none (a node would drop its keys).
func (c *Cluster) Roles(ctx context.Context) (Roles, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	var errs []error
	roles, err := c.Client.Resource(rolesGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Roles{}, fmt.Errorf("listing AgentRoles: %w", err)
	}
	bindings, err := c.Client.Resource(bindingsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Roles{}, fmt.Errorf("listing AgentRoleBindings: %w", err)
	}
	rs := Roles{Roles: map[string]policy.RoleSpec{}}
	for _, u := range roles.Items {
		spec, _ := json.Marshal(u.Object["spec"])
		r, err := DecodeRole(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("AgentRole %s: %w", u.GetName(), err))
			continue
		}
		rs.Roles[u.GetName()] = r
	}
	for _, u := range bindings.Items {
		spec, _ := json.Marshal(u.Object["spec"])
		b, err := DecodeBinding(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("AgentRoleBinding %s: %w", u.GetName(), err))
			continue
		}
		rs.Bindings = append(rs.Bindings, b)
	}
	return rs, errors.Join(errs...)
}

// ErrNoValue is a Secret's key that is not there to give (no such Secret
// or key, or one the broker may not read), as against an API that did
// not answer now.
var ErrNoValue = errors.New("no value")

// maxSecret bounds a key's value (the shim reads at most 64 KiB).
const maxSecret = 64 << 10

// SecretValue reads one key of a Secret.
func (c *Cluster) SecretValue(ctx context.Context, r policy.SecretRef) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	u, err := c.Client.Resource(secretsGVR).Namespace(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("%w: the Secret %s: %v (may the broker get it?)", ErrNoValue, r, err)
	}
	if err != nil {
		return nil, fmt.Errorf("the Secret %s: %w (may the broker get it?)", r, err)
	}
	data, _, _ := unstructured.NestedStringMap(u.Object, "data")
	enc, ok := data[r.Key]
	if !ok {
		return nil, fmt.Errorf("%w: the Secret %s has no key %q", ErrNoValue, r, r.Key)
	}
	v, err := base64.StdEncoding.DecodeString(enc)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: the Secret %s: %v", ErrNoValue, r, err)
	case len(v) == 0:
		return nil, fmt.Errorf("%w: the Secret %s: key %q is empty", ErrNoValue, r, r.Key)
	case len(v) > maxSecret:
		return nil, fmt.Errorf("%w: the Secret %s: key %q holds %d bytes, more than %d", ErrNoValue, r, r.Key, len(v), maxSecret)
	}
	return v, nil
}

// Sandbox reads an agent-sandbox Sandbox.
func (c *Cluster) Sandbox(ctx context.Context, ns, name string) (Sandbox, error) {
	u, err := c.SandboxObject(ctx, ns, name)
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(u), nil
}

// sandboxOf is what the broker reads of a Sandbox object.
func sandboxOf(u *unstructured.Unstructured) Sandbox {
	sb := Sandbox{Ref: Ref{Namespace: u.GetNamespace(), Name: u.GetName(), UID: string(u.GetUID())}, PodName: u.GetName()}
	if n := u.GetAnnotations()["agents.x-k8s.io/pod-name"]; n != "" {
		sb.PodName = n
	}
	sb.PinnedTo = u.GetAnnotations()[PinnedAnnotation]
	sb.ForkOf = u.GetAnnotations()[ForkOfAnnotation]
	sb.RestoreFrom, _, _ = unstructured.NestedString(u.Object, "spec", "podTemplate", "metadata", "annotations", policy.RestoreAnnotation)
	sb.Selector, _, _ = unstructured.NestedString(u.Object, "spec", "podTemplate", "spec", "nodeSelector", HostnameLabel)
	sb.ControllerKind, sb.ControllerGroup, sb.ControllerName, sb.ControllerUID = controllerOf(u)
	return sb
}

// SandboxObject reads an agent-sandbox Sandbox whole.
func (c *Cluster) SandboxObject(ctx context.Context, ns, name string) (*unstructured.Unstructured, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	return c.Client.Resource(sandboxesGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
}

// CreateSandbox makes a fork's copy and says its UID; one already there
// that is a copy of the same fork image counts as made (a node asking
// again).
func (c *Cluster) CreateSandbox(ctx context.Context, obj *unstructured.Unstructured) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	r := c.Client.Resource(sandboxesGVR).Namespace(obj.GetNamespace())
	made, err := r.Create(ctx, obj, metav1.CreateOptions{FieldManager: "agentbox-broker"})
	if apierrors.IsAlreadyExists(err) {
		if got, gerr := r.Get(ctx, obj.GetName(), metav1.GetOptions{}); gerr == nil && got.GetAnnotations()[ForkOfAnnotation] == obj.GetAnnotations()[ForkOfAnnotation] {
			return string(got.GetUID()), nil
		}
	}
	if err != nil {
		return "", err
	}
	return string(made.GetUID()), nil
}

// Claim reads an agent-sandbox SandboxClaim.
func (c *Cluster) Claim(ctx context.Context, ns, name string) (Claim, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	u, err := c.Client.Resource(claimsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Claim{}, err
	}
	return Claim{Ref: Ref{Namespace: ns, Name: name, UID: string(u.GetUID())}, Annotations: u.GetAnnotations()}, nil
}

// PatchSandbox applies a merge patch the broker made, only if the Sandbox
// is still the one of uid.
func (c *Cluster) PatchSandbox(ctx context.Context, sb Sandbox, patch []byte) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	// A precondition on the UID: a Sandbox deleted and made again under
	// the same name meanwhile is not written.
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return err
	}
	md, _ := m["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	md["uid"] = sb.UID
	m["metadata"] = md
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = c.Client.Resource(sandboxesGVR).Namespace(sb.Namespace).Patch(ctx, sb.Name, types.MergePatchType, b, metav1.PatchOptions{FieldManager: "agentbox-broker"})
	return err
}

// Hostname is node's kubernetes.io/hostname label (its name without one).
func (c *Cluster) Hostname(ctx context.Context, node string) string {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if n, err := c.Client.Resource(nodesGVR).Get(ctx, node, metav1.GetOptions{}); err == nil {
		if h := n.GetLabels()[HostnameLabel]; h != "" {
			return h
		}
	}
	return node
}
