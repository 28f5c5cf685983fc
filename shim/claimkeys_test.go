package shim

import (
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func TestClaimRefs(t *testing.T) {
	own := policy.SecretRef{Namespace: "agents", Name: "task-keys", Key: "token"}
	pl := &netpolicy.Plan{Injects: []netpolicy.Inject{
		{Host: "vendor.example", Header: "X-Api-Key", Format: policy.SecretToken, FromClaim: "vendor"},
		{Host: "files.example", Header: "Authorization", Format: "Bearer " + policy.SecretToken, File: "/etc/agentbox/files-token"},
	}}
	for _, tc := range []struct {
		name string
		keys []control.ClaimKey
		err  string
	}{
		{name: "none"},
		{name: "a key the role takes", keys: []control.ClaimKey{{Name: "vendor", Secret: own}}},
		{name: "a key the role does not take", keys: []control.ClaimKey{{Name: "files", Secret: own}}, err: "no injected secret with fromClaim: files"},
		{name: "another namespace's Secret", keys: []control.ClaimKey{{Name: "vendor", Secret: policy.SecretRef{Namespace: "kube-system", Name: "s", Key: "k"}}}, err: "not of the pod's namespace agents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refs, err := claimRefs(pl, "agents", tc.keys)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || refs != nil {
					t.Fatalf("got %v %v, want %q", refs, err, tc.err)
				}
				return
			}
			if err != nil || len(refs) != len(tc.keys) {
				t.Fatalf("got %v %v", refs, err)
			}
		})
	}
	// Before the claim: the claim's key is not injected at all; the
	// role's own file is.
	if in := boundInjects(pl, nil); len(in) != 1 || in[0].Host != "files.example" {
		t.Fatalf("unbound: %+v", in)
	}
	refs := map[string]policy.SecretRef{"vendor": own}
	in := boundInjects(pl, refs)
	if len(in) != 2 || in[0].Ref == nil || in[0].Path("/s") != "/s/agents/task-keys/token" || pl.Injects[0].Ref != nil {
		t.Fatalf("bound: %+v (the plan: %+v)", in, pl.Injects[0])
	}
	if got := claimKeyText(pl, refs); got != "vendor=agents/task-keys[token] as X-Api-Key toward vendor.example" {
		t.Fatalf("text: %q", got)
	}
}
