package broker

// A task's identity at its claim (issue 50): a SandboxClaim may name who
// asked, the tenant and the task in agentbox.dev/* annotations, and a node
// learns them for the pod it runs, and no other. The node agent cannot read
// claims itself: what a claim says of its task is the cluster's, not any
// one node's, as a Secret is.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
)

// PathClaim answers a pod's claim and its task's identity.
const PathClaim = "/v1/claim"

// SandboxExtensionsGroup is agent-sandbox's extensions API group (its
// SandboxClaim and SandboxWarmPool).
const SandboxExtensionsGroup = "extensions.agents.x-k8s.io"

// The claim annotations a task's identity is read from.
const (
	SubjectAnnotation = "agentbox.dev/subject"
	TenantAnnotation  = "agentbox.dev/tenant"
	TaskAnnotation    = "agentbox.dev/task"
)

// Identity is who a claimed sandbox works for: what the node agent hands
// the shim as it is.
type Identity = control.Claim

// Claim is what the broker reads of a SandboxClaim.
type Claim struct {
	Ref
	Annotations map[string]string
}

// ClaimRequest asks for the claim of a pod bound to the asking node.
type ClaimRequest struct {
	Pod Ref `json:"pod"`
}

// KeyAnnotationPrefix begins the annotation that gives a claim's task a
// key: agentbox.dev/key.NAME: SECRET/KEY, a key of a Secret in the
// claim's own namespace, for the role's fromClaim: NAME secret.
const KeyAnnotationPrefix = "agentbox.dev/key."

// ClaimResponse names the claim and its task's identity, with the values
// of the keys it gives (so that the node holds them before the shim binds
// them).
type ClaimResponse struct {
	Claim    Ref      `json:"claim"`
	Identity Identity `json:"identity"`
	Values   []Key    `json:"values,omitempty"`
}

// IdentityOf reads a claim's identity and key annotations (ns: the
// claim's namespace, the only one its keys come from). Any other
// agentbox.dev/ annotation, or a value that is empty, too long or not
// printable text, refuses the whole identity, naming the annotation: a
// claim is never half bound. Pure.
func IdentityOf(ns string, annotations map[string]string) (Identity, error) {
	var id Identity
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.HasPrefix(k, "agentbox.dev/") {
			continue
		}
		v := annotations[k]
		if err := control.CheckClaimValue(v); err != nil {
			return Identity{}, fmt.Errorf("annotation %s: %v; nothing of the claim is bound", k, err)
		}
		var field *string
		switch k {
		case SubjectAnnotation:
			field = &id.Subject
		case TenantAnnotation:
			field = &id.Tenant
		case TaskAnnotation:
			field = &id.Task
		case policy.RoleAnnotation:
			if !policy.ValidRoleName(v) {
				return Identity{}, fmt.Errorf("annotation %s: %q is not a role's name; nothing of the claim is bound", k, v)
			}
			field = &id.Role
		default:
			name, ok := strings.CutPrefix(k, KeyAnnotationPrefix)
			if !ok {
				return Identity{}, fmt.Errorf("annotation %s: not understood on a SandboxClaim (known: %s, %s, %s, %s, %sNAME); nothing of the claim is bound", k, SubjectAnnotation, TenantAnnotation, TaskAnnotation, policy.RoleAnnotation, KeyAnnotationPrefix)
			}
			key, err := claimKey(ns, name, v)
			if err != nil {
				return Identity{}, fmt.Errorf("annotation %s: %v; nothing of the claim is bound", k, err)
			}
			if len(id.Keys) == control.MaxClaimKeys {
				return Identity{}, fmt.Errorf("annotation %s: more than %d keys; nothing of the claim is bound", k, control.MaxClaimKeys)
			}
			id.Keys = append(id.Keys, key)
			continue
		}
		*field = v
	}
	return id, nil
}

// givesKeys says whether a claim's annotations name a key.
func givesKeys(annotations map[string]string) bool {
	for k := range annotations {
		if strings.HasPrefix(k, KeyAnnotationPrefix) {
			return true
		}
	}
	return false
}

// claimKey reads one key annotation's value, SECRET/KEY, in namespace ns.
func claimKey(ns, name, v string) (control.ClaimKey, error) {
	if err := policy.ValidClaimKey(name); err != nil {
		return control.ClaimKey{}, err
	}
	secret, key, ok := strings.Cut(v, "/")
	if !ok {
		return control.ClaimKey{}, fmt.Errorf("%q is not SECRET/KEY (a Secret of the claim's namespace, %s)", v, ns)
	}
	r := policy.SecretRef{Namespace: ns, Name: secret, Key: key}
	if err := policy.ValidateSecretRef(r); err != nil {
		return control.ClaimKey{}, err
	}
	return control.ClaimKey{Name: name, Secret: r}, nil
}

// checkKeys says whether role p runs under takes the claim's keys: a
// cluster role bound to the pod, whose fromClaim secrets name each. A
// node's own role file is the node's word, and a claim's key is the
// cluster's: the broker gives none for it. Pure.
func checkKeys(p Pod, rs Roles, keys []control.ClaimKey) error {
	if len(keys) == 0 {
		return nil
	}
	if _, ok := rs.Roles[p.Role]; !ok || !rs.Bound(p.Role, p) {
		return fmt.Errorf("annotation %s%s: the pod's role %q is not a cluster AgentRole bound to namespace %s: a claim's keys go only to one; nothing of the claim is bound", KeyAnnotationPrefix, keys[0].Name, p.Role, p.Namespace)
	}
	takes := rs.ClaimKeys(p.Role)
	for _, k := range keys {
		if !takes[k.Name] {
			return fmt.Errorf("annotation %s%s: role %q has no secret with fromClaim: %s; nothing of the claim is bound", KeyAnnotationPrefix, k.Name, p.Role, k.Name)
		}
	}
	return nil
}

// ClaimOf decides whether node may learn pod's claim: the pod (of the
// request's UID) is bound to node and is its Sandbox's own, and that
// Sandbox's controller is the SandboxClaim read; and the keys it gives are
// ones the pod's cluster role takes. Pure.
func ClaimOf(node string, req Ref, p Pod, sb Sandbox, c Claim, rs Roles) (ClaimResponse, error) {
	switch {
	case p.UID != req.UID:
		return ClaimResponse{}, fmt.Errorf("pod %s has uid %s, not %s", req, p.UID, req.UID)
	case node == "" || p.Node != node:
		return ClaimResponse{}, fmt.Errorf("pod %s is bound to node %q, not %s", p, p.Node, node)
	case !sandboxPod(p, sb):
		return ClaimResponse{}, fmt.Errorf("pod %s is not Sandbox %s's own", p, sb)
	case sb.ControllerKind != "SandboxClaim" || sb.ControllerGroup != SandboxExtensionsGroup:
		return ClaimResponse{}, fmt.Errorf("Sandbox %s is not held by a SandboxClaim", sb)
	case c.Namespace != sb.Namespace || c.Name != sb.ControllerName || c.UID != sb.ControllerUID:
		return ClaimResponse{}, fmt.Errorf("Sandbox %s is held by SandboxClaim %s (uid %s), not %s (uid %s)", sb, sb.ControllerName, sb.ControllerUID, c, c.UID)
	}
	id, err := IdentityOf(c.Namespace, c.Annotations)
	if err == nil {
		err = checkKeys(p, rs, id.Keys)
	}
	if err != nil {
		return ClaimResponse{}, fmt.Errorf("SandboxClaim %s: %v", c, err)
	}
	return ClaimResponse{Claim: c.Ref, Identity: id}, nil
}

func (s *Server) claim(ctx context.Context, c Caller, body []byte) (any, error) {
	var req ClaimRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	p, err := s.API.Pod(ctx, req.Pod.Namespace, req.Pod.Name)
	if err != nil {
		return nil, refuse("pod %s: %v", req.Pod, err)
	}
	sb, cl, err := s.claimOfPod(ctx, p)
	if err != nil {
		return nil, refuse("%v", err)
	}
	var rs Roles
	if givesKeys(cl.Annotations) {
		// Only a claim that gives keys needs the roles read.
		if rs, err = s.API.Roles(ctx); err != nil && rs.Roles == nil {
			return nil, err
		}
	}
	resp, err := ClaimOf(c.Node, req.Pod, p, sb, cl, rs)
	if err != nil {
		return nil, refuse("%v", err)
	}
	for _, k := range resp.Identity.Keys {
		v, err := s.API.SecretValue(ctx, k.Secret)
		switch {
		case errors.Is(err, ErrNoValue):
			return nil, refuse("SandboxClaim %s: annotation %s%s: %v; nothing of the claim is bound", cl, KeyAnnotationPrefix, k.Name, err)
		case err != nil:
			return nil, err
		}
		resp.Values = append(resp.Values, Key{SecretRef: k.Secret, Value: v})
	}
	s.Log.WithFields(logrus.Fields{"node": c.Node, "pod": p.String(), "claim": cl.String(), "keys": len(resp.Values)}).Info("claim given")
	return resp, nil
}

// claimOfPod reads the Sandbox whose pod p is and the SandboxClaim that
// holds it.
func (s *Server) claimOfPod(ctx context.Context, p Pod) (Sandbox, Claim, error) {
	if p.ControllerKind != "Sandbox" || p.ControllerGroup != SandboxGroup {
		return Sandbox{}, Claim{}, fmt.Errorf("pod %s is not an agent-sandbox Sandbox's", p)
	}
	sb, err := s.API.Sandbox(ctx, p.Namespace, p.ControllerName)
	if err != nil {
		return Sandbox{}, Claim{}, fmt.Errorf("Sandbox %s/%s: %v", p.Namespace, p.ControllerName, err)
	}
	if sb.ControllerKind != "SandboxClaim" {
		return Sandbox{}, Claim{}, fmt.Errorf("Sandbox %s is not held by a SandboxClaim", sb)
	}
	cl, err := s.API.Claim(ctx, sb.Namespace, sb.ControllerName)
	if err != nil {
		return Sandbox{}, Claim{}, fmt.Errorf("SandboxClaim %s/%s: %v", sb.Namespace, sb.ControllerName, err)
	}
	return sb, cl, nil
}

// claimedKeys are the keys the claims of node's claimed Sandbox pods give
// their tasks, by pod, as ClaimOf gives them; a claim that gives none, or
// cannot be read now, adds none.
func (s *Server) claimedKeys(ctx context.Context, node string, pods []Pod, rs Roles) map[string][]control.ClaimKey {
	out := map[string][]control.ClaimKey{}
	for _, p := range pods {
		if p.Node != node || p.Done || p.ControllerKind != "Sandbox" || p.ControllerGroup != SandboxGroup || len(rs.ClaimKeys(p.Role)) == 0 {
			continue
		}
		sb, cl, err := s.claimOfPod(ctx, p)
		if err != nil {
			continue
		}
		if resp, err := ClaimOf(node, p.Ref, p, sb, cl, rs); err == nil && len(resp.Identity.Keys) > 0 {
			out[p.String()] = resp.Identity.Keys
		}
	}
	return out
}
