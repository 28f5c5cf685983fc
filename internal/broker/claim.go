package broker

// A task's identity at its claim (issue 50): a SandboxClaim may name who
// asked, the tenant and the task in agentbox.dev/* annotations, and a node
// learns them for the pod it runs, and no other. The node agent cannot read
// claims itself: what a claim says of its task is the cluster's, not any
// one node's, as a Secret is.

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"

	"agentbox.dev/agentbox/internal/control"
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

// ClaimResponse names the claim and its task's identity.
type ClaimResponse struct {
	Claim    Ref      `json:"claim"`
	Identity Identity `json:"identity"`
}

// IdentityOf reads a claim's identity annotations. Any other agentbox.dev/
// annotation, or a value that is empty, too long or not printable text,
// refuses the whole identity, naming the annotation: a claim is never half
// bound. Pure.
func IdentityOf(annotations map[string]string) (Identity, error) {
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
		var field *string
		switch k {
		case SubjectAnnotation:
			field = &id.Subject
		case TenantAnnotation:
			field = &id.Tenant
		case TaskAnnotation:
			field = &id.Task
		default:
			return Identity{}, fmt.Errorf("annotation %s: not understood on a SandboxClaim (known: %s, %s, %s); nothing of the claim is bound", k, SubjectAnnotation, TenantAnnotation, TaskAnnotation)
		}
		if err := control.CheckClaimValue(v); err != nil {
			return Identity{}, fmt.Errorf("annotation %s: %v; nothing of the claim is bound", k, err)
		}
		*field = v
	}
	return id, nil
}

// ClaimOf decides whether node may learn pod's claim: the pod (of the
// request's UID) is bound to node and is its Sandbox's own, and that
// Sandbox's controller is the SandboxClaim read. Pure.
func ClaimOf(node string, req Ref, p Pod, sb Sandbox, c Claim) (ClaimResponse, error) {
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
	id, err := IdentityOf(c.Annotations)
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
	if p.ControllerKind != "Sandbox" || p.ControllerGroup != SandboxGroup {
		return nil, refuse("pod %s is not an agent-sandbox Sandbox's", p)
	}
	sb, err := s.API.Sandbox(ctx, p.Namespace, p.ControllerName)
	if err != nil {
		return nil, refuse("Sandbox %s/%s: %v", p.Namespace, p.ControllerName, err)
	}
	if sb.ControllerKind != "SandboxClaim" {
		return nil, refuse("Sandbox %s is not held by a SandboxClaim", sb)
	}
	cl, err := s.API.Claim(ctx, sb.Namespace, sb.ControllerName)
	if err != nil {
		return nil, refuse("SandboxClaim %s/%s: %v", sb.Namespace, sb.ControllerName, err)
	}
	resp, err := ClaimOf(c.Node, req.Pod, p, sb, cl)
	if err != nil {
		return nil, refuse("%v", err)
	}
	s.Log.WithFields(logrus.Fields{"node": c.Node, "pod": p.String(), "claim": cl.String()}).Info("claim given")
	return resp, nil
}
