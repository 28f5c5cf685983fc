// Package compile is agentbox's one compile step: from the shim config,
// the policy set, what the runtime knows of a container and its OCI spec,
// to the profile it runs under, the changes to its spec, runsc's flags,
// the egress plan and the audit points. The shim's Create and `agentbox
// policy explain` both call Compile, so what explain shows is what the
// shim does. It does no I/O of its own: what must touch the node comes in
// as callbacks (reading the role's secrets, staging checked mounts).
package compile

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/policy"
)

// Input is what a container is compiled from.
type Input struct {
	Config *config.Config
	// Policies and Request select the profile of a sandbox root. Profile,
	// when set, is the pod's profile a joining container runs under.
	Policies *policy.Set
	Request  policy.Request
	Profile  *policy.Profile
	// Secrets reads the role's secrets from the node (nil: none are read;
	// each secret variable is set to a placeholder naming its file).
	Secrets func(*policy.Profile) (map[string]string, error)
	// Mounts is what the runtime proved about the container's mounts, and
	// how accepted binds are staged.
	Mounts policy.MountEnv
	// OOMFloor, when set, is the lowest oom_score_adj the host allows.
	OOMFloor *int
}

// Result is what the shim applies.
type Result struct {
	// Profile is set as soon as one is selected, even when compiling it
	// onto the spec then fails (the refusal names the role).
	Profile *policy.Profile
	// Changes describes each change made to the spec, in order.
	Changes []string
	// RunscFlags are the config's tuning flags and the role's; the shim
	// adds the sandbox's audit session (pod-init-config).
	RunscFlags map[string]string
	Egress     *netpolicy.Plan
	Audit      audit.Points
}

// Compile selects the profile (unless given), rewrites spec in place and
// returns the rest of what the shim applies.
func Compile(in Input, spec *specs.Spec) (*Result, error) {
	res := &Result{Profile: in.Profile}
	if res.Profile == nil {
		p, err := in.Policies.Select(in.Request)
		if err != nil {
			return res, err
		}
		res.Profile = p
	}
	p := res.Profile
	pl, err := netpolicy.Compile(p)
	if err != nil {
		return res, errkind.InvalidArgument(err)
	}
	secrets := map[string]string{}
	if in.Secrets != nil {
		if secrets, err = in.Secrets(p); err != nil {
			return res, errkind.FailedPrecondition(err)
		}
	} else {
		for _, s := range p.Credentials.Secrets {
			if s.Inject != nil {
				secrets[s.Env] = "<placeholder: the gateway injects the secret from " + s.File + " toward " + s.Inject.Host + ">"
			} else {
				secrets[s.Env] = "<secret from " + s.File + ">"
			}
		}
	}
	rewrites := []ocispec.Rewrite{ocispec.StripGVisorAnnotations, ocispec.MarkSandboxRoot}
	if in.OOMFloor != nil {
		rewrites = append(rewrites, ocispec.RaiseOOMScoreAdj(*in.OOMFloor))
	}
	rewrites = append(rewrites, p.SpecRewrites(secrets, in.Mounts)...)
	if res.Changes, err = ocispec.Apply(spec, rewrites...); err != nil {
		return res, err
	}
	res.Egress = pl
	res.RunscFlags = in.Config.RunscFlags(p.RunscFlags())
	res.Audit = audit.Points{Process: p.Audit.Process, File: p.Audit.File, Network: p.Audit.Network}
	return res, nil
}
