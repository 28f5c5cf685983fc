package policy

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"agentbox.dev/agentbox/internal/errkind"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Mount validation from first principles. A bind mount is accepted only
// when its source provably is something the runtime made for this very
// container, or lies under one of the role's host mounts:
//
//   - containerd's CRI files of this pod's sandbox (hosts, hostname,
//     resolv.conf in its root directory, shm in its state directory), at
//     their own destinations, and the image VOLUMEs it made for this very
//     container;
//   - the kubelet's directory of this pod's UID: its volumes (emptyDir,
//     configMap, secret, downwardAPI, projected), subPaths, termination
//     message files and etc-hosts;
//   - the role's hostMounts.
//
// The classification here is pure and works on clean absolute paths only
// (a source with "." or ".." components, or "//", is refused). It names,
// for each accepted bind, the trusted directory (Root) and the path below
// it (Rel). The shim then resolves Rel beneath Root without following any
// symlink and mounts exactly the file it opened (MountEnv.Stage), so what
// was checked is what is mounted.

// MountEnv is what the runtime proved about a container's mounts. The zero
// value is a container outside the CRI: only the role's host mounts.
type MountEnv struct {
	// SandboxRootDir and SandboxStateDir are containerd's CRI directories
	// for this container's sandbox id; ContainerDir its directory for this
	// container's own id (the image's VOLUMEs).
	SandboxRootDir, SandboxStateDir, ContainerDir string
	// PodDir is the kubelet's directory for this pod's UID.
	PodDir string
	// Stage resolves and mounts an accepted bind and returns the path the
	// spec names instead. nil keeps the sources (policy explain).
	Stage func(Bind) (string, error)
	// Kind says what rel is beneath root (a host path: a staged bind
	// source) without following symlinks. For root "" it looks rel up in
	// the container's image, and where a symlink leads elsewhere it
	// returns that path (absolute, inside the container) as next instead.
	// nil leaves masked paths listed in the spec (policy explain).
	Kind func(root, rel string) (kind PathKind, next string, err error)
	// MaskFile is an empty read-only file bound over masked files.
	MaskFile string
	// Reserved are the node's directories no host mount may reach, even
	// one a role allows (the sandboxes' control and audit sockets, runsc's
	// state): a bind of one of them, below one, or above one is refused.
	Reserved []string
}

// Bind is an accepted bind mount: its source is Root/Rel.
type Bind struct {
	Destination string
	Source      string
	// Root is the trusted directory the source must lie beneath; Rel is
	// the source below it ("" for Root itself).
	Root, Rel string
	// Kind is "file", "dir" or "" (either).
	Kind string
	// Origin says why it was accepted, for records and errors.
	Origin    string
	ReadOnly  bool
	NoExec    bool
	Recursive bool
}

// CRI sandbox files: the destination each belongs at, and its kind.
var criSandboxFiles = map[string]string{
	"/etc/hosts":       "hosts",
	"/etc/hostname":    "hostname",
	"/etc/resolv.conf": "resolv.conf",
}

// Kubelet volume plugins whose directories are the pod's own.
var kubeletVolumes = map[string]string{
	"kubernetes.io~empty-dir":    "emptyDir",
	"kubernetes.io~configmap":    "configMap",
	"kubernetes.io~secret":       "secret",
	"kubernetes.io~downward-api": "downwardAPI",
	"kubernetes.io~projected":    "projected",
}

// Service-account token mount points (kubelet projects the token here).
var serviceAccountDirs = []string{"/var/run/secrets/kubernetes.io", "/run/secrets/kubernetes.io"}

// The mounts a runtime adds that are not binds: type and destination.
// Anything else that is not a bind is refused.
var runtimeFilesystems = map[string][]string{
	"proc":    {"/proc"},
	"sysfs":   {"/sys"},
	"tmpfs":   {"/dev", "/dev/shm", "/run"},
	"devpts":  {"/dev/pts"},
	"mqueue":  {"/dev/mqueue"},
	"cgroup":  {"/sys/fs/cgroup"},
	"cgroup2": {"/sys/fs/cgroup"},
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

func isRecursive(m specs.Mount) bool {
	if m.Type == "rbind" {
		return true
	}
	for _, o := range m.Options {
		if o == "rbind" {
			return true
		}
	}
	return false
}

func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// rel returns p below dir ("" for dir itself); p must be under dir.
func rel(p, dir string) string {
	if p == dir {
		return ""
	}
	return strings.TrimPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func isClean(p string) bool { return path.IsAbs(p) && path.Clean(p) == p }

func hasOption(opts []string, o string) bool {
	for _, v := range opts {
		if v == o {
			return true
		}
	}
	return false
}

// withOptions returns opts with each of add present and each of drop gone.
func withOptions(opts []string, add []string, drop ...string) []string {
	gone := map[string]bool{}
	for _, d := range drop {
		gone[d] = true
	}
	for _, a := range add {
		gone[a] = true
	}
	var out []string
	for _, o := range opts {
		if !gone[o] {
			out = append(out, o)
		}
	}
	return append(out, add...)
}

func isServiceAccountMount(dst string) bool {
	for _, d := range serviceAccountDirs {
		if under(dst, d) {
			return true
		}
	}
	return false
}

// execAllowed reports whether the role lets files under dst run.
func (p *Profile) execAllowed(dst string) bool {
	for _, e := range p.Filesystem.AllowExec {
		if under(dst, e) {
			return true
		}
	}
	return false
}

// classifyBind decides whether a bind mount's source is one the runtime
// made for this container, or one the role allows. It returns the bind, or
// a reason for refusing it.
func (p *Profile) classifyBind(m specs.Mount, env MountEnv) (Bind, string) {
	src, dst := m.Source, m.Destination
	// "rro" (recursive read-only, as the CRI asks for it) is read-only too:
	// the staged mount is made read-only recursively (mount_setattr with
	// AT_RECURSIVE), and gVisor's gofer serves it read-only.
	b := Bind{Destination: dst, Source: src, Recursive: isRecursive(m), ReadOnly: hasOption(m.Options, "ro") || hasOption(m.Options, "rro")}
	if !isClean(src) {
		return b, fmt.Sprintf("source %q is not a clean absolute path", src)
	}
	switch {
	case env.SandboxRootDir != "" && under(src, env.SandboxRootDir):
		name := rel(src, env.SandboxRootDir)
		if criSandboxFiles[dst] != name {
			return b, fmt.Sprintf("%s is containerd's file for this pod, but not the one that belongs at %s", src, dst)
		}
		b.Root, b.Rel, b.Kind, b.Origin, b.ReadOnly = env.SandboxRootDir, name, "file", "pod "+name, true
	case env.SandboxStateDir != "" && under(src, env.SandboxStateDir):
		if dst != "/dev/shm" || rel(src, env.SandboxStateDir) != "shm" {
			return b, fmt.Sprintf("%s is containerd's state of this pod, but only its shm belongs at /dev/shm", src)
		}
		b.Root, b.Rel, b.Kind, b.Origin, b.ReadOnly = env.SandboxStateDir, "shm", "dir", "pod shm", false
	case env.ContainerDir != "" && under(src, env.ContainerDir):
		r := rel(src, env.ContainerDir)
		parts := strings.Split(r, "/")
		if len(parts) != 2 || parts[0] != "volumes" {
			return b, fmt.Sprintf("%s is containerd's directory for this container, but not one of its image volumes", src)
		}
		b.Root, b.Rel, b.Kind, b.Origin = env.ContainerDir, r, "dir", "image volume "+parts[1]
	case env.PodDir != "" && under(src, env.PodDir):
		r := rel(src, env.PodDir)
		parts := strings.Split(r, "/")
		b.Root, b.Rel = env.PodDir, r
		switch {
		case len(parts) >= 3 && parts[0] == "volumes":
			kind, ok := kubeletVolumes[parts[1]]
			if !ok {
				return b, fmt.Sprintf("%s is a %s volume of this pod; agentbox accepts emptyDir, configMap, secret, downwardAPI and projected volumes", src, parts[1])
			}
			if kind == "projected" && !p.Credentials.ServiceAccountToken {
				return b, fmt.Sprintf("%s is a projected volume, which can carry a service-account token, and role %q does not allow one (credentials.serviceAccountToken)", src, p.Role)
			}
			b.Origin = kind + " volume " + parts[2]
		case len(parts) >= 2 && parts[0] == "volume-subpaths":
			b.Origin = "subPath of volume " + parts[1]
		case len(parts) == 3 && parts[0] == "containers":
			b.Kind, b.Origin, b.ReadOnly = "file", "termination message of container "+parts[1], false
		case r == "etc-hosts" && dst == "/etc/hosts":
			b.Kind, b.Origin, b.ReadOnly = "file", "pod etc-hosts", true
		default:
			return b, fmt.Sprintf("%s is in this pod's kubelet directory but is not a volume, subPath, termination message or etc-hosts", src)
		}
	default:
		for _, hm := range p.Filesystem.HostMounts {
			if under(src, hm.Path) {
				for _, r := range env.Reserved {
					if under(src, r) || under(r, src) {
						return b, fmt.Sprintf("%s reaches %s, which holds the node's sandbox sockets, runsc's state, trails or checkpoints: no host mount may, whatever the role's hostMounts (%s) allow", src, r, hm.Path)
					}
				}
				b.Root, b.Rel, b.Origin = hm.Path, rel(src, hm.Path), "host mount "+hm.Path
				b.ReadOnly = b.ReadOnly || *hm.ReadOnly
				return b, ""
			}
		}
		return b, "not a mount the runtime made for this pod, nor under the role's host mounts" + rootHint(src, env)
	}
	return b, ""
}

// rootHint says, for a source that looks like containerd's or the
// kubelet's files for a pod but lies outside the directories the shim
// config names, which key to set: k3s, RKE2 and MicroK8s keep containerd
// elsewhere. It only explains; the mount is refused either way.
func rootHint(src string, env MountEnv) string {
	const cri = "/io.containerd.grpc.v1.cri/"
	if i := strings.Index(src, cri); i > 0 {
		configured := "(unset)"
		if j := strings.Index(env.SandboxRootDir, cri); j > 0 {
			configured = env.SandboxRootDir[:j]
		}
		if configured == src[:i] {
			return "" // this containerd's: another pod's or container's
		}
		return fmt.Sprintf(" (it looks like containerd's CRI files under %s, but the shim config's [cri] containerd_root is %s: set containerd_root, or containerd_state for a state directory, to this containerd's)", src[:i], configured)
	}
	if i := strings.Index(src, "/pods/"); i > 0 && env.PodDir != "" && !strings.HasPrefix(src, filepath.Dir(env.PodDir)+"/") {
		return fmt.Sprintf(" (it looks like a kubelet's pod directory under %s, but the shim config's [cri] kubelet_root is %s: set kubelet_root to this kubelet's --root-dir)", src[:i], filepath.Dir(filepath.Dir(env.PodDir)))
	}
	return ""
}

// rewriteMounts keeps the runtime's own mounts, removes service-account
// tokens the role does not allow, refuses every other mount that is not
// the pod's own or under the role's host mounts, stages the accepted binds,
// makes every writable place noexec (unless the role allows exec there),
// adds the writable scratch directories and masks paths.
func (p *Profile) rewriteMounts(env MountEnv) func(s *specs.Spec) (string, error) {
	return func(s *specs.Spec) (string, error) {
		var kept []specs.Mount
		var removed, refused, staged []string
		writable := map[string]bool{}
		for _, w := range p.Filesystem.Writable {
			writable[w] = true
		}
		for i, m := range s.Mounts {
			dst := m.Destination
			if !isClean(dst) {
				refused = append(refused, fmt.Sprintf("mounts[%d]: destination %q is not a clean absolute path", i, dst))
				continue
			}
			if writable[dst] {
				removed = append(removed, dst+" (replaced by scratch)")
				continue
			}
			if !isBind(m) {
				m, why := p.runtimeFilesystem(m)
				if why != "" {
					refused = append(refused, fmt.Sprintf("mounts[%d]: %s at %s: %s", i, m.Type, dst, why))
					continue
				}
				kept = append(kept, m)
				continue
			}
			if isServiceAccountMount(dst) && !p.Credentials.ServiceAccountToken {
				removed = append(removed, dst+" (service-account token)")
				continue
			}
			b, why := p.classifyBind(m, env)
			if why != "" {
				refused = append(refused, fmt.Sprintf("%s -> %s: %s", m.Source, dst, why))
				continue
			}
			b.NoExec = !b.ReadOnly && !p.execAllowed(dst)
			opts := []string{"nosuid", "nodev"}
			drop := []string{"suid", "dev", "exec", "noexec", "ro", "rw", "rro"}
			if b.ReadOnly {
				opts = append(opts, "ro")
			} else if b.NoExec {
				opts = append(opts, "noexec")
			}
			m.Options = withOptions(m.Options, opts, drop...)
			if env.Stage != nil {
				src, err := env.Stage(b)
				if err != nil {
					refused = append(refused, fmt.Sprintf("%s -> %s: %v", m.Source, dst, err))
					continue
				}
				m.Source = src
				staged = append(staged, fmt.Sprintf("%s (%s)", dst, b.Origin))
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
			return "", errkind.PermissionDenied(fmt.Errorf("mounts not allowed by role %q: %s (the role's host mounts: %s)", p.Role, strings.Join(refused, "; "), allowed))
		}
		for _, w := range p.Filesystem.Writable {
			opts := []string{"nosuid", "nodev", "mode=1777"}
			if p.Filesystem.NoExecWritable && !p.execAllowed(w) {
				opts = append(opts, "noexec")
			}
			kept = append(kept, specs.Mount{Destination: w, Type: "tmpfs", Source: "tmpfs", Options: opts})
		}
		s.Mounts = kept
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		s.Linux.MaskedPaths = appendMissing(s.Linux.MaskedPaths, p.Filesystem.MaskedPaths...)
		maskMsg, err := maskPaths(s, env)
		if err != nil {
			return "", err
		}
		roMsg, err := readonlyPaths(s)
		if err != nil {
			return "", err
		}
		var msgs []string
		if len(removed) > 0 || len(p.Filesystem.Writable) > 0 || len(staged) > 0 {
			msg := fmt.Sprintf("mounts: scratch %v; removed %v", p.Filesystem.Writable, removed)
			if len(staged) > 0 {
				msg += fmt.Sprintf("; staged %v", staged)
			}
			msgs = append(msgs, msg)
		}
		for _, m := range []string{maskMsg, roMsg} {
			if m != "" {
				msgs = append(msgs, m)
			}
		}
		return strings.Join(msgs, "; "), nil
	}
}

// runtimeFilesystem accepts the non-bind mounts a runtime adds, at their
// usual places, hardened: nosuid and nodev always, sysfs and cgroup
// read-only, and the writable ones (shm, mqueue) noexec.
func (p *Profile) runtimeFilesystem(m specs.Mount) (specs.Mount, string) {
	ok := false
	for _, d := range runtimeFilesystems[m.Type] {
		ok = ok || d == m.Destination
	}
	if !ok {
		return m, "not a mount a runtime adds (agentbox accepts proc at /proc, sysfs at /sys, tmpfs at /dev, /dev/shm and /run, devpts at /dev/pts, mqueue at /dev/mqueue, cgroup at /sys/fs/cgroup; scratch comes from the role's filesystem.writable)"
	}
	opts := []string{"nosuid", "nodev"}
	drop := []string{"suid", "dev", "exec"}
	switch {
	case m.Type == "sysfs" || m.Type == "cgroup" || m.Type == "cgroup2":
		opts = append(opts, "ro")
		drop = append(drop, "rw")
	case m.Type == "proc" || m.Destination == "/dev":
		// /dev is gVisor's own device filesystem, proc its own.
	case !p.execAllowed(m.Destination):
		opts = append(opts, "noexec")
	}
	m.Options = withOptions(m.Options, opts, drop...)
	return m, ""
}
