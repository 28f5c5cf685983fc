// Package shim is the agentbox containerd shim: gVisor's runsc task service,
// wrapped by a layer that resolves the shim configuration, rewrites each
// container's OCI spec before runsc sees it, and repairs what the stock
// gVisor shim gets wrong on hosts like ours (see the field notes in README).
package shim

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/pkg/sys/reaper"
	errgrpc "github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/pelletier/go-toml/v2"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
	"gvisor.dev/gvisor/pkg/shim/v1/utils"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/hostexec"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/oomadj"
	"agentbox.dev/agentbox/internal/policy"
)

// RuntimeName is the containerd runtime type this shim serves.
const RuntimeName = "io.containerd.agentbox.v1"

// runscOptionsFile is the gVisor-format options file the shim derives from
// the agentbox config and writes into each bundle.
const runscOptionsFile = "agentbox-runsc.toml"

// runtimeOptionsTypeURL is the type of containerd's runtime options that
// carry a ConfigPath (ctr --runtime-config-path, CRI options.ConfigPath).
const runtimeOptionsTypeURL = "runtimeoptions.v1.Options"

// service is the agentbox task service. It forwards every call to gVisor's
// runsc task service (next) and adds its own work around Create and Delete.
type service struct {
	next  extension.TaskServiceExt
	exits *exitRepair
	// containerdAddress identifies the containerd instance this shim serves.
	containerdAddress string

	sd shutdown.Service
	// shimCtx is the shim's own context, for work no request started.
	shimCtx context.Context

	policies  policy.Cache
	sandboxes *sandboxRegistry
	// stagers holds each created container's staged mounts (id to
	// *mountguard.Stager), released at Delete.
	stagers sync.Map
}

var _ cdshim.TTRPCService = (*service)(nil)
var _ task.TaskService = (*service)(nil)

// New builds the agentbox task service on top of gVisor's runsc task service.
func New(ctx context.Context, publisher cdshim.Publisher, sd shutdown.Service) (*service, error) {
	s := &service{exits: newExitRepair(), sd: sd, shimCtx: ctx, sandboxes: newRegistry()}
	s.exits.adjust = s.adjustExit
	if f := flag.Lookup("address"); f != nil {
		s.containerdAddress = f.Value.String()
	}
	// nsenter, ip and nft are children of this subreaper too.
	hostexec.SetRunner(runReaped)
	reaped := reaper.Default.Subscribe()
	err := s.exits.install(func() error {
		var err error
		s.next, err = runsc.NewTaskService(ctx, &auditingPublisher{Publisher: publisher, s: s}, sd)
		return err
	}, reaped)
	if err != nil {
		reaper.Default.Unsubscribe(reaped)
		sd.Shutdown()
		return nil, err
	}
	if adj := oomadj.Host(); adj.Refused != nil {
		log.G(ctx).WithError(adj.Refused).Warnf("agentbox: this host refuses to lower oom_score_adj: the shim keeps %d and containers asking for less get %d", adj.Floor, adj.Floor)
	}
	if address, _ := cdshim.ReadAddress("address"); address != "" {
		sd.RegisterCallback(func(context.Context) error {
			return cdshim.RemoveSocket(address)
		})
	}
	return s, nil
}

// runReaped runs a command through containerd's reaper, which the shim's
// SIGCHLD handler feeds: a plain exec.Cmd.Wait races the handler for the
// child's exit status.
func runReaped(cmd *exec.Cmd) error {
	ec, err := reaper.Default.Start(cmd)
	if err != nil {
		return err
	}
	status, err := reaper.Default.Wait(cmd, ec)
	if err != nil {
		return err
	}
	if status != 0 {
		return fmt.Errorf("exit status %d", status)
	}
	return nil
}

// RegisterTTRPC implements shim.TTRPCService.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	task.RegisterTaskService(server, s)
	return nil
}

// WallClockExitStatus is the exit status of a container stopped because its
// sandbox reached the role's wall-clock limit, as timeout(1) reports it:
// distinct from 137, a kill by someone else.
const WallClockExitStatus = 124

// Create resolves the shim config and the container's role, rewrites the
// bundle's spec to the role's profile, points gVisor at a runsc options file
// derived from both, then creates the container. Any failure refuses the
// container (fail closed) with the reason.
func (s *service) Create(ctx context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("container_id", r.ID))
	plan, err := s.prepare(ctx, r)
	if err != nil {
		log.G(ctx).WithError(err).Error("agentbox: container refused")
		return nil, errgrpc.ToGRPC(fmt.Errorf("agentbox: container %s refused: %w", r.ID, err))
	}
	resp, err := s.next.Create(ctx, r)
	if err != nil {
		releaseMounts(ctx, plan.stager)
		if plan.sandbox != nil {
			// runsc leaves a failed sandbox's cgroup behind.
			if cerr := cgroups.Remove(cgroups.Root, plan.cgroupsPath); cerr != nil {
				log.G(ctx).WithError(cerr).Warn("agentbox: cleaning up the failed sandbox's cgroup")
			}
			plan.sandbox.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", err.Error(), nil), true)
			removeEgress(ctx, plan.sandbox)
			closeAudit(ctx, plan.sandbox.audit, "failed to start")
		} else {
			s.record(plan.joins, audit.TypeContainerFailed.New("Failure", err.Error(), map[string]string{"container_id": r.ID}), true)
		}
		return nil, errgrpc.ToGRPC(err)
	}
	if plan.sandbox != nil {
		// runsc boots a sandbox whose trace session failed, with a warning:
		// refuse it here instead of running it unaudited.
		if !plan.sandbox.audit.receiver.Live() {
			err := fmt.Errorf("agentbox: container %s refused: gVisor's audit session is not established (see runsc's log)", r.ID)
			s.next.Kill(ctx, &task.KillRequest{ID: r.ID, Signal: uint32(unix.SIGKILL), All: true})
			s.next.Delete(ctx, &task.DeleteRequest{ID: r.ID})
			removeEgress(ctx, plan.sandbox)
			releaseMounts(ctx, plan.stager)
			plan.sandbox.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", err.Error(), nil), true)
			closeAudit(ctx, plan.sandbox.audit, "audit session failed")
			return nil, errgrpc.ToGRPC(err)
		}
		s.sandboxes.addSandbox(plan.sandbox)
		s.exits.track(r.ID, int(resp.Pid))
		s.watchFull(plan.cfg, plan.sandbox)
	} else {
		s.sandboxes.join(plan.joins, r.ID)
		s.record(r.ID, audit.TypeContainerCreated.New("Success",
			"container joins the sandbox under its pod's profile", map[string]string{"container_id": r.ID}), true)
	}
	s.stagers.Store(r.ID, plan.stager)
	log.G(ctx).WithFields(log.Fields{"role": plan.profile.Role, "policy_digest": plan.profile.Digest}).Info("agentbox: profile applied")
	return resp, nil
}

// createPlan is what prepare decided for a container.
type createPlan struct {
	profile *policy.Profile
	// sandbox is set for a sandbox root; joins names the sandbox otherwise.
	sandbox *sandboxState
	joins   string
	// cgroupsPath is the container's linux.cgroupsPath.
	cgroupsPath string
	// audit is the new sandbox's trail (sandbox roots only).
	audit *sandboxAudit
	// egress is the compiled egress policy (sandbox roots only).
	egress *netpolicy.Plan
	// stager holds the container's checked bind mounts.
	stager *mountguard.Stager
	// cfg is the shim config the container was created with.
	cfg *config.Config
}

// prepare does the agentbox part of Create. For a sandbox root it opens the
// audit trail first, so that a refusal is recorded too.
func (s *service) prepare(ctx context.Context, r *task.CreateTaskRequest) (_ *createPlan, retErr error) {
	cfgPath, named, err := configPathOf(r)
	if err != nil {
		return nil, errkind.InvalidArgument(err)
	}
	cfg, err := config.Load(cfgPath, named)
	if err != nil {
		return nil, errkind.InvalidArgument(err)
	}
	spec, err := utils.ReadSpec(r.Bundle)
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	plan := &createPlan{stager: mountguard.New(r.Bundle), cfg: cfg}
	defer func() {
		if retErr != nil {
			releaseMounts(ctx, plan.stager)
		}
	}()
	if spec.Linux != nil {
		plan.cgroupsPath = spec.Linux.CgroupsPath
	}
	claims, err := agentboxAnnotations(spec.Annotations)
	if err != nil {
		return nil, errkind.InvalidArgument(err)
	}
	// Only containers in containerd's CRI namespace are pods: only they
	// bind by pod namespace and get their pod's files and volumes.
	inCRI := namespaceOf(ctx) == cfg.CRI.Namespace
	mounts := policy.MountEnv{Stage: plan.stager.Stage}
	if sandboxID, joins := ocispec.IsSandboxContainerOf(spec); joins {
		// A container of a pod runs under the pod's profile; it may not
		// claim another.
		sb, ok := s.sandboxes.sandbox(sandboxID)
		if !ok {
			return nil, errkind.NotFound(fmt.Errorf("sandbox %s is not served by this shim: its profile is unknown", sandboxID))
		}
		if !sameClaims(claims, sb.claims) {
			return nil, errkind.PermissionDenied(fmt.Errorf("container annotations %v differ from its pod's %v: a container runs under its pod's role", claims, sb.claims))
		}
		plan.profile, plan.joins = sb.profile, sandboxID
		if sb.inCRI {
			mounts = criMountEnv(cfg, r.Bundle, r.ID, sandboxID, sb.podUID)
		}
	} else {
		meta := audit.Meta{Sandbox: r.ID, PodNamespace: spec.Annotations[ocispec.SandboxNamespaceAnnotation], PodName: spec.Annotations[ocispec.SandboxNameAnnotation]}
		trail, err := openTrail(cfg, r.ID, meta)
		if err != nil {
			return nil, err
		}
		plan.audit = &sandboxAudit{trail: trail}
		defer func() {
			if retErr != nil {
				trail.Emit(audit.TypeRefused.New("Failure", retErr.Error(), map[string]string{"requested_role": policy.Request{Annotations: claims, DefaultRole: cfg.Policy.DefaultRole}.RoleName()}), true)
				closeAudit(ctx, plan.audit, "refused")
			}
		}()
		set, err := s.policies.Load(cfg.Policy.Dir)
		if err != nil {
			return nil, errkind.InvalidArgument(err)
		}
		req := policy.Request{
			Annotations:         claims,
			ContainerdNamespace: namespaceOf(ctx),
			Handler:             cfg.Policy.Handler,
			DefaultRole:         cfg.Policy.DefaultRole,
		}
		podUID := ""
		isPod := inCRI && spec.Annotations[ocispec.ContainerTypeAnnotation] == ocispec.ContainerTypeSandbox
		if isPod {
			req.PodNamespace = spec.Annotations[ocispec.SandboxNamespaceAnnotation]
			if podUID, err = ocispec.PodUID(spec); err != nil {
				return nil, errkind.InvalidArgument(err)
			}
			mounts = criMountEnv(cfg, r.Bundle, r.ID, r.ID, podUID)
		}
		if plan.profile, err = set.Select(req); err != nil {
			return nil, err
		}
		meta.Role, meta.PolicyDigest = plan.profile.Role, plan.profile.Digest
		trail.SetMeta(meta)
		trail.Emit(audit.TypeRoleResolved.New("Success",
			fmt.Sprintf("role %s (chain %s) for %s", plan.profile.Role, strings.Join(plan.profile.Chain, " -> "), req.String()),
			map[string]string{"tightened": strings.Join(plan.profile.Tightened, ", ")}), true)
		plan.sandbox = &sandboxState{id: r.ID, profile: plan.profile, claims: claims, audit: plan.audit, inCRI: isPod, podUID: podUID}
		defer func() {
			if retErr != nil {
				removeEgress(ctx, plan.sandbox)
			}
		}()
	}
	mounts.Stage = plan.stager.Stage
	if err := hostNamespaces(spec); err != nil {
		return nil, errkind.PermissionDenied(err)
	}
	secrets, err := readSecrets(plan.profile)
	if err != nil {
		return nil, errkind.FailedPrecondition(err)
	}
	rewrites := []ocispec.Rewrite{ocispec.StripGVisorAnnotations, ocispec.MarkSandboxRoot}
	if adj := oomadj.Host(); adj.Refused != nil {
		rewrites = append(rewrites, ocispec.RaiseOOMScoreAdj(adj.Floor))
	}
	rewrites = append(rewrites, plan.profile.SpecRewrites(secrets, mounts)...)
	if plan.sandbox != nil {
		// Egress rules and the resolver go in before runsc takes the pod's
		// interfaces over.
		if err := s.applyEgress(ctx, cfg, plan, spec); err != nil {
			return nil, err
		}
	}
	sb := plan.sandbox
	if sb == nil {
		sb, _ = s.sandboxes.sandbox(plan.joins)
	}
	if sb != nil && sb.dnsAddr.IsValid() {
		// Every container of the pod resolves through its resolver.
		rewrites = append(rewrites, resolvConfFor(r.Bundle, sb.dnsAddr))
	}
	changes, err := ocispec.Apply(spec, rewrites...)
	if err != nil {
		return nil, err
	}
	if err := utils.WriteSpec(r.Bundle, spec); err != nil {
		return nil, fmt.Errorf("write OCI spec: %w", err)
	}
	for _, c := range changes {
		log.G(ctx).Debugf("agentbox: spec: %s", c)
	}

	root := cfg.RunscRoot(s.containerdAddress)
	if err := os.MkdirAll(filepath.Join(root, namespaceOf(ctx)), 0o711); err != nil {
		return nil, fmt.Errorf("create runsc root %s: %w", root, err)
	}
	flags := cfg.RunscFlags(plan.profile.RunscFlags())
	if plan.audit != nil {
		rcv, podInit, err := startReceiver(cfg, s.containerdAddress, r.ID, r.Bundle, plan.sandbox, plan.egress)
		if err != nil {
			return nil, err
		}
		plan.audit.receiver = rcv
		flags["pod-init-config"] = podInit
		p := plan.profile
		plan.audit.trail.Emit(audit.TypeProfileApplied.New("Success",
			fmt.Sprintf("rootfs %s, writable %v, egress %s, uid %d, %d processes, %d bytes, wall clock %v", p.Filesystem.Rootfs, p.Filesystem.Writable, p.Network.Egress, p.Process.RunAsUser, p.Process.MaxProcesses, p.Limits.MemoryBytes, p.Limits.WallClock),
			map[string]string{"spec_changes": joinChanges(changes), "runsc_flags": fmt.Sprint(flags)}), true)
	}
	optsPath := filepath.Join(r.Bundle, runscOptionsFile)
	if err := writeRunscOptions(optsPath, cfg, root, flags); err != nil {
		return nil, err
	}
	any, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{TypeUrl: runtimeOptionsTypeURL, ConfigPath: optsPath})
	if err != nil {
		return nil, fmt.Errorf("marshal runsc options: %w", err)
	}
	r.Options = any
	return plan, nil
}

// applyEgress loads the role's egress rules into the pod's network
// namespace and, under an allowlist, starts the pod's DNS resolver, before
// runsc takes the interfaces over. A sandbox with a new, empty namespace
// has nothing to filter.
func (s *service) applyEgress(ctx context.Context, cfg *config.Config, plan *createPlan, spec *specs.Spec) error {
	pl, err := netpolicy.Compile(plan.profile)
	if err != nil {
		return err
	}
	plan.egress = pl
	ns := netnsPath(spec)
	if !pl.Enforced || ns == "" {
		return nil
	}
	iface, err := netpolicy.Apply(ns, pl, dnsproxy.PodLink)
	if err != nil {
		return err
	}
	if iface == "" {
		return nil
	}
	sb := plan.sandbox
	if err := sb.setEgress(ns); err != nil {
		netpolicy.Remove(ns)
		return err
	}
	detail := map[string]string{"netns": ns, "interface": iface}
	if err := startDenialLog(sb, ns); err != nil {
		// The drop counters still count every packet: a gap in detail,
		// not in enforcement.
		log.G(ctx).WithError(err).Warn("agentbox: egress denial log")
		detail["denial_log"] = "unavailable: " + err.Error()
	}
	detail["metadata_denied"] = strings.Join(pl.DeniedNames(), ", ")
	if pl.Resolver {
		if err := startResolver(cfg, sb, pl, ns); err != nil {
			return err
		}
		detail["resolver"] = sb.dnsAddr.String()
		detail["upstreams"] = fmt.Sprint(sb.upstreams)
		detail["hosts"] = strings.Join(pl.HostNames(), ", ")
	}
	sb.audit.trail.Emit(audit.TypeEgressApplied.New("Success",
		fmt.Sprintf("egress %s: %d allow rule(s), default %s", plan.profile.Network.Egress, len(pl.Allow), map[bool]string{true: "accept", false: "deny"}[pl.DefaultAccept]), detail), true)
	return nil
}

// startResolver starts the pod's DNS resolver: its answers go into the
// rules' sets and every question into the trail.
func startResolver(cfg *config.Config, sb *sandboxState, pl *netpolicy.Plan, ns string) error {
	addr, peer, err := cfg.Network.ResolverAddrs()
	if err != nil {
		return err
	}
	ups, err := cfg.Network.UpstreamAddrs("/etc/resolv.conf")
	if err != nil {
		return err
	}
	scrub, err := scrubberOf(cfg, sb)
	if err != nil {
		return err
	}
	cluster, err := cfg.Network.ClusterPrefixes()
	if err != nil {
		return err
	}
	node, err := nodeAddrs()
	if err != nil {
		return err
	}
	dests := netpolicy.Destinations{Node: node, Cluster: cluster, Link: []netip.Addr{addr, peer}}
	sb.resolved = netpolicy.NewResolutions(nil)
	trail := sb.audit.trail
	h := &dnsproxy.Handler{
		Plan:     pl,
		Refuse:   dests.Refuse,
		Exchange: dnsproxy.Exchange(ups),
		Allow: func(r netpolicy.Rule, addrs []netip.Addr, ttl time.Duration) error {
			if err := netpolicy.Update(ns, pl.Elements(r, addrs, ttl)); err != nil {
				return err
			}
			sb.resolved.Add(r, addrs, ttl)
			return nil
		},
		Remaining: sb.resolved.Remaining,
		MinTTL:    time.Duration(cfg.Network.MinTTLSeconds) * time.Second,
		MaxTTL:    time.Duration(cfg.Network.MaxTTLSeconds) * time.Second,
		Record: func(d dnsproxy.Decision) {
			trail.Emit(dnsRecord(d, scrub), false)
			for _, w := range d.Withheld {
				trail.Emit(withheldRecord(d, w, scrub), false)
			}
		},
		ID: func() uint16 { return uint16(rand.Uint32()) },
	}
	res, err := dnsproxy.Start(dnsproxy.Config{PodNetns: ns, Address: addr, Peer: peer, Handler: h})
	if err != nil {
		return err
	}
	sb.egressMu.Lock()
	sb.resolver = res
	sb.egressMu.Unlock()
	sb.dnsAddr, sb.upstreams = addr, ups
	return nil
}

// nodeAddrs are the addresses of the node's own interfaces (the shim runs
// in the host's network namespace).
func nodeAddrs() ([]netip.Addr, error) {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range ifaddrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
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

// readSecrets reads the role's secrets from the node. Values never reach a
// log or an error message.
func readSecrets(p *policy.Profile) (map[string]string, error) {
	out := map[string]string{}
	for _, sec := range p.Credentials.Secrets {
		b, err := os.ReadFile(sec.File)
		if err != nil {
			return nil, fmt.Errorf("secret %s of role %q: %w", sec.Env, p.Role, err)
		}
		out[sec.Env] = strings.TrimRight(string(b), "\n")
	}
	return out, nil
}

// Start starts a container; starting a sandbox root arms its wall clock.
func (s *service) Start(ctx context.Context, r *task.StartRequest) (*task.StartResponse, error) {
	resp, err := s.next.Start(ctx, r)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if r.ExecID == "" {
		msg := "container started"
		if d, ok := s.sandboxes.armTimer(r.ID, s.expire); ok {
			log.G(ctx).WithField("container_id", r.ID).Infof("agentbox: wall-clock limit %v armed", d)
			msg = fmt.Sprintf("sandbox started; wall-clock limit %v armed", d)
		}
		s.record(r.ID, audit.TypeContainerStart.New("Success", msg, map[string]string{"pid": fmt.Sprint(resp.Pid)}), true)
	} else {
		s.record(r.ID, audit.TypeExecStart.New("Success", "exec started", map[string]string{"exec_id": r.ExecID, "pid": fmt.Sprint(resp.Pid)}), true)
	}
	return resp, nil
}

// expire stops a sandbox whose wall-clock limit passed: every container in
// it is killed, and their exits report WallClockExitStatus.
func (s *service) expire(sandboxID string) {
	ctx := log.WithLogger(context.Background(), log.L.WithField("sandbox_id", sandboxID))
	ids := s.sandboxes.expire(sandboxID)
	log.G(ctx).Warnf("agentbox: wall-clock limit reached; stopping %d container(s)", len(ids))
	s.record(sandboxID, audit.TypeLimit.New("Failure", fmt.Sprintf("wall-clock limit reached: stopping %d container(s); they exit with status %d", len(ids), WallClockExitStatus),
		map[string]string{"limit": "wallClock"}), true)
	s.killAll(ctx, ids)
}

// stopSandbox kills every container of a sandbox for a limit other than
// the wall clock (their exits report 137), recording why first.
func (s *service) stopSandbox(sandboxID, limit, why string) {
	ctx := log.WithLogger(context.Background(), log.L.WithField("sandbox_id", sandboxID))
	sb, ok := s.sandboxes.sandbox(sandboxID)
	if !ok {
		return
	}
	ids := s.sandboxes.containersOf(sb)
	log.G(ctx).Warnf("agentbox: %s; stopping %d container(s)", why, len(ids))
	s.record(sandboxID, audit.TypeLimit.New("Failure", why, map[string]string{"limit": limit}), true)
	s.killAll(ctx, ids)
}

func (s *service) killAll(ctx context.Context, ids []string) {
	for _, id := range ids {
		if _, err := s.next.Kill(s.shimCtx, &task.KillRequest{ID: id, Signal: uint32(unix.SIGKILL), All: true}); err != nil {
			log.G(ctx).WithError(err).WithField("container_id", id).Warn("agentbox: kill")
		}
	}
}

// adjustExit reports a container killed by its sandbox's wall clock with
// WallClockExitStatus.
func (s *service) adjustExit(e *proc.Exit) {
	if e.Status == 128+int(unix.SIGKILL) && s.sandboxes.expiredContainer(e.ID) {
		e.Status = WallClockExitStatus
	}
}

// Exec narrows an exec'd process to its container's profile, as the
// container's own process was.
func (s *service) Exec(ctx context.Context, r *task.ExecProcessRequest) (*types.Empty, error) {
	argv, err := s.prepareExec(r)
	if err != nil {
		log.G(ctx).WithError(err).WithField("container_id", r.ID).Error("agentbox: exec refused")
		s.record(r.ID, audit.TypeExecRefused.New("Failure", err.Error(), map[string]string{"exec_id": r.ExecID}), true)
		return nil, errgrpc.ToGRPC(fmt.Errorf("agentbox: exec %s in %s refused: %w", r.ExecID, r.ID, err))
	}
	rec := audit.TypeExec.New("Success", "exec requested", map[string]string{"exec_id": r.ExecID})
	rec.Process = &audit.Process{Argv: argv}
	s.record(r.ID, rec, true)
	resp, err := s.next.Exec(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

// prepareExec narrows the exec'd process and returns its argv, scrubbed
// for the audit trail.
func (s *service) prepareExec(r *task.ExecProcessRequest) ([]string, error) {
	sb, ok := s.sandboxes.of(r.ID)
	if !ok {
		return nil, fmt.Errorf("container %s has no profile in this shim", r.ID)
	}
	if r.Spec == nil {
		return nil, fmt.Errorf("exec request carries no process spec")
	}
	var proc specs.Process
	if err := json.Unmarshal(r.Spec.GetValue(), &proc); err != nil {
		return nil, fmt.Errorf("decode exec process spec: %w", err)
	}
	secrets, err := readSecrets(sb.profile)
	if err != nil {
		return nil, err
	}
	if _, err := sb.profile.ApplyProcess(&proc, secrets); err != nil {
		return nil, err
	}
	b, err := json.Marshal(&proc)
	if err != nil {
		return nil, err
	}
	r.Spec.Value = b
	if sb.audit != nil && sb.audit.scrub != nil {
		return sb.audit.scrub.Args(proc.Args), nil
	}
	sc, err := audit.NewScrubber(sb.profile.EnvAllowed, nil)
	if err != nil {
		return nil, err
	}
	return sc.Args(proc.Args), nil
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

// namespaceOf is the containerd namespace of a request, as containerd
// sends it with each call (the shim's -namespace flag only when a request
// carries none).
func namespaceOf(ctx context.Context) string {
	if ns, ok := namespaces.Namespace(ctx); ok && ns != "" {
		return ns
	}
	if f := flag.Lookup("namespace"); f != nil && f.Value.String() != "" {
		return f.Value.String()
	}
	return "default"
}

// Delete forwards and forgets the container's exit bookkeeping.
func (s *service) Delete(ctx context.Context, r *task.DeleteRequest) (*task.DeleteResponse, error) {
	resp, err := s.next.Delete(ctx, r)
	if err == nil && r.ExecID == "" {
		s.exits.forget(r.ID)
		if st, ok := s.stagers.LoadAndDelete(r.ID); ok {
			releaseMounts(ctx, st.(*mountguard.Stager))
		}
		if sb, ok := s.sandboxes.sandbox(r.ID); ok {
			// The sandbox root is gone: its rules go, its trail ends.
			removeEgress(ctx, sb)
			closeAudit(ctx, sb.audit, fmt.Sprintf("root container exited with status %d", resp.ExitStatus))
		} else {
			s.record(r.ID, audit.TypeContainerDeleted.New("Success",
				fmt.Sprintf("container deleted (exit status %d)", resp.ExitStatus), map[string]string{"container_id": r.ID}), true)
		}
		s.sandboxes.remove(r.ID)
	}
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) State(ctx context.Context, r *task.StateRequest) (*task.StateResponse, error) {
	resp, err := s.next.State(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Pids(ctx context.Context, r *task.PidsRequest) (*task.PidsResponse, error) {
	resp, err := s.next.Pids(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Pause(ctx context.Context, r *task.PauseRequest) (*types.Empty, error) {
	resp, err := s.next.Pause(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Resume(ctx context.Context, r *task.ResumeRequest) (*types.Empty, error) {
	resp, err := s.next.Resume(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Checkpoint(ctx context.Context, r *task.CheckpointTaskRequest) (*types.Empty, error) {
	resp, err := s.next.Checkpoint(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Kill(ctx context.Context, r *task.KillRequest) (*types.Empty, error) {
	resp, err := s.next.Kill(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) ResizePty(ctx context.Context, r *task.ResizePtyRequest) (*types.Empty, error) {
	resp, err := s.next.ResizePty(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) CloseIO(ctx context.Context, r *task.CloseIORequest) (*types.Empty, error) {
	resp, err := s.next.CloseIO(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Update(ctx context.Context, r *task.UpdateTaskRequest) (*types.Empty, error) {
	resp, err := s.next.Update(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Wait(ctx context.Context, r *task.WaitRequest) (*task.WaitResponse, error) {
	resp, err := s.next.Wait(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Stats(ctx context.Context, r *task.StatsRequest) (*task.StatsResponse, error) {
	resp, err := s.next.Stats(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Connect(ctx context.Context, r *task.ConnectRequest) (*task.ConnectResponse, error) {
	resp, err := s.next.Connect(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

// Shutdown ends the shim once it serves no container. gVisor's task service
// answers an error while containers remain; that is not a failure.
func (s *service) Shutdown(ctx context.Context, r *task.ShutdownRequest) (*types.Empty, error) {
	resp, err := s.next.Shutdown(ctx, r)
	if err != nil {
		log.G(ctx).WithError(err).Debug("agentbox: shutdown deferred")
		return &types.Empty{}, nil
	}
	s.sd.Shutdown()
	return resp, nil
}

// dropsWait bounds how long Delete waits for the drop counters.
const dropsWait = 10 * time.Second

// removeEgress waits for the drop counters, stops the sandbox's resolver
// and denial log, deletes its egress rules and lets the namespace go,
// recording the outcome. It may run twice, and concurrently with the
// root's exit being published.
func removeEgress(ctx context.Context, sb *sandboxState) {
	e, ok := sb.takeEgress()
	if !ok {
		return
	}
	defer e.file.Close()
	if e.dropsDone != nil {
		select {
		case <-e.dropsDone:
		case <-time.After(dropsWait):
			log.G(ctx).Warn("agentbox: egress drop counters not recorded in time")
		}
	}
	if res := e.resolver; res != nil {
		if err := res.Close(); err != nil {
			log.G(ctx).WithError(err).Warn("agentbox: stopping the DNS resolver")
			sb.audit.trail.Emit(audit.TypeResolverStopped.New("Failure", err.Error(), nil), true)
		} else {
			sb.audit.trail.Emit(audit.TypeResolverStopped.New("Success", "resolver stopped and its link removed from "+e.netns,
				map[string]string{"tcp_connections_rejected": fmt.Sprint(res.Rejected())}), true)
		}
	}
	stopDenialLog(sb, e.denials)
	if err := netpolicy.Remove(e.held); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: removing egress rules")
		sb.audit.trail.Emit(audit.TypeEgressRemoved.New("Failure", err.Error(), nil), true)
		return
	}
	sb.audit.trail.Emit(audit.TypeEgressRemoved.New("Success", "egress rules removed from "+e.netns, nil), true)
}

