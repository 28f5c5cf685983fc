package shim

// A claim's role (issue 50): a SandboxClaim may name the role its task
// runs under (agentbox.dev/role on the claim). A warm sandbox takes it at
// its claim, without a restart, only as a live tightening is taken: the
// role is bound to the pod (the node's policy, as at Create), and the
// sandbox running under it would be no looser in anything, nor differ in
// what a running sandbox cannot change (filesystem, process, credentials,
// wall clock, audit). From then on the sandbox's role is the claim's: its
// later versions tighten it live, as the pool's did.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/tighten"
)

// roleChange is a claim's role, checked: what selects it, its profile and
// what it changes in the sandbox.
type roleChange struct {
	req    policy.Request
	next   *policy.Profile
	change tighten.Change
}

// roleRequest is what selects the sandbox's role now: its own request, or
// with the role its claim named. The caller holds sb.ops.
// +checklocks:sb.ops
func (sb *sandboxState) roleRequest() policy.Request {
	if sb.claimRole == nil {
		return sb.request
	}
	return *sb.claimRole
}

// withRole is req claiming role (its other annotations, a pod's
// tightenings among them, kept).
func withRole(req policy.Request, role string) policy.Request {
	ann := make(map[string]string, len(req.Annotations)+1)
	for k, v := range req.Annotations {
		ann[k] = v
	}
	ann[policy.RoleAnnotation] = role
	req.Annotations = ann
	return req
}

// noLooser says why a change cannot be taken by a claim: whatever it
// leaves pending (a loosening, or what a running sandbox cannot change).
// Pure.
func noLooser(role string, c tighten.Change) error {
	if len(c.Pending) == 0 {
		return nil
	}
	return fmt.Errorf("role %s is not as tight as what the sandbox runs under: %s", role, strings.Join(c.Pending, "; "))
}

// prepareClaimRole checks the role a claim names ("" none; nil: nothing
// to change). The caller holds sb.ops.
// +checklocks:sb.ops
func (s *service) prepareClaimRole(sb *sandboxState, role string) (*roleChange, error) {
	if role == "" || sb.profile == nil {
		return nil, nil
	}
	set, err := s.loadPolicies(sb.cfg)
	if err != nil {
		return nil, fmt.Errorf("role %s: the policy directory does not load: %w", role, err)
	}
	req := withRole(sb.roleRequest(), role)
	next, err := set.Select(req)
	if err != nil {
		return nil, err
	}
	change, err := tighten.Diff(tighten.Running{Profile: sb.profile, Plan: sb.live.Load(), MemoryBytes: sb.memoryLimit, CPUMillis: sb.cpuMillis}, next)
	if err != nil {
		return nil, fmt.Errorf("role %s: %w", role, err)
	}
	if err := noLooser(role, change); err != nil {
		return nil, err
	}
	return &roleChange{req: req, next: next, change: change}, nil
}

// prepareClaim checks what a claim binds besides its identity: its role,
// then its keys (under that role). The caller holds sb.ops.
// +checklocks:sb.ops
func (s *service) prepareClaim(sb *sandboxState, c *control.Claim) (*roleChange, *claimBinding, error) {
	if c == nil {
		b, err := prepareClaimKeys(sb, nil)
		return nil, b, err
	}
	rc, err := s.prepareClaimRole(sb, c.Role)
	if err != nil {
		return nil, nil, err
	}
	b, err := prepareClaimKeys(sb, c)
	if err != nil {
		return nil, nil, err
	}
	return rc, b, nil
}

// refusedClaim is o with its claim's identity refused for err.
func refusedClaim(o *control.Owner, err error) *control.Owner {
	refused := *o
	refused.Claim, refused.ClaimRefused = nil, control.ClipReason("the shim bound none of the claim: "+err.Error())
	return &refused
}

// applyClaimRole makes the sandbox run under the claim's role: what it
// tightens is loaded now, and its later versions select by it. A change
// whose rules cannot be loaded fails the sandbox closed, as a live
// tightening does; detail says what was done. The caller holds sb.ops.
// +checklocks:sb.ops
func (s *service) applyClaimRole(ctx context.Context, sb *sandboxState, rc *roleChange, detail map[string]string) error {
	if rc == nil {
		return nil
	}
	detail["claim_role"] = rc.next.Role
	detail["claim_role_digest"] = rc.next.Digest
	if c := rc.change; c.Tightens() {
		start := time.Now()
		if _, fallback, err := s.takeChange(ctx, sb, c); err != nil {
			return fmt.Errorf("role %s: its rules could not be loaded (%w): the sandbox was %s", rc.next.Role, err, fallback)
		}
		detail["claim_role_applied"] = strings.Join(c.Applied, "; ")
		detail["claim_role_applied_in"] = time.Since(start).Round(time.Microsecond).String()
	}
	sb.claimRole = &rc.req
	sb.seen = rc.next.Digest
	sb.liveDigest.Store(&rc.next.Digest)
	return nil
}
