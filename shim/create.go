package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"gvisor.dev/gvisor/pkg/shim/v1/utils"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/bundle"
	"agentbox.dev/agentbox/internal/compile"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/runscctl"
	"agentbox.dev/agentbox/internal/sentrystats"
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
		plan.sandbox = newSandboxState(r.ID, cfg, plan.claims, trail)
		plan.push(func(status string) { closeAudit(ctx, plan.sandbox.audit, status, nil) })
		if name, ok := plan.claims[policy.RestoreAnnotation]; ok {
			// The image is checked, and the trail linked to its
			// checkpoint's, before anything else is done for the sandbox.
			if err := openRestore(cfg, plan.sandbox, name, false); err != nil {
				return err
			}
			plan.phases.mark("resolve_checkpoint")
		}
		if plan.policies, err = s.loadPolicies(cfg); err != nil {
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
	// A pod's pause container runs from the node's image of its rootfs
	// when it can, and then needs none of the pod's files.
	fromImage, change, err := pauseFromImage(ctx, plan)
	if err != nil {
		return errkind.PermissionDenied(err)
	}
	if change != "" {
		changes = append(changes, change)
	}
	if plan.sandbox != nil {
		plan.phases.mark("pause_image")
	}
	if !fromImage && sb != nil && sb.dnsAddr.IsValid() {
		// Every container of the pod resolves through its resolver.
		more, err := ocispec.Apply(spec, bundle.ResolvConf(r.Bundle, sb.dnsAddr))
		if err != nil {
			return err
		}
		changes = append(changes, more...)
		if names := sb.gatewayNames(); len(names) > 0 {
			// The host rules' names are the gateway's without asking the
			// resolver: no lookup round trip out of the sandbox.
			more, err := ocispec.Apply(spec, bundle.Hosts(r.Bundle, sb.dnsAddr, names, plan.layers))
			if err != nil {
				return err
			}
			changes = append(changes, more...)
		}
	}
	if ca := sb.gatewayCA(); ca != nil && !fromImage {
		// Every container of the pod trusts the gateway's CA, after its
		// image's own roots.
		more, err := ocispec.Apply(spec, bundle.Trust(r.Bundle, ca.PEM(), plan.layers))
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
	nsRoot := filepath.Join(root, namespaceOf(ctx))
	if err := os.MkdirAll(nsRoot, 0o711); err != nil {
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
		plan.sandbox.cgroupsPath = plan.cgroupsPath
		control := runscctl.Socket(nsRoot, r.ID)
		plan.sandbox.control = control
		if st, ok := sentrystats.For(control, spec, flags["systemd-cgroup"] == "true"); ok {
			plan.sandbox.stats = &st
			did, err := podLimits(st.Cgroup, spec)
			if err != nil {
				return err
			}
			changes = append(changes, did...)
		} else {
			changes = append(changes, "the sandbox's cgroup is systemd's: the shim writes no limit on it (runsc sets a cgroup's only when it makes it)")
		}
		sb := plan.sandbox
		plan.push(func(string) { stopPortForward(ctx, sb) })
		pf, err := startPortForward(ctx, sb, plan.profile.Network.PortForward, netnsPath(spec), control)
		if err != nil {
			return err
		}
		if pf != "" {
			changes = append(changes, pf)
		}
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

// releaseMounts unmounts a container's staged mounts.
func releaseMounts(ctx context.Context, st *mountguard.Stager) {
	if err := mountguard.Release(st.Dir()); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: releasing staged mounts")
	}
}
