package shim

// A claim's keys (issue 50): a role's secret with fromClaim has no source
// while the pod waits warm, so its gateway injects nothing for it; the
// node agent hands the shim the keys the claim gives (from the broker,
// which gave this node their values), and from the claim's owner record
// on, the gateway injects them. A key the role does not take, of another
// namespace, or with no file on the node binds nothing of the claim.

import (
	"fmt"
	"maps"
	"sort"
	"strings"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// boundInjects are the secrets the gateway injects now: the plan's, with
// each claim key's source as bound (refs, by fromClaim name), and a claim
// key not bound left out.
func boundInjects(pl *netpolicy.Plan, refs map[string]policy.SecretRef) []netpolicy.Inject {
	out := make([]netpolicy.Inject, 0, len(pl.Injects))
	for _, in := range pl.Injects {
		if in.FromClaim != "" {
			r, ok := refs[in.FromClaim]
			if !ok {
				continue
			}
			in.Ref = &r
		}
		out = append(out, in)
	}
	return out
}

// claimRefs checks a claim's keys against the gateway's plan and the pod's
// namespace, and gives them by fromClaim name. Pure.
func claimRefs(pl *netpolicy.Plan, podNamespace string, keys []control.ClaimKey) (map[string]policy.SecretRef, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	takes := map[string]bool{}
	if pl != nil {
		for _, in := range pl.Injects {
			if in.FromClaim != "" {
				takes[in.FromClaim] = true
			}
		}
	}
	out := map[string]policy.SecretRef{}
	for _, k := range keys {
		switch {
		case !takes[k.Name]:
			return nil, fmt.Errorf("key %s: the sandbox's role has no injected secret with fromClaim: %s", k.Name, k.Name)
		case k.Secret.Namespace != podNamespace:
			return nil, fmt.Errorf("key %s: Secret %s is not of the pod's namespace %s", k.Name, k.Secret, podNamespace)
		}
		out[k.Name] = k.Secret
	}
	return out, nil
}

// claimKeyText names the bound keys and where they go, never a value.
func claimKeyText(pl *netpolicy.Plan, refs map[string]policy.SecretRef) string {
	var parts []string
	for _, in := range boundInjects(pl, refs) {
		if in.FromClaim != "" {
			parts = append(parts, fmt.Sprintf("%s=%s as %s toward %s", in.FromClaim, in.Ref, in.Header, in.Host))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// claimBinding is a claim's keys, checked and read, ready to hand the
// gateway (commit), or nothing to do (a sandbox with no gateway or no
// claim key, and no claim key bound before).
type claimBinding struct {
	gw      *egressgw.Gateway
	refs    map[string]policy.SecretRef
	secrets []egressgw.Secret
	// text names what is bound ("" none).
	text string
}

// prepareClaimKeys checks and reads the keys c gives (nil: none, which
// unbinds any a claim before gave). An error binds nothing. Called under
// sb.ops.
func prepareClaimKeys(sb *sandboxState, c *control.Claim) (*claimBinding, error) {
	sb.egressMu.Lock()
	gw, pl, had := sb.gateway, sb.gatewayPlan, sb.claimRefs
	sb.egressMu.Unlock()
	var keys []control.ClaimKey
	if c != nil {
		keys = c.Keys
	}
	refs, err := claimRefs(pl, sb.request.PodNamespace, keys)
	if err != nil {
		return nil, err
	}
	if gw == nil || maps.Equal(refs, had) {
		return nil, nil
	}
	secrets, err := injectedSecrets(sb, boundInjects(pl, refs))
	if err != nil {
		return nil, fmt.Errorf("the claim's keys: %w", err)
	}
	return &claimBinding{gw: gw, refs: refs, secrets: secrets, text: claimKeyText(pl, refs)}, nil
}

// commit hands the gateway the claim's keys: its next requests carry them.
func (b *claimBinding) commit(sb *sandboxState) {
	if b == nil {
		return
	}
	sb.secretsMu.Lock()
	defer sb.secretsMu.Unlock()
	sb.egressMu.Lock()
	sb.claimRefs = b.refs
	sb.egressMu.Unlock()
	b.gw.SetSecrets(b.secrets)
}

// injectsNow are the secrets the sandbox's gateway injects now.
func (sb *sandboxState) injectsNow(pl *netpolicy.Plan) []netpolicy.Inject {
	sb.egressMu.Lock()
	refs := sb.claimRefs
	sb.egressMu.Unlock()
	return boundInjects(pl, refs)
}

// claimHosts are the hosts whose key a claim gives: until the sandbox's
// claim is decided, the gateway holds their requests for it.
func claimHosts(pl *netpolicy.Plan) []string {
	var out []string
	for _, in := range pl.Injects {
		if in.FromClaim != "" {
			out = append(out, in.Host)
		}
	}
	return out
}

// settleClaimKeys ends the wait for a claim's keys once the pod's claim is
// decided (its keys bound, or none, or refused): no request waits any
// more. Call it after commit.
func settleClaimKeys(sb *sandboxState, o *control.Owner) {
	if o.Holder == nil || o.Holder.Kind != "SandboxClaim" {
		return
	}
	sb.egressMu.Lock()
	gw := sb.gateway
	sb.egressMu.Unlock()
	if gw != nil {
		gw.HoldFor(nil)
	}
}
