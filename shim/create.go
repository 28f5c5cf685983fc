package shim

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"
	task "github.com/containerd/containerd/api/runtime/task/v2"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"gvisor.dev/gvisor/pkg/shim/v1/utils"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/compile"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/oomadj"
	"agentbox.dev/agentbox/internal/policy"
)

// Create's agentbox part runs in three phases:
//
//   - resolve: the shim config, the spec, the agentbox.dev claims, and either
//     the pod's sandbox a container joins or, for a sandbox root, its audit
//     trail (opened first, so that a refusal is recorded too) and what the
//     runtime proves about its pod;
//   - compile: the one pure step the CLI's explain shares
//     (internal/compile), which selects the role and rewrites the spec;
//   - apply: egress rules and the resolver, the pod's resolv.conf, the
//     spec, runsc's root, the audit receiver and runsc's options.
//
// Each side effect pushes its own undo; a refusal, or runsc failing
// afterwards, unwinds them in reverse order.

// createPlan is a container's Create in progress.
type createPlan struct {
	cfg    *config.Config
	spec   *specs.Spec
	bundle string
	// claims are the spec's agentbox.dev/* annotations.
	claims map[string]string
	// request and policies select a sandbox root's role.
	request  policy.Request
	policies *policy.Set
	// profile is the container's; sandbox is set for a sandbox root, joins
	// names the sandbox otherwise.
	profile *policy.Profile
	sandbox *sandboxState
	joins   string
	// cgroupsPath is the container's linux.cgroupsPath.
	cgroupsPath string
	mounts      policy.MountEnv
	stager      *mountguard.Stager
	undo        []func(status string)
	// phases times Create (a bench trace; nil-safe).
	phases *phases
	// layers are the container's image layers, read when first needed.
	layers func() (mountguard.Layers, error)
}

// push adds an undo step; status says how the container ended
// ("refused", "failed to start", ...).
func (p *createPlan) push(f func(status string)) { p.undo = append(p.undo, f) }

// unwind runs the undo steps, last first, once.
func (p *createPlan) unwind(status string) {
	for i := len(p.undo) - 1; i >= 0; i-- {
		p.undo[i](status)
	}
	p.undo = nil
}

// prepare does the agentbox part of Create: resolve, compile, apply. On
// any error what was done is undone, and a sandbox root's trail records
// the refusal.
func (s *service) prepare(ctx context.Context, r *task.CreateTaskRequest, ph *phases) (_ *createPlan, retErr error) {
	plan := &createPlan{bundle: r.Bundle, stager: mountguard.New(r.Bundle), phases: ph}
	plan.push(func(string) { releaseMounts(ctx, plan.stager) })
	defer func() {
		if retErr != nil {
			s.recordRefusal(plan, retErr)
			plan.unwind("refused")
		}
	}()
	if err := s.resolve(ctx, r, plan); err != nil {
		return plan, err
	}
	ph.mark("resolve_mounts")
	sb := plan.sandbox
	if sb == nil {
		sb, _ = s.sandboxes.sandbox(plan.joins)
	}
	res, err := compile.Compile(compile.Input{
		Config: plan.cfg, Policies: plan.policies, Request: plan.request, Profile: plan.profile,
		Secrets: secretsFor(sb), Mounts: plan.mounts, OOMFloor: oomFloor(),
	}, plan.spec)
	if plan.profile == nil && res != nil && res.Profile != nil {
		s.resolved(plan, res.Profile)
	}
	if err != nil {
		if plan.profile == nil && plan.cfg != nil {
			err = policy.WithClusterRefusal(plan.cfg.Policy.Dir, plan.request.RoleName(), err)
		}
		return plan, err
	}
	ph.mark("compile")
	if sb := plan.sandbox; sb != nil && sb.restore == nil && res.Profile.Template != "" {
		// The role starts its sandboxes from a warmed checkpoint.
		if err := openRestore(plan.cfg, sb, res.Profile.Template, true); err != nil {
			return plan, err
		}
	}
	if sb := plan.sandbox; sb != nil && sb.restore != nil {
		if err := checkRestore(sb.restore, res.Profile, plan.request); err != nil {
			return plan, err
		}
	}
	return plan, s.apply(ctx, r, plan, res)
}

// oomFloor is the lowest oom_score_adj this host allows, when it refuses
// to go lower.
func oomFloor() *int {
	if adj := oomadj.Host(); adj.Refused != nil {
		return &adj.Floor
	}
	return nil
}

// resolve reads what the container is compiled from. For a sandbox root
// it opens the trail; for a joining container it finds the pod's sandbox.
func (s *service) resolve(ctx context.Context, r *task.CreateTaskRequest, plan *createPlan) error {
	cfgPath, named, err := configPathOf(r)
	if err != nil {
		return errkind.InvalidArgument(err)
	}
	if plan.cfg, err = config.Load(cfgPath, named); err != nil {
		return errkind.InvalidArgument(err)
	}
	cfg := plan.cfg
	if plan.spec, err = utils.ReadSpec(r.Bundle); err != nil {
		return fmt.Errorf("read OCI spec: %w", err)
	}
	plan.phases.mark("resolve_config_spec")
	spec := plan.spec
	if spec.Linux != nil {
		plan.cgroupsPath = spec.Linux.CgroupsPath
	}
	if plan.claims, err = agentboxAnnotations(spec.Annotations); err != nil {
		return errkind.InvalidArgument(err)
	}
	// Only containers in containerd's CRI namespace are pods: only they
	// bind by pod namespace and get their pod's files and volumes.
	inCRI := namespaceOf(ctx) == cfg.CRI.Namespace
	if sandboxID, joins := ocispec.IsSandboxContainerOf(spec); joins {
		// A container of a pod runs under the pod's profile; it may not
		// claim another.
		sb, ok := s.sandboxes.sandbox(sandboxID)
		if !ok {
			return errkind.NotFound(fmt.Errorf("sandbox %s is not served by this shim: its profile is unknown", sandboxID))
		}
		if !sameClaims(plan.claims, sb.claims) {
			return errkind.PermissionDenied(fmt.Errorf("container annotations %v differ from its pod's %v: a container runs under its pod's role", plan.claims, sb.claims))
		}
		plan.profile, plan.joins = sb.profile, sandboxID
		if sb.inCRI {
			plan.mounts = criMountEnv(cfg, r.Bundle, r.ID, sandboxID, sb.podUID)
		}
	} else {
		meta := audit.Meta{Sandbox: r.ID, Namespace: namespaceOf(ctx), PodNamespace: spec.Annotations[ocispec.SandboxNamespaceAnnotation], PodName: spec.Annotations[ocispec.SandboxNameAnnotation]}
		trail, err := openTrail(cfg, r.ID, meta)
		if err != nil {
			return err
		}
		plan.phases.mark("resolve_trail")
		plan.sandbox = &sandboxState{id: r.ID, cfg: cfg, claims: plan.claims, audit: &sandboxAudit{trail: trail}, started: time.Now()}
		plan.push(func(status string) { closeAudit(ctx, plan.sandbox.audit, status) })
		if name, ok := plan.claims[policy.RestoreAnnotation]; ok {
			// The image is checked, and the trail linked to its
			// checkpoint's, before anything else is done for the sandbox.
			if err := openRestore(cfg, plan.sandbox, name, false); err != nil {
				return err
			}
			plan.phases.mark("resolve_checkpoint")
		}
		if plan.policies, err = s.policies.Load(cfg.Policy.Dir); err != nil {
			return errkind.InvalidArgument(err)
		}
		plan.phases.mark("resolve_policies")
		plan.request = policy.Request{
			Annotations:         plan.claims,
			ContainerdNamespace: namespaceOf(ctx),
			Handler:             cfg.Policy.Handler,
			DefaultRole:         cfg.Policy.DefaultRole,
		}
		if inCRI && spec.Annotations[ocispec.ContainerTypeAnnotation] == ocispec.ContainerTypeSandbox {
			plan.sandbox.inCRI = true
			plan.request.PodNamespace = spec.Annotations[ocispec.SandboxNamespaceAnnotation]
			if plan.sandbox.podUID, err = ocispec.PodUID(spec); err != nil {
				return errkind.InvalidArgument(err)
			}
			plan.mounts = criMountEnv(cfg, r.Bundle, r.ID, r.ID, plan.sandbox.podUID)
		}
	}
	plan.mounts.Stage = plan.stager.Stage
	// What the agent must never reach, whatever a role's host mounts say:
	// the sandboxes' control and audit sockets, runsc's state, the trails.
	plan.mounts.Reserved = []string{cfg.Shim.ControlDir, cfg.Audit.SocketDir, cfg.RunscRoot(s.containerdAddress), cfg.Audit.Dir,
		cfg.Checkpoint.Dir, cfg.Checkpoint.KeyFile}
	if plan.mounts.MaskFile, err = mountguard.MaskFile(r.Bundle); err != nil {
		return err
	}
	plan.layers = sync.OnceValues(func() (mountguard.Layers, error) {
		var ms []mountguard.RootfsMount
		for _, m := range r.Rootfs {
			ms = append(ms, mountguard.RootfsMount{Type: m.Type, Source: m.Source, Options: m.Options})
		}
		return mountguard.LayersOf(r.Bundle, ms)
	})
	plan.mounts.Kind = pathKinds(plan.layers)
	if err := hostNamespaces(spec); err != nil {
		return errkind.PermissionDenied(err)
	}
	return nil
}

// resolved records the role a sandbox root runs under.
func (s *service) resolved(plan *createPlan, p *policy.Profile) {
	sb := plan.sandbox
	sb.profile, sb.request = p, plan.request
	trail := sb.audit.trail
	meta := audit.Meta{Sandbox: sb.id, Namespace: plan.request.ContainerdNamespace, PodNamespace: plan.spec.Annotations[ocispec.SandboxNamespaceAnnotation],
		PodName: plan.spec.Annotations[ocispec.SandboxNameAnnotation], Role: p.Role, PolicyDigest: p.Digest}
	trail.SetMeta(meta)
	trail.Emit(audit.TypeRoleResolved.New("Success",
		fmt.Sprintf("role %s (chain %s) for %s", p.Role, strings.Join(p.Chain, " -> "), plan.request.String()),
		map[string]string{"tightened": strings.Join(p.Tightened, ", ")}), true)
}

// recordRefusal writes a sandbox root's refusal into its trail.
func (s *service) recordRefusal(plan *createPlan, err error) {
	if plan.sandbox == nil {
		return
	}
	role := policy.Request{Annotations: plan.claims, DefaultRole: plan.cfg.Policy.DefaultRole}.RoleName()
	plan.sandbox.audit.trail.Emit(audit.TypeRefused.New("Failure", err.Error(), map[string]string{"requested_role": role}), true)
}

// apply does what the compiled result asks of the node, each step with its
// undo: egress rules and the resolver (sandbox roots), the pod's
// resolv.conf, the spec, runsc's root, the audit receiver and runsc's
// options.
func (s *service) apply(ctx context.Context, r *task.CreateTaskRequest, plan *createPlan, res *compile.Result) error {
	cfg, spec := plan.cfg, plan.spec
	plan.profile = res.Profile
	changes := res.Changes
	sb := plan.sandbox
	if sb != nil {
		// Egress rules and the resolver go in before runsc takes the pod's
		// interfaces over.
		plan.push(func(string) { removeEgress(ctx, sb) })
		if err := s.applyEgress(ctx, cfg, sb, res.Egress, spec); err != nil {
			return err
		}
		plan.phases.mark("egress")
	} else {
		sb, _ = s.sandboxes.sandbox(plan.joins)
	}
	if sb != nil && sb.dnsAddr.IsValid() {
		// Every container of the pod resolves through its resolver.
		more, err := ocispec.Apply(spec, resolvConfFor(r.Bundle, sb.dnsAddr))
		if err != nil {
			return err
		}
		changes = append(changes, more...)
		if names := sb.gatewayNames(); len(names) > 0 {
			// The host rules' names are the gateway's without asking the
			// resolver: no lookup round trip out of the sandbox.
			more, err := ocispec.Apply(spec, hostsFor(r.Bundle, sb.dnsAddr, names, plan.layers))
			if err != nil {
				return err
			}
			changes = append(changes, more...)
		}
	}
	if ca := sb.gatewayCA(); ca != nil {
		// Every container of the pod trusts the gateway's CA, after its
		// image's own roots.
		more, err := ocispec.Apply(spec, trustFor(r.Bundle, ca.PEM(), plan.layers))
		if err != nil {
			return err
		}
		changes = append(changes, more...)
	}
	if err := utils.WriteSpec(r.Bundle, spec); err != nil {
		return fmt.Errorf("write OCI spec: %w", err)
	}
	plan.phases.mark("write_spec")
	for _, c := range changes {
		log.G(ctx).Debugf("agentbox: spec: %s", c)
	}
	root := cfg.RunscRoot(s.containerdAddress)
	if err := os.MkdirAll(filepath.Join(root, namespaceOf(ctx)), 0o711); err != nil {
		return fmt.Errorf("create runsc root %s: %w", root, err)
	}
	flags := res.RunscFlags
	if plan.sandbox != nil && netnsPath(spec) == "" && flags["network"] == "" {
		// A new, empty network namespace (ctr run without --cni): nothing
		// outside to reach, and its loopback is down. gVisor's own
		// network stack gives the sandbox a working loopback.
		flags["network"] = "none"
		changes = append(changes, "runsc --network=none: the sandbox has no network namespace of its own (no CNI): loopback only, nothing to filter")
	}
	if plan.sandbox != nil {
		rcv, podInit, err := startReceiver(cfg, s.containerdAddress, r.ID, r.Bundle, plan.sandbox, res.Egress, res.Audit)
		if err != nil {
			return err
		}
		plan.sandbox.audit.receiver = rcv
		plan.sandbox.memoryLimit, plan.sandbox.cpuMillis = effectiveLimits(spec)
		flags["pod-init-config"] = podInit
		plan.phases.mark("audit_receiver")
		p := plan.profile
		plan.sandbox.audit.trail.Emit(audit.TypeProfileApplied.New("Success",
			fmt.Sprintf("rootfs %s, writable %v, egress %s, default uid %d, %d processes, %d bytes, wall clock %v", p.Filesystem.Rootfs, p.Filesystem.Writable, p.Network.Egress, p.Process.RunAsUser, p.Process.MaxProcesses, p.Limits.MemoryBytes, p.Limits.WallClock),
			map[string]string{"spec_changes": joinChanges(changes), "runsc_flags": fmt.Sprint(flags)}), true)
	}
	optsPath := filepath.Join(r.Bundle, runscOptionsFile)
	if err := writeRunscOptions(optsPath, cfg, root, flags); err != nil {
		return err
	}
	any, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{TypeUrl: runtimeOptionsTypeURL, ConfigPath: optsPath})
	if err != nil {
		return fmt.Errorf("marshal runsc options: %w", err)
	}
	r.Options = any
	plan.phases.mark("runsc_options")
	return nil
}

// effectiveLimits are the memory limit (bytes) and CPU limit (millicores)
// a sandbox root's spec asks runsc for: its role's, or the pod's own when
// lower (0: none).
func effectiveLimits(spec *specs.Spec) (memory, cpuMillis int64) {
	if spec.Linux == nil || spec.Linux.Resources == nil {
		return 0, 0
	}
	r := spec.Linux.Resources
	if r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 {
		memory = *r.Memory.Limit
	}
	if r.CPU != nil && r.CPU.Quota != nil && r.CPU.Period != nil && *r.CPU.Quota > 0 && *r.CPU.Period > 0 {
		cpuMillis = *r.CPU.Quota * 1000 / int64(*r.CPU.Period)
	}
	return memory, cpuMillis
}

// resolvConfFor returns the rewrite that writes the container's resolv.conf
// (naming the pod's resolver, keeping the pod's search and options) into
// its bundle and mounts it. It runs after the mounts were checked and
// staged, so the pod's resolv.conf it reads is the one that was checked.
func resolvConfFor(bundle string, resolver netip.Addr) ocispec.Rewrite {
	return func(spec *specs.Spec) (string, error) {
		var original []byte
		if src := ocispec.ResolvConfSource(spec); src != "" {
			b, err := readSmallFile(src, 64<<10)
			if err != nil && !os.IsNotExist(err) {
				return "", fmt.Errorf("read the pod's resolv.conf: %w", err)
			}
			original = b
		}
		path := filepath.Join(bundle, resolvConfFile)
		if err := os.WriteFile(path, dnsproxy.ResolvConf(original, resolver), 0o644); err != nil {
			return "", fmt.Errorf("write resolv.conf: %w", err)
		}
		return ocispec.MountResolvConf(path)(spec)
	}
}

// hostsFor writes the container's /etc/hosts into its bundle, the pod's
// own (the runtime's mount, else the image's) with the host rules' exact
// names mapped to the gateway, and mounts it read-only in place of any
// other.
func hostsFor(bundle string, gateway netip.Addr, names []string, layers func() (mountguard.Layers, error)) ocispec.Rewrite {
	return func(spec *specs.Spec) (string, error) {
		var original []byte
		from := "localhost only"
		if src := ocispec.MountSource(spec, ocispec.HostsPath); src != "" {
			b, err := readSmallFile(src, maxHostsFile)
			if err != nil && !os.IsNotExist(err) {
				return "", fmt.Errorf("read the pod's hosts file: %w", err)
			}
			original, from = b, src
		} else if l, err := layers(); err == nil {
			if b, err := l.ReadFile(ocispec.HostsPath, maxHostsFile); err == nil {
				original, from = b, "the image's "+ocispec.HostsPath
			}
		}
		path := filepath.Join(bundle, hostsFile)
		if err := os.WriteFile(path, dnsproxy.Hosts(original, gateway, names), 0o644); err != nil {
			return "", fmt.Errorf("write the hosts file: %w", err)
		}
		if _, err := ocispec.MountFile(ocispec.HostsPath, path)(spec); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: %s with the host rules' names at the egress gateway %s, mounted read-only", ocispec.HostsPath, from, gateway), nil
	}
}

// hostsFile is the hosts file the shim writes into a bundle; maxHostsFile
// bounds the pod's or image's it starts from.
const (
	hostsFile    = "agentbox-hosts"
	maxHostsFile = 1 << 20
)

// pathKinds says what masked paths are at start: beneath a staged bind
// source, or in the container's image layers (read when first needed:
// the runtime's own masked paths are all gVisor's).
func pathKinds(layers func() (mountguard.Layers, error)) func(root, rel string) (policy.PathKind, string, error) {
	return func(root, rel string) (policy.PathKind, string, error) {
		if root != "" {
			k, err := mountguard.KindBeneath(root, rel)
			return k, "", err
		}
		l, err := layers()
		if err != nil {
			return 0, "", fmt.Errorf("cannot tell what it is in the image: %w", err)
		}
		return l.Lookup(rel)
	}
}

// criMountEnv is where the runtime made this pod's files: containerd's CRI
// directories for its sandbox id and for the container's own id, the
// kubelet's for the pod's UID.
func criMountEnv(cfg *config.Config, bundle, containerID, sandboxID, podUID string) policy.MountEnv {
	const cri = "io.containerd.grpc.v1.cri"
	env := policy.MountEnv{
		SandboxRootDir: filepath.Join(cfg.CRI.ContainerdRoot, cri, "sandboxes", sandboxID),
		ContainerDir:   filepath.Join(cfg.CRI.ContainerdRoot, cri, "containers", containerID),
	}
	state := cfg.CRI.ContainerdState
	if state == "" {
		// containerd puts bundles at STATE/io.containerd.runtime.v2.task/NS/ID.
		if tasks := filepath.Dir(filepath.Dir(bundle)); filepath.Base(tasks) == "io.containerd.runtime.v2.task" {
			state = filepath.Dir(tasks)
		}
	}
	if state != "" {
		env.SandboxStateDir = filepath.Join(state, cri, "sandboxes", sandboxID)
	}
	if podUID != "" {
		env.PodDir = filepath.Join(cfg.CRI.KubeletRoot, "pods", podUID)
	}
	return env
}

// hostNamespaces refuses a container that joins one of the shim's own (the
// host's) network, PID or IPC namespaces by path. A missing namespace is
// the policy's to refuse (checkHostOptions).
func hostNamespaces(spec *specs.Spec) error {
	if spec.Linux == nil {
		return nil
	}
	for _, ns := range spec.Linux.Namespaces {
		var own string
		switch ns.Type {
		case specs.NetworkNamespace:
			own = "/proc/self/ns/net"
		case specs.PIDNamespace:
			own = "/proc/self/ns/pid"
		case specs.IPCNamespace:
			own = "/proc/self/ns/ipc"
		default:
			continue
		}
		if ns.Path == "" {
			continue
		}
		var a, b unix.Stat_t
		if err := unix.Stat(ns.Path, &a); err != nil {
			return fmt.Errorf("linux.namespaces: %s namespace %s: %w", ns.Type, ns.Path, err)
		}
		if err := unix.Stat(own, &b); err == nil && a.Dev == b.Dev && a.Ino == b.Ino {
			return fmt.Errorf("linux.namespaces: %s namespace %s is the host's: agentbox does not run pods in the host's namespaces", ns.Type, ns.Path)
		}
	}
	return nil
}

// releaseMounts unmounts a container's staged mounts.
func releaseMounts(ctx context.Context, st *mountguard.Stager) {
	if err := mountguard.Release(st.Dir()); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: releasing staged mounts")
	}
}

// readSmallFile reads a regular file of at most limit bytes. The path comes
// from a spec: a FIFO or device there must not hang or flood the shim.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s is over %d bytes", path, limit)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// resolvConfFile is the resolv.conf the shim writes into a bundle.
const resolvConfFile = "agentbox-resolv.conf"

func netnsPath(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// agentboxAnnotations returns the agentbox.dev/* annotations. A key that
// is agentbox.dev/ in another case is refused: it would otherwise be
// ignored, and the pod run looser than its author meant.
func agentboxAnnotations(ann map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range ann {
		if strings.HasPrefix(k, policy.AnnotationPrefix) {
			out[k] = v
		} else if strings.HasPrefix(strings.ToLower(k), policy.AnnotationPrefix) {
			return nil, fmt.Errorf("annotation %s: agentbox reads %s* keys in lower case only", k, policy.AnnotationPrefix)
		}
	}
	return out, nil
}

func sameClaims(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// configPathOf returns the config file containerd named for this container,
// or config.UnnamedPath() when it named none.
func configPathOf(r *task.CreateTaskRequest) (path string, named bool, err error) {
	if r.Options == nil || len(r.Options.GetValue()) == 0 && r.Options.GetTypeUrl() == "" {
		return config.UnnamedPath(), false, nil
	}
	if r.Options.GetTypeUrl() != runtimeOptionsTypeURL {
		return "", false, fmt.Errorf("unsupported runtime options type %q: agentbox takes %q with a ConfigPath (ctr --runtime-config-path, CRI options.ConfigPath)", r.Options.GetTypeUrl(), runtimeOptionsTypeURL)
	}
	var o runtimeoptions.Options
	if err := proto.Unmarshal(r.Options.GetValue(), &o); err != nil {
		return "", false, fmt.Errorf("decode runtime options: %w", err)
	}
	if o.ConfigPath == "" {
		return config.UnnamedPath(), false, nil
	}
	return o.ConfigPath, true, nil
}

// gvisorOptions mirrors the fields of gVisor's runsc.Options that the shim
// sets; gVisor's task service reads them back from the file.
type gvisorOptions struct {
	BinaryName  string            `toml:"binary_name"`
	Root        string            `toml:"root"`
	LogLevel    string            `toml:"log_level,omitempty"`
	RunscConfig map[string]string `toml:"runsc_config,omitempty"`
}

func writeRunscOptions(path string, cfg *config.Config, root string, flags map[string]string) error {
	b, err := toml.Marshal(gvisorOptions{
		BinaryName:  cfg.Runsc.Binary,
		Root:        root,
		LogLevel:    cfg.Shim.LogLevel,
		RunscConfig: flags,
	})
	if err != nil {
		return fmt.Errorf("encode runsc options: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write runsc options: %w", err)
	}
	return nil
}
