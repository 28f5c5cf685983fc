package policysync

// A claimed Sandbox's task identity (issue 50): the node agent asks the
// broker, which reads the SandboxClaim for the node the pod runs on and no
// other; the node agent itself may not read claims.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
)

// bindClaim fills in o's claim identity when a SandboxClaim holds the
// Sandbox: what the shim already holds for that same claim (bound once),
// else the broker's answer, or why it refused. false: the broker could not
// be asked now, and o is not to be sent yet (the trail would otherwise say
// the claim came with no identity).
func (a *Agent) bindClaim(ctx context.Context, o, had *control.Owner, pod broker.Ref) bool {
	h := o.Holder
	if h == nil || h.Kind != "SandboxClaim" {
		return true
	}
	if had != nil && had.SameHolder(o) && had.ClaimRead() {
		o.Claim, o.ClaimRefused = had.Claim, had.ClaimRefused
		return true
	}
	if a.Broker == nil {
		o.ClaimRefused = "the node agent has no broker to read the claim from (--broker-url)"
		return true
	}
	resp, err := a.Broker.Claim(ctx, pod)
	var be *broker.Error
	switch {
	case err == nil && resp.Claim.UID != h.UID:
		err = fmt.Errorf("the broker answered for SandboxClaim %s (uid %s), not uid %s", resp.Claim, resp.Claim.UID, h.UID)
	case err == nil:
		if err := a.keepClaimKeys(resp); err != nil {
			// The shim would bind a key the node does not hold: not yet.
			a.Log.WithError(err).WithField("pod", pod.String()).Warn("keeping the claim's keys on the node")
			return false
		}
		o.Claim = &resp.Identity
		return true
	case errors.As(err, &be) && be.Refused():
		o.ClaimRefused = control.ClipReason(be.Msg)
		a.claimNotBound(ctx, h, o.ClaimRefused)
		return true
	}
	a.Log.WithError(err).WithField("pod", pod.String()).Warn("reading the pod's SandboxClaim from the broker")
	return false
}

// claimNotBound tells the claim's author, where they look (an Event on
// the claim), that nothing of the claim was bound, and why: the broker's
// refusal, or the shim's (a role looser than the pool's, a key its role
// does not take).
func (a *Agent) claimNotBound(ctx context.Context, h *control.ObjectRef, reason string) {
	claim := &unstructured.Unstructured{}
	claim.SetAPIVersion(SandboxExtensionsGroup + "/v1beta1")
	claim.SetKind("SandboxClaim")
	claim.SetNamespace(h.Namespace)
	claim.SetName(h.Name)
	claim.SetUID(types.UID(h.UID))
	a.event(ctx, claim, "Warning", "AgentboxClaimNotBound", "agentbox bound none of this claim (task identity, role, keys) to its sandbox: "+reason)
}

// keepClaimKeys writes the values of the keys a claim gives into the
// secrets directory before the shim is told to bind them, and asks for a
// keys round, which from then on keeps them (and removes them once no pod
// here needs them).
func (a *Agent) keepClaimKeys(resp *broker.ClaimResponse) error {
	if len(resp.Values) == 0 {
		return nil
	}
	if a.SecretsDir == "" {
		return errors.New("this node keeps no Secrets (agentbox sync --secrets-dir none)")
	}
	if err := ensurePrivateDir(a.SecretsDir); err != nil {
		return err
	}
	for _, k := range resp.Values {
		if err := policy.ValidateSecretRef(k.SecretRef); err != nil {
			return err
		}
		if !slices.ContainsFunc(resp.Identity.Keys, func(c control.ClaimKey) bool { return c.Secret == k.SecretRef }) {
			return fmt.Errorf("the broker gave Secret %s, which the claim does not name", k.SecretRef)
		}
		changed, err := writeSecretFile(k.SecretRef.Path(a.SecretsDir), k.Value)
		if err != nil {
			return fmt.Errorf("writing Secret %s: %w", k.SecretRef, err)
		}
		if changed {
			a.recordSecret("Success", fmt.Sprintf("Secret %s: its value written to the node (%s), for SandboxClaim %s's task", k.SecretRef, k.SecretRef.Path(a.SecretsDir), resp.Claim), k.SecretRef.String())
		}
	}
	if a.podsKick != nil {
		pokeChan(a.podsKick)
	}
	return nil
}
