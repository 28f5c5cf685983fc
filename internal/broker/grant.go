// Package broker is agentbox's cluster-level component (`agentbox broker`):
// the one place that holds what no node may hold alone, and hands each node
// only what the pods bound to it need, as the Node authorizer does for
// kubelets. It reads the Secrets roles name (secretRef) and gives a node the
// keys of the roles of agentbox pods bound to it; it holds the key that
// wraps each shared checkpoint's data key, and unwraps one for a node only
// while a pod of that image's Sandbox is bound there; and it makes the only
// writes a node agent needs on agent-sandbox's Sandboxes (the checkpoint
// annotation and a pin to that same node), for a Sandbox whose pod runs on
// the asking node. A node proves who it is with its node agent's
// service-account token, bound to its pod: the API server's TokenReview
// names the node the pod is bound to.
//
// This file holds the decisions, pure and table-tested; cluster.go reads
// the API, server.go serves the nodes.
package broker

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
)

// Ref names an object.
type Ref struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

func (r Ref) String() string { return r.Namespace + "/" + r.Name }

// Pod is what the broker reads of a pod.
type Pod struct {
	Ref
	// Node is spec.nodeName: the node it is bound to ("" not yet).
	Node string
	// Role and RestoreFrom are its agentbox.dev/role and
	// agentbox.dev/restore-from annotations.
	Role, RestoreFrom string
	// Handler is its RuntimeClass's handler ("" without one).
	Handler string
	// Done: it succeeded or failed; Deleting: it has a deletion timestamp.
	Done, Deleting bool
	// Controller is its controlling owner (kind, name, UID), if any.
	ControllerKind, ControllerGroup, ControllerName, ControllerUID string
}

// Sandbox is what the broker reads of an agent-sandbox Sandbox.
type Sandbox struct {
	Ref
	// PodName is the pod the Sandbox names as its own (its pod-name
	// annotation, or its own name).
	PodName string
	// RestoreFrom is its pod template's agentbox.dev/restore-from.
	RestoreFrom string
	// PinnedTo is its agentbox.dev/pinned-to annotation; Selector its pod
	// template's kubernetes.io/hostname node selector.
	PinnedTo, Selector string
	// Controller is its controlling owner: the SandboxClaim or
	// SandboxWarmPool that holds it, if any.
	ControllerKind, ControllerGroup, ControllerName, ControllerUID string
	// ForkOf is its agentbox.dev/fork-of annotation: the fork image it is
	// a copy of (fork.go).
	ForkOf string
}

// SandboxGroup is agent-sandbox's API group.
const SandboxGroup = "agents.x-k8s.io"

// Roles are the cluster's AgentRole and AgentRoleBinding specs. A node's
// own policy files are that node's word: the broker grants nothing for them.
type Roles struct {
	Roles    map[string]policy.RoleSpec
	Bindings []policy.RoleBindingSpec
}

// DecodeRole and DecodeBinding read an object's spec strictly, as the node
// agent renders it: a field the policy types lack refuses the object.
func DecodeRole(spec []byte) (policy.RoleSpec, error) {
	var r policy.RoleSpec
	return r, strictJSON(spec, &r)
}

// DecodeBinding reads an AgentRoleBinding's spec.
func DecodeBinding(spec []byte) (policy.RoleBindingSpec, error) {
	var b policy.RoleBindingSpec
	return b, strictJSON(spec, &b)
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}

// SecretRefs are the Secrets' keys role injects: its own credentials'
// secrets or, when it names none, its nearest cluster ancestor's (lists
// replace, as inheritance does). A parent that is not a cluster role
// (a node's file) ends the walk: its secrets are never the cluster's.
func (rs Roles) SecretRefs(role string) []policy.SecretRef {
	var out []policy.SecretRef
	for _, s := range rs.secrets(role) {
		if s.SecretRef != nil && s.Inject != nil && s.FromClaim == "" {
			out = append(out, *s.SecretRef)
		}
	}
	return out
}

// ClaimKeys are the names of the keys role takes from a claim (its
// fromClaim secrets), found as SecretRefs are.
func (rs Roles) ClaimKeys(role string) map[string]bool {
	out := map[string]bool{}
	for _, s := range rs.secrets(role) {
		if s.FromClaim != "" && s.Inject != nil {
			out[s.FromClaim] = true
		}
	}
	return out
}

// secrets are role's credentials' secrets or its nearest cluster
// ancestor's.
func (rs Roles) secrets(role string) []policy.Secret {
	seen := map[string]bool{}
	for n := role; n != "" && !seen[n]; {
		seen[n] = true
		spec, ok := rs.Roles[n]
		if !ok {
			return nil
		}
		if c := spec.Credentials; c != nil && c.Secrets != nil {
			return c.Secrets
		}
		n = spec.Inherits
	}
	return nil
}

// criNamespace is the containerd namespace of every pod the kubelet makes.
const criNamespace = "k8s.io"

// Bound says whether a cluster binding lets pod claim role, as the shim's
// check does with what the CRI tells it.
func (rs Roles) Bound(role string, p Pod) bool {
	req := policy.Request{PodNamespace: p.Namespace, ContainerdNamespace: criNamespace, Handler: p.Handler}
	for _, b := range rs.Bindings {
		if b.Role != role {
			continue
		}
		for _, s := range b.Subjects {
			if s.Matches(req) {
				return true
			}
		}
	}
	return false
}

// Grant is one Secret key a node may hold, and the pods that need it.
type Grant struct {
	Ref  policy.SecretRef
	Pods []string
}

// KeysFor are the Secret keys node may hold now: those the cluster roles of
// the pods bound to it inject, for each pod that still runs and whose
// namespace (or runtime handler) a cluster binding binds to its role, and
// the keys each such pod's claim gives its task (claimed, by pod, as
// ClaimOf gave them).
func KeysFor(node string, pods []Pod, rs Roles, claimed map[string][]control.ClaimKey) []Grant {
	by := map[policy.SecretRef][]string{}
	for _, p := range pods {
		if node == "" || p.Node != node || p.Done || p.Role == "" || !rs.Bound(p.Role, p) {
			continue
		}
		for _, r := range rs.SecretRefs(p.Role) {
			by[r] = append(by[r], p.String())
		}
		for _, k := range claimed[p.String()] {
			by[k.Secret] = append(by[k.Secret], p.String())
		}
	}
	out := make([]Grant, 0, len(by))
	for r, ps := range by {
		sort.Strings(ps)
		out = append(out, Grant{Ref: r, Pods: ps})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref.String() < out[j].Ref.String() })
	return out
}

// suspendRE is the name a suspend of a Sandbox writes: sb-UID-UNIXSECONDS.
var suspendRE = regexp.MustCompile(`^sb-([0-9a-f-]{1,40})-([0-9]{1,19})$`)

// CheckpointOf says whether checkpoint is a suspend image of the Sandbox
// of uid.
func CheckpointOf(checkpoint, uid string) bool { return imageOf(suspendRE, checkpoint, uid) }

// imageOf says whether checkpoint is named by re (PREFIX-UID-TIME) for
// the Sandbox of uid.
func imageOf(re *regexp.Regexp, checkpoint, uid string) bool {
	m := re.FindStringSubmatch(checkpoint)
	return m != nil && m[1] == strings.ToLower(uid)
}

// sandboxPod says whether p is sb's own pod: its controller is the Sandbox
// of that UID, and the Sandbox names it.
func sandboxPod(p Pod, sb Sandbox) bool {
	return p.ControllerKind == "Sandbox" && p.ControllerGroup == SandboxGroup && p.ControllerUID == sb.UID &&
		p.ControllerName == sb.Name && p.Namespace == sb.Namespace && p.Name == sb.PodName
}

// MayUnwrap says whether node may have checkpoint's data key for pod: the
// pod is bound to node and runs, it asks to be restored from checkpoint,
// and it is the own pod of the Sandbox the image is of.
func MayUnwrap(node, checkpoint string, p Pod, sb *Sandbox) error {
	switch {
	case node == "" || p.Node != node:
		return fmt.Errorf("pod %s is bound to node %q, not %q", p, p.Node, node)
	case p.Done || p.Deleting:
		return fmt.Errorf("pod %s has ended or is being deleted", p)
	case p.RestoreFrom != checkpoint:
		return fmt.Errorf("pod %s asks to be restored from %q, not %q", p, p.RestoreFrom, checkpoint)
	case sb == nil:
		return fmt.Errorf("pod %s is not an agent-sandbox Sandbox's", p)
	case !sandboxPod(p, *sb):
		return fmt.Errorf("pod %s is not Sandbox %s's own pod (uid %s)", p, sb, sb.UID)
	case !CheckpointOf(checkpoint, sb.UID):
		return fmt.Errorf("checkpoint %q is not a suspend image of Sandbox %s (uid %s)", checkpoint, sb, sb.UID)
	}
	return nil
}

// Sandbox writes a node may ask for. OpSuspending writes nothing: it is
// asked before the suspend, while the Sandbox's pod is surely bound to the
// node, and answers a ticket that lets OpSuspended through once the
// suspend is done, when the pod may be gone already.
const (
	OpSuspending = "suspending"
	OpSuspended  = "suspended"
	OpResumed    = "resumed"
)

// SandboxWrite is a node's request to write its checkpoint on a Sandbox.
type SandboxWrite struct {
	Op         string `json:"op"`
	Sandbox    Ref    `json:"sandbox"`
	Checkpoint string `json:"checkpoint"`
	// Pin asks (with OpSuspended) that the Sandbox's next pod go to this
	// same node: its image is in no shared store.
	Pin bool `json:"pin,omitempty"`
	// Ticket is what OpSuspending answered, for OpSuspended.
	Ticket string `json:"ticket,omitempty"`
	// Copies is how many copies OpForked makes (fork.go).
	Copies int `json:"copies,omitempty"`
}

// TicketTTL bounds how long after OpSuspending its ticket holds (a suspend
// takes the node agent at most two minutes).
const TicketTTL = 5 * time.Minute

// Tickets issues and checks suspend tickets under a key of the broker's
// process alone (a broker restarted meanwhile refuses the ticket: the
// suspend then fails and says so).
type Tickets struct{ key []byte }

// NewTickets makes a ticket key.
func NewTickets() (*Tickets, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	return &Tickets{key: k}, nil
}

func (t *Tickets) mac(node string, w SandboxWrite, expiry int64) string {
	h := hmac.New(sha256.New, t.key)
	fmt.Fprintf(h, "agentbox suspend ticket v1\n%s\n%s\n%s\n%s\n%d", node, w.Sandbox, w.Sandbox.UID, w.Checkpoint, expiry)
	return hex.EncodeToString(h.Sum(nil))
}

// Issue is node's ticket for w's suspend, valid until now+TicketTTL.
func (t *Tickets) Issue(node string, w SandboxWrite, now time.Time) string {
	exp := now.Add(TicketTTL).Unix()
	return strconv.FormatInt(exp, 10) + "." + t.mac(node, w, exp)
}

// Valid says whether ticket is node's, for w's Sandbox and checkpoint, and
// not expired at now.
func (t *Tickets) Valid(node, ticket string, w SandboxWrite, now time.Time) bool {
	exp, mac, ok := strings.Cut(ticket, ".")
	e, err := strconv.ParseInt(exp, 10, 64)
	if t == nil || !ok || err != nil || now.Unix() > e {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(t.mac(node, w, e)))
}

// ownPodOn is the Sandbox's own pod bound to node, if one is among pods.
func ownPodOn(node string, sb Sandbox, pods []Pod) *Pod {
	for i, p := range pods {
		if p.Node == node && node != "" && sandboxPod(p, sb) {
			return &pods[i]
		}
	}
	return nil
}

// SandboxPatch decides a node's write and returns the merge patch the
// broker makes, nothing else: the checkpoint annotation of a Sandbox whose
// own pod is bound to node (or was, when it issued the suspend's ticket:
// ticketed), a pin to node's hostname, or their removal. OpSuspending
// answers no patch: its checks passed, and the broker issues a ticket.
func SandboxPatch(node, hostname string, w SandboxWrite, sb Sandbox, pods []Pod, ticketed bool) ([]byte, error) {
	if w.Sandbox.UID != sb.UID || w.Sandbox.Namespace != sb.Namespace || w.Sandbox.Name != sb.Name {
		return nil, fmt.Errorf("Sandbox %s has uid %s, not %s", sb, sb.UID, w.Sandbox.UID)
	}
	// A fork's copy resumes from its fork image as a Sandbox resumes
	// from its own suspend's.
	copyOf := w.Op == OpResumed && ForkImage(w.Checkpoint) && sb.ForkOf == w.Checkpoint
	if !CheckpointOf(w.Checkpoint, sb.UID) && !copyOf {
		return nil, fmt.Errorf("checkpoint %q is not a suspend image of Sandbox %s (uid %s)", w.Checkpoint, sb, sb.UID)
	}
	pod := ownPodOn(node, sb, pods)
	if pod == nil && !(ticketed && w.Op == OpSuspended) {
		return nil, fmt.Errorf("no pod of Sandbox %s is bound to node %q", sb, node)
	}
	if w.Op == OpSuspending {
		return nil, nil
	}
	ann := map[string]any{}
	tmplAnn := map[string]any{}
	sel := map[string]any{}
	switch w.Op {
	case OpSuspended:
		// The pod ran here: it may have ended (the suspend stops it) and
		// be on its way out; it is proof while the API server holds it.
		tmplAnn[policy.RestoreAnnotation] = w.Checkpoint
		if w.Pin && sb.Selector == "" {
			if hostname == "" {
				return nil, fmt.Errorf("node %q has no hostname to pin Sandbox %s to", node, sb)
			}
			ann[PinnedAnnotation] = hostname
			sel[HostnameLabel] = hostname
		}
	case OpResumed:
		if pod == nil || pod.Done || pod.Deleting || pod.RestoreFrom != w.Checkpoint || sb.RestoreFrom != w.Checkpoint {
			return nil, fmt.Errorf("Sandbox %s's pod %s on node %q was not restored from %q", sb, pod, node, w.Checkpoint)
		}
		tmplAnn[policy.RestoreAnnotation] = nil
		if sb.PinnedTo != "" && sb.Selector == sb.PinnedTo {
			ann[PinnedAnnotation] = nil
			sel[HostnameLabel] = nil
		}
	default:
		return nil, fmt.Errorf("op %q is none of %s, %s and %s", w.Op, OpSuspending, OpSuspended, OpResumed)
	}
	tmpl := map[string]any{"metadata": map[string]any{"annotations": tmplAnn}}
	if len(sel) > 0 {
		tmpl["spec"] = map[string]any{"nodeSelector": sel}
	}
	patch := map[string]any{"spec": map[string]any{"podTemplate": tmpl}}
	if len(ann) > 0 {
		patch["metadata"] = map[string]any{"annotations": ann}
	}
	return json.Marshal(patch)
}

// The pin: the node label a Sandbox's next pod is pinned by, and the
// annotation that says agentbox pinned it.
const (
	HostnameLabel    = "kubernetes.io/hostname"
	PinnedAnnotation = "agentbox.dev/pinned-to"
)
