package policy

import (
	"fmt"
	"strconv"
	"strings"

	"agentbox.dev/agentbox/internal/errkind"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/ocispec"
)

// SpecRewrites renders the profile as changes to a container's OCI spec.
// secrets maps each of the role's secret variables to its value, read from
// the node by the caller; env says what the runtime proved about where the
// container's mounts may come from, and stages the accepted ones.
func (p *Profile) SpecRewrites(secrets map[string]string, env MountEnv) []ocispec.Rewrite {
	return []ocispec.Rewrite{
		p.checkHostOptions,
		p.rewriteRootfs,
		p.rewriteMounts(env),
		func(s *specs.Spec) (string, error) {
			if s.Process == nil {
				return "", nil
			}
			return p.ApplyProcess(s.Process, secrets)
		},
		p.rewriteResources,
		p.rewriteSeccomp,
	}
}

// RunscFlags are the runsc flags the profile needs, for the sandbox.
func (p *Profile) RunscFlags() map[string]string {
	f := map[string]string{}
	// allowlist and open keep gVisor's netstack on the pod interface; the
	// shim filters it with nftables outside the sandbox (netpolicy).
	// Under egress none the sandbox gets no interface, unless the node's
	// port-forward must reach it (gVisor forwards only to its netstack):
	// then netpolicy drops every packet it sends.
	if p.Network.Egress == EgressNone && len(p.Network.PortForward) == 0 {
		f["network"] = "none"
	}
	if p.Filesystem.Rootfs == RootfsOverlay {
		f["overlay2"] = "root:memory"
	}
	// The baseline syscall policy always applies, inside gVisor.
	f["oci-seccomp"] = "true"
	return f
}

func (p *Profile) rewriteRootfs(s *specs.Spec) (string, error) {
	if s.Root == nil {
		return "", fmt.Errorf("spec has no root filesystem")
	}
	ro := p.boundRootReadonly(s.Root.Readonly)
	if s.Root.Readonly == ro {
		if ro && p.Filesystem.Rootfs == RootfsOverlay {
			return "rootfs read-only (asked for; no overlay)", nil
		}
		return "", nil
	}
	s.Root.Readonly = ro
	return fmt.Sprintf("rootfs read-only=%v", ro), nil
}

func appendMissing(list []string, add ...string) []string {
	have := map[string]bool{}
	for _, v := range list {
		have[v] = true
	}
	for _, v := range add {
		if !have[v] {
			list = append(list, v)
			have[v] = true
		}
	}
	return list
}

// ApplyProcess bounds a process (a container's, or an exec's) by the
// profile (ceiling.go): identity, capabilities, no_new_privs, rlimits and
// environment. What it asks beyond the role is refused, naming the field.
func (p *Profile) ApplyProcess(proc *specs.Process, secrets map[string]string) (string, error) {
	user, userNote, err := p.boundUser(proc.User)
	if err != nil {
		return "", err
	}
	caps, capsNote, err := p.boundCapabilities(proc.Capabilities)
	if err != nil {
		return "", err
	}
	proc.User, proc.Capabilities = user, caps
	proc.NoNewPrivileges = p.boundNoNewPrivileges(proc.NoNewPrivileges)
	proc.Rlimits = p.boundRlimits(proc.Rlimits)
	env, dropped := p.FilterEnv(proc.Env)
	for _, sec := range p.Credentials.Secrets {
		if sec.Env == "" {
			continue // injected by the gateway only
		}
		v, ok := secrets[sec.Env]
		if !ok {
			return "", errkind.FailedPrecondition(fmt.Errorf("secret %s of role %q was not provided", sec.Env, p.Role))
		}
		env = setEnv(env, sec.Env, v)
	}
	proc.Env = env
	var limits []string
	for _, r := range proc.Rlimits {
		limits = append(limits, fmt.Sprintf("%s %d", strings.ToLower(strings.TrimPrefix(r.Type, "RLIMIT_")), r.Hard))
	}
	return fmt.Sprintf("process: %s; %s; no_new_privs %v; %s; env dropped %v", userNote, capsNote, proc.NoNewPrivileges, strings.Join(limits, " "), dropped), nil
}

// FilterEnv keeps the variables the role allows and returns the names of the
// dropped ones (never their values).
func (p *Profile) FilterEnv(env []string) (kept, dropped []string) {
	kept = []string{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if p.envAllowed(name) {
			kept = append(kept, kv)
		} else {
			dropped = append(dropped, name)
		}
	}
	return kept, dropped
}

// EnvAllowed reports whether the role lets an environment variable through.
func (p *Profile) EnvAllowed(name string) bool { return p.envAllowed(name) }

func (p *Profile) envAllowed(name string) bool {
	for _, pat := range p.Credentials.EnvAllow {
		if pat == name || (strings.HasSuffix(pat, "*") && strings.HasPrefix(name, strings.TrimSuffix(pat, "*"))) {
			return true
		}
	}
	return false
}

func setEnv(env []string, name, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if n, _, _ := strings.Cut(kv, "="); n != name {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

func (p *Profile) rewriteResources(s *specs.Spec) (string, error) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	r := s.Linux.Resources
	var parts []string
	if p.Limits.MemoryBytes > 0 {
		m := p.Limits.MemoryBytes
		if r.Memory == nil {
			r.Memory = &specs.LinuxMemory{}
		}
		if r.Memory.Limit == nil || *r.Memory.Limit <= 0 || *r.Memory.Limit > m {
			r.Memory.Limit = &m
		}
		parts = append(parts, "memory "+strconv.FormatInt(*r.Memory.Limit, 10))
	}
	if p.Limits.CPUMillis > 0 {
		period := uint64(100000)
		quota := p.Limits.CPUMillis * 100
		if r.CPU == nil {
			r.CPU = &specs.LinuxCPU{}
		}
		if r.CPU.Quota == nil || *r.CPU.Quota <= 0 || r.CPU.Period == nil || *r.CPU.Quota*int64(period) > quota*int64(*r.CPU.Period) {
			r.CPU.Quota, r.CPU.Period = &quota, &period
		}
		parts = append(parts, fmt.Sprintf("cpu %d/%d", *r.CPU.Quota, *r.CPU.Period))
	}
	// maxProcesses is not mapped to linux.resources.pids: the host pids
	// cgroup counts the Sentry's host threads, not the sandbox's processes,
	// and a small limit kills the sandbox at boot (newosproc). gVisor
	// enforces RLIMIT_NPROC itself (see ApplyProcess).
	return "resources: " + strings.Join(parts, ", "), nil
}
