package policy

import (
	"agentbox.dev/agentbox/internal/errkind"
	"fmt"
	"strconv"
	"strings"

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
	if p.Network.Egress == EgressNone {
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
	ro := p.Filesystem.Rootfs == RootfsReadOnly
	if s.Root.Readonly == ro {
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

// ApplyProcess narrows a process (a container's, or an exec's) to the
// profile: identity, capabilities, no_new_privs, rlimits and environment.
func (p *Profile) ApplyProcess(proc *specs.Process, secrets map[string]string) (string, error) {
	proc.User = specs.User{UID: p.Process.RunAsUser, GID: p.Process.RunAsGroup}
	caps := append([]string(nil), p.Process.Capabilities...)
	proc.Capabilities = &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps,
		// Ambient (and so Inheritable) lets a non-root agent actually hold
		// the capabilities its role grants.
		Inheritable: caps, Ambient: caps,
	}
	proc.NoNewPrivileges = true
	proc.Rlimits = setRlimit(proc.Rlimits, "RLIMIT_NPROC", uint64(p.Process.MaxProcesses))
	proc.Rlimits = setRlimit(proc.Rlimits, "RLIMIT_NOFILE", uint64(p.Limits.OpenFiles))
	if p.Limits.CPUTimeSeconds > 0 {
		proc.Rlimits = setRlimit(proc.Rlimits, "RLIMIT_CPU", uint64(p.Limits.CPUTimeSeconds))
	}
	env, dropped := p.FilterEnv(proc.Env)
	for _, sec := range p.Credentials.Secrets {
		v, ok := secrets[sec.Env]
		if !ok {
			return "", errkind.FailedPrecondition(fmt.Errorf("secret %s of role %q was not provided", sec.Env, p.Role))
		}
		env = setEnv(env, sec.Env, v)
	}
	proc.Env = env
	return fmt.Sprintf("process: uid %d gid %d caps %v nproc %d nofile %d; env dropped %v", p.Process.RunAsUser, p.Process.RunAsGroup, caps, p.Process.MaxProcesses, p.Limits.OpenFiles, dropped), nil
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

func setRlimit(rl []specs.POSIXRlimit, typ string, v uint64) []specs.POSIXRlimit {
	out := rl[:0:0]
	for _, r := range rl {
		if r.Type != typ {
			out = append(out, r)
		}
	}
	return append(out, specs.POSIXRlimit{Type: typ, Hard: v, Soft: v})
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
