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
	"os/exec"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	task3 "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/pkg/sys/reaper"
	errgrpc "github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/bundle"
	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/hostexec"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/oomadj"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/sentrystats"
	"agentbox.dev/agentbox/shim/sandbox"
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
	// *mountguard.Stager), released once it has started (runsc's gofer
	// holds its own copies then) and again at Delete, for one that never
	// started.
	stagers sync.Map
	// watchOnce starts following the policy directory (watchPolicies).
	watchOnce sync.Once
	// deleting counts the Deletes in progress: the shim does not shut
	// down under one (a sandbox whose containers exit together, as after
	// a suspend, has its root's trail closed while the last container's
	// Delete asks the shim to go).
	deleting sync.WaitGroup
	// trim returns the heap a start left behind to the kernel once the
	// shim has been quiet for trimDelay.
	trim *idleTrim
	// tasks answers the State and Stats of running containers
	// (runningTasks).
	tasks runningTasks
}

var _ cdshim.TTRPCService = (*service)(nil)
var _ task.TaskService = (*service)(nil)

// New builds the agentbox task service on top of gVisor's runsc task service.
func New(ctx context.Context, publisher cdshim.Publisher, sd shutdown.Service) (*service, error) {
	s := &service{exits: newExitRepair(), sd: sd, shimCtx: ctx, sandboxes: newRegistry(), trim: &idleTrim{delay: trimDelay, fn: debug.FreeOSMemory}}
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
	s.installWaits()
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
	task3.RegisterTTRPCTaskService(server, taskV3{s})
	return nil
}

// Create resolves the shim config and the container's role, rewrites the
// bundle's spec to the role's profile, points gVisor at a runsc options file
// derived from both, then creates the container. Any failure refuses the
// container (fail closed) with the reason.
func (s *service) Create(ctx context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("container_id", r.ID))
	ph := newPhases("create", r.ID)
	defer ph.done()
	plan, err := s.prepare(ctx, r, ph)
	if err != nil {
		// A policy or input refusal is the request's fault, not the
		// runtime's: the caller gets the reason, the log a warning.
		if errkind.Refusal(err) {
			log.G(ctx).WithError(err).Warn("agentbox: container refused")
		} else {
			log.G(ctx).WithError(err).Error("agentbox: container refused")
		}
		return nil, errgrpc.ToGRPC(fmt.Errorf("agentbox: container %s refused: %w", r.ID, err))
	}
	resp, err := s.next.Create(ctx, r)
	ph.mark("runsc_create")
	if err != nil {
		if plan.sandbox != nil {
			// runsc leaves a failed sandbox's cgroup behind.
			if cerr := cgroups.Remove(cgroups.Root, plan.cgroupsPath); cerr != nil {
				log.G(ctx).WithError(cerr).Warn("agentbox: cleaning up the failed sandbox's cgroup")
			}
			plan.sandbox.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", err.Error(), nil), true)
		} else {
			s.record(plan.joins, audit.TypeContainerFailed.New("Failure", err.Error(), map[string]string{"container_id": r.ID}), true)
		}
		plan.unwind("failed to start")
		return nil, errgrpc.ToGRPC(err)
	}
	if plan.sandbox != nil {
		// runsc boots a sandbox whose trace session failed, with a warning:
		// refuse it here instead of running it unaudited.
		if !plan.sandbox.audit.receiver.Live() {
			err := fmt.Errorf("agentbox: container %s refused: gVisor's audit session is not established (see runsc's log)", r.ID)
			s.discardTask(ctx, r.ID)
			plan.sandbox.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", err.Error(), nil), true)
			plan.unwind("audit session failed")
			return nil, errgrpc.ToGRPC(err)
		}
		if err := s.startControl(plan.cfg, plan.sandbox); err != nil {
			// A sandbox an admin could not respond to does not run.
			err = fmt.Errorf("agentbox: container %s refused: %w", r.ID, err)
			s.discardTask(ctx, r.ID)
			plan.sandbox.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", err.Error(), nil), true)
			plan.unwind("control socket failed")
			return nil, errgrpc.ToGRPC(err)
		}
		if err := s.proveOwner(ctx, plan.sandbox); err != nil {
			// Whose memory a pod may take is proven, never claimed.
			err = errkind.PermissionDenied(fmt.Errorf("agentbox: container %s refused: checkpoint %s: %w", r.ID, plan.sandbox.restore.image.Manifest.Name, err))
			s.discardTask(ctx, r.ID)
			stopControl(plan.sandbox)
			plan.sandbox.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", err.Error(), nil), true)
			plan.unwind("restore refused")
			return nil, errgrpc.ToGRPC(err)
		}
		s.sandboxes.addSandbox(plan.sandbox)
		s.exits.track(r.ID, int(resp.Pid))
		s.watchFull(plan.cfg, plan.sandbox)
		s.watchPolicies(plan.cfg)
	} else {
		s.sandboxes.join(plan.joins, r.ID)
		s.record(r.ID, audit.TypeContainerCreated.New("Success",
			"container joins the sandbox under its pod's profile", map[string]string{"container_id": r.ID}), true)
	}
	s.stagers.Store(r.ID, plan.stager)
	s.tasks.create(r, resp.Pid)
	ph.mark("register")
	log.G(ctx).WithFields(log.Fields{"role": plan.profile.Role, "policy_digest": plan.profile.Digest}).Info("agentbox: profile applied")
	return resp, nil
}

// Start starts a container; starting a sandbox root arms its wall clock.
func (s *service) Start(ctx context.Context, r *task.StartRequest) (*task.StartResponse, error) {
	ph := newPhases("start", r.ID)
	defer ph.done()
	if r.ExecID == "" {
		s.tasks.unsure(r.ID)
	}
	resp, restored, err := s.restoreStart(ctx, r)
	if !restored {
		resp, err = s.next.Start(ctx, r)
	}
	ph.mark("runsc_start")
	if err != nil {
		if sb, root := s.sandboxes.sandbox(r.ID); root && r.ExecID == "" && !restored {
			// No runsc wait will say when it ends: its sandbox's reaping
			// will (a failed restore is ended by abandonRestore).
			s.exits.startFailed(r.ID)
			sb.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", "runsc could not start the sandbox: "+err.Error(), nil), true)
		}
		return nil, errgrpc.ToGRPC(err)
	}
	if r.ExecID == "" {
		s.exits.started(r.ID)
		var stats *sentrystats.Sandbox
		if of, ok := s.sandboxes.of(r.ID); ok {
			stats = of.stats
		}
		s.tasks.start(r.ID, resp.Pid, stats)
		// runsc's gofer has its own copies of the container's mounts
		// now: the staged ones in the host's mount namespace would only
		// keep the pod's directories busy (a host directory with a mount
		// below it could not be removed while the pod runs).
		if st, ok := s.stagers.Load(r.ID); ok {
			releaseMounts(ctx, st.(*mountguard.Stager))
		}
		msg := "container started"
		if restored {
			msg = "container restored from checkpoint " + s.restoredFrom(r.ID)
		}
		sb, root := s.sandboxes.sandbox(r.ID)
		if root {
			if err := sb.fire(ctx, sandbox.Started, ""); err != nil {
				// Stopping (its restore was abandoned) or ended: what
				// started is not to run.
				s.stopAll(ctx, sb, "started while "+sb.life.Now().Phase.String())
			}
		}
		if d, ok := armWallClock(sb, root, s.expire); ok {
			log.G(ctx).WithField("container_id", r.ID).Infof("agentbox: wall-clock limit %v armed", d)
			if restored {
				msg = fmt.Sprintf("sandbox restored from checkpoint %s; wall-clock limit armed with the %v it had left", s.restoredFrom(r.ID), d.Round(time.Millisecond))
			} else {
				msg = fmt.Sprintf("sandbox started; wall-clock limit %v armed", d)
			}
		}
		s.record(r.ID, audit.TypeContainerStart.New("Success", msg, map[string]string{"pid": fmt.Sprint(resp.Pid)}), true)
		ph.mark("release_and_record")
	} else {
		s.record(r.ID, audit.TypeExecStart.New("Success", "exec started", map[string]string{"exec_id": r.ExecID, "pid": fmt.Sprint(resp.Pid)}), true)
	}
	s.trim.soon()
	return resp, nil
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
	secrets, err := secretsFor(sb)(sb.profile)
	if err != nil {
		return nil, err
	}
	if _, err := sb.profile.ApplyProcess(&proc, secrets); err != nil {
		return nil, err
	}
	if sb.gatewayCA() != nil {
		proc.Env = bundle.WithTrustEnv(proc.Env)
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
	s.deleting.Add(1)
	defer s.deleting.Done()
	ph := newPhases("delete", r.ID)
	defer ph.done()
	if sb, ok := s.sandboxes.of(r.ID); ok && r.ExecID == "" && (sb.life.Now().SuspendedInto != "" || sb.life.Now().RestoreFailed != "") {
		// Its sandbox process was killed while paused (stopSuspended) or
		// after a failed restore (abandonRestore): runsc still holds it
		// paused or created, and deletes it only by force.
		forceDelete(ctx, sb.cfg, s.containerdAddress, r.ID)
		ph.mark("runsc_force_delete")
	}
	// What the sandbox's cgroup used, read before runsc removes it: its
	// trail's end record says so (agentbox policy suggest reads it).
	var usage map[string]string
	if sb, ok := s.sandboxes.sandbox(r.ID); ok && r.ExecID == "" {
		if u, ok := cgroups.ReadUsage(cgroups.Root, sb.cgroupsPath); ok {
			usage = map[string]string{"memory_peak_bytes": strconv.FormatInt(u.MemoryPeak, 10),
				"cpu_seconds": strconv.FormatFloat(u.CPU.Seconds(), 'f', 3, 64)}
		}
	}
	resp, err := s.next.Delete(ctx, r)
	ph.mark("runsc_delete")
	if err == nil && r.ExecID == "" {
		s.tasks.end(r.ID)
		s.exits.forget(r.ID)
		if st, ok := s.stagers.LoadAndDelete(r.ID); ok {
			releaseMounts(ctx, st.(*mountguard.Stager))
		}
		ph.mark("release_mounts")
		if sb, ok := s.sandboxes.sandbox(r.ID); ok {
			// The sandbox root is gone: its control socket, its rules go,
			// its trail ends.
			stopControl(sb)
			ph.mark("stop_control")
			stopPortForward(ctx, sb)
			removeEgress(ctx, sb)
			ph.mark("remove_egress")
			closeAudit(ctx, sb.audit, fmt.Sprintf("root container exited with status %d", resp.ExitStatus), usage)
			_ = sb.fire(ctx, sandbox.Exit, "") // ended already if the root's exit was seen
			ph.mark("close_audit")
		} else {
			s.record(r.ID, audit.TypeContainerDeleted.New("Success",
				fmt.Sprintf("container deleted (exit status %d)", resp.ExitStatus), map[string]string{"container_id": r.ID}), true)
		}
		s.sandboxes.remove(r.ID)
	}
	return resp, errgrpc.ToGRPC(err)
}

// Pause freezes the container's whole sandbox (runsc pauses its kernel),
// as an admin's freeze does: its wall clock is held, and the trail says
// who asked.
func (s *service) Pause(ctx context.Context, r *task.PauseRequest) (*types.Empty, error) {
	sb, ok := s.sandboxes.of(r.ID)
	if !ok {
		resp, err := s.next.Pause(ctx, r)
		return resp, errgrpc.ToGRPC(err)
	}
	sb.ops.Lock()
	defer sb.ops.Unlock()
	if _, err := s.freeze(ctx, sb, taskAPI()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &types.Empty{}, nil
}

// Resume thaws it, and its wall clock.
func (s *service) Resume(ctx context.Context, r *task.ResumeRequest) (*types.Empty, error) {
	sb, ok := s.sandboxes.of(r.ID)
	if !ok {
		resp, err := s.next.Resume(ctx, r)
		return resp, errgrpc.ToGRPC(err)
	}
	sb.ops.Lock()
	defer sb.ops.Unlock()
	if _, err := s.thaw(ctx, sb, taskAPI()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &types.Empty{}, nil
}

// taskAPI is who asked, for a request through containerd's task API.
func taskAPI() map[string]string {
	return map[string]string{"requested_by": "containerd's task API (ctr task pause, resume)"}
}

// discardTask kills and deletes a container that runsc created and the
// shim refuses; what fails is logged (the refusal stands either way).
func (s *service) discardTask(ctx context.Context, id string) {
	if _, err := s.next.Kill(ctx, &task.KillRequest{ID: id, Signal: uint32(unix.SIGKILL), All: true}); err != nil {
		log.G(ctx).WithError(err).WithField("container_id", id).Warn("agentbox: killing a refused container")
	}
	if _, err := s.next.Delete(ctx, &task.DeleteRequest{ID: id}); err != nil {
		log.G(ctx).WithError(err).WithField("container_id", id).Warn("agentbox: deleting a refused container")
	}
}
