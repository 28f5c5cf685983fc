package policy

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/ocispec"
)

// Destinations of the bind mounts a container runtime adds for every
// container (CRI: hosts, hostname, resolv.conf, shm, termination log), with
// the base names their sources carry. They are kept, read-only where they
// are files, whatever the role's host mounts.
var systemMounts = map[string][]string{
	"/etc/hosts":           {"hosts", "etc-hosts"},
	"/etc/hostname":        {"hostname"},
	"/etc/resolv.conf":     {"resolv.conf"},
	"/dev/shm":             {"shm"},
	"/dev/termination-log": nil, // kubelet: /var/lib/kubelet/pods/<uid>/containers/...
}

// Service-account token mount points (kubelet projects the token here).
var serviceAccountDirs = []string{"/var/run/secrets/kubernetes.io", "/run/secrets/kubernetes.io"}

// SpecRewrites renders the profile as changes to a container's OCI spec.
// secrets maps each of the role's secret variables to its value, read from
// the node by the caller.
func (p *Profile) SpecRewrites(secrets map[string]string) []ocispec.Rewrite {
	return []ocispec.Rewrite{
		p.rewriteRootfs,
		p.rewriteMounts,
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
	if len(p.Process.DeniedSyscalls) > 0 {
		f["oci-seccomp"] = "true"
	}
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

func isBind(m specs.Mount) bool {
	if m.Type == "bind" || m.Type == "rbind" {
		return true
	}
	for _, o := range m.Options {
		if o == "bind" || o == "rbind" {
			return true
		}
	}
	return false
}

func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func withOption(opts []string, add string, drop ...string) []string {
	var out []string
	for _, o := range opts {
		keep := o != add
		for _, d := range drop {
			keep = keep && o != d
		}
		if keep {
			out = append(out, o)
		}
	}
	return append(out, add)
}

// rewriteMounts keeps the runtime's own mounts, removes service-account
// tokens the role does not allow, refuses host mounts outside the role's
// allowlist, adds the writable scratch directories and masks paths.
func (p *Profile) rewriteMounts(s *specs.Spec) (string, error) {
	var kept []specs.Mount
	var removed, refused []string
	writable := map[string]bool{}
	for _, w := range p.Filesystem.Writable {
		writable[w] = true
	}
	for _, m := range s.Mounts {
		dst := path.Clean(m.Destination)
		if writable[dst] {
			removed = append(removed, dst+" (replaced by scratch)")
			continue
		}
		if !isBind(m) {
			kept = append(kept, m)
			continue
		}
		if isServiceAccountMount(dst) {
			if !p.Credentials.ServiceAccountToken {
				removed = append(removed, dst+" (service-account token)")
				continue
			}
			m.Options = withOption(m.Options, "ro", "rw")
			kept = append(kept, m)
			continue
		}
		if bases, ok := systemMounts[dst]; ok && systemSource(m.Source, bases) {
			if dst != "/dev/shm" {
				m.Options = withOption(m.Options, "ro", "rw")
			}
			kept = append(kept, m)
			continue
		}
		hm, ok := p.hostMountFor(m.Source)
		if !ok {
			refused = append(refused, fmt.Sprintf("%s -> %s", m.Source, dst))
			continue
		}
		if *hm.ReadOnly {
			m.Options = withOption(m.Options, "ro", "rw")
		}
		kept = append(kept, m)
	}
	if len(refused) > 0 {
		allowed := "none"
		if len(p.Filesystem.HostMounts) > 0 {
			var ps []string
			for _, hm := range p.Filesystem.HostMounts {
				ps = append(ps, hm.Path)
			}
			allowed = strings.Join(ps, ", ")
		}
		return "", fmt.Errorf("host mounts not allowed by role %q: %s (the role allows: %s)", p.Role, strings.Join(refused, "; "), allowed)
	}
	for _, w := range p.Filesystem.Writable {
		opts := []string{"nosuid", "nodev", "mode=1777"}
		if p.Filesystem.NoExecWritable {
			opts = append(opts, "noexec")
		}
		kept = append(kept, specs.Mount{Destination: w, Type: "tmpfs", Source: "tmpfs", Options: opts})
	}
	s.Mounts = kept
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.MaskedPaths = appendMissing(s.Linux.MaskedPaths, p.Filesystem.MaskedPaths...)
	if len(removed) == 0 && len(p.Filesystem.Writable) == 0 {
		return "", nil
	}
	return fmt.Sprintf("mounts: scratch %v; removed %v", p.Filesystem.Writable, removed), nil
}

func isServiceAccountMount(dst string) bool {
	for _, d := range serviceAccountDirs {
		if under(dst, d) {
			return true
		}
	}
	return false
}

func systemSource(src string, bases []string) bool {
	if bases == nil {
		return under(src, "/var/lib/kubelet/pods")
	}
	b := path.Base(src)
	for _, want := range bases {
		if b == want {
			return true
		}
	}
	return false
}

func (p *Profile) hostMountFor(src string) (HostMount, bool) {
	src = path.Clean(src)
	for _, hm := range p.Filesystem.HostMounts {
		if under(src, hm.Path) {
			return hm, true
		}
	}
	return HostMount{}, false
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
			return "", fmt.Errorf("secret %s of role %q was not provided", sec.Env, p.Role)
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

// rewriteSeccomp adds the role's denied syscalls to the spec's seccomp
// profile (creating an allow-by-default one), enforced inside gVisor.
func (p *Profile) rewriteSeccomp(s *specs.Spec) (string, error) {
	if len(p.Process.DeniedSyscalls) == 0 {
		return "", nil
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Seccomp == nil {
		s.Linux.Seccomp = &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		}
	}
	deny := map[string]bool{}
	for _, n := range p.Process.DeniedSyscalls {
		deny[n] = true
	}
	// A syscall named twice with different actions is ambiguous: the role's
	// denial replaces what the spec said about it.
	var rules []specs.LinuxSyscall
	for _, sc := range s.Linux.Seccomp.Syscalls {
		var names []string
		for _, n := range sc.Names {
			if !deny[n] {
				names = append(names, n)
			}
		}
		if len(names) > 0 {
			sc.Names = names
			rules = append(rules, sc)
		}
	}
	names := append([]string(nil), p.Process.DeniedSyscalls...)
	sort.Strings(names)
	eperm := uint(1)
	rules = append(rules, specs.LinuxSyscall{Names: names, Action: specs.ActErrno, ErrnoRet: &eperm})
	s.Linux.Seccomp.Syscalls = rules
	return fmt.Sprintf("seccomp: deny %v", names), nil
}
