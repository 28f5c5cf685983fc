package shim

// Limits the shim enforces itself: the wall clock, stopping a sandbox for
// a limit (its audit trail full), and the role's memory and CPU on a pod's
// cgroup.

import (
	"context"
	"fmt"
	"strings"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/shim/sandbox"
)

// WallClockExitStatus is the exit status of a container stopped because its
// sandbox reached the role's wall-clock limit, as timeout(1) reports it:
// distinct from 137, a kill by someone else.
const WallClockExitStatus = 124

// expire stops a sandbox whose wall-clock limit passed: every container in
// it is killed, and their exits report WallClockExitStatus.
func (s *service) expire(sandboxID string) {
	ctx := log.WithLogger(context.Background(), log.L.WithField("sandbox_id", sandboxID))
	sb, ok := s.sandboxes.sandbox(sandboxID)
	if !ok {
		return
	}
	n := len(sb.members.List())
	log.G(ctx).Warnf("agentbox: wall-clock limit reached; stopping %d container(s)", n)
	s.record(sandboxID, audit.TypeLimit.New("Failure", fmt.Sprintf("wall-clock limit reached: stopping %d container(s); they exit with status %d", n, WallClockExitStatus),
		map[string]string{"limit": "wallClock"}), true)
	s.stopAll(ctx, sb, sandbox.StopWallClock)
}

// stopSandbox kills every container of a sandbox for a limit other than
// the wall clock (their exits report 137), recording why first.
func (s *service) stopSandbox(sandboxID, limit, why string) {
	ctx := log.WithLogger(context.Background(), log.L.WithField("sandbox_id", sandboxID))
	sb, ok := s.sandboxes.sandbox(sandboxID)
	if !ok {
		return
	}
	log.G(ctx).Warnf("agentbox: %s; stopping %d container(s)", why, len(sb.members.List()))
	s.record(sandboxID, audit.TypeLimit.New("Failure", why, map[string]string{"limit": limit}), true)
	s.stopAll(ctx, sb, limit)
}

// stopAll kills every container of a sandbox, the root last, after its
// Stop move (reason: why it stops; the first stop's is kept).
func (s *service) stopAll(ctx context.Context, sb *sandboxState, reason string) {
	s.stopMove(ctx, sb, reason)
	s.killMembers(ctx, sb)
}

// stopMove moves the sandbox to Stopping. Stop needs no operation lock (a
// limit, runsc and containerd stop a sandbox whatever an admin is doing):
// a frozen sandbox (or one checkpointing what was frozen) is resumed as
// part of its stop, not thawed, since runsc signals no container of a
// paused sandbox. Its tasks run between the resume and the kill
// (milliseconds).
func (s *service) stopMove(ctx context.Context, sb *sandboxState, reason string) {
	sb.pauseMu.Lock()
	defer sb.pauseMu.Unlock()
	before, err := sb.life.Fire(sandbox.Stop, reason)
	if err != nil {
		if before.Phase != sandbox.Ended {
			log.G(ctx).WithError(err).Warn("agentbox: stopping a sandbox")
		}
		return
	}
	// Held paused: frozen, or checkpointing what was frozen.
	if before.Phase != sandbox.Frozen && (before.Phase != sandbox.Checkpointing || before.CheckpointFrom != sandbox.Frozen) {
		return
	}
	sb.clock.Thaw()
	if _, err := s.next.Resume(ctx, &task.ResumeRequest{ID: sb.id}); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: resuming a frozen sandbox to stop it")
		return
	}
	sb.audit.trail.Emit(audit.TypeThawed.New("Success", fmt.Sprintf("resumed after %v frozen, to be stopped", time.Since(before.FrozenAt).Round(time.Millisecond)), nil), true)
}

// killMembers sends SIGKILL to every process of every container of the
// sandbox, the root last.
func (s *service) killMembers(ctx context.Context, sb *sandboxState) {
	for _, id := range sb.members.RootLast() {
		if _, err := s.next.Kill(s.shimCtx, &task.KillRequest{ID: id, Signal: uint32(unix.SIGKILL), All: true}); err != nil {
			log.G(ctx).WithError(err).WithField("container_id", id).Warn("agentbox: kill")
		}
	}
}

// adjustExit reports a container killed by its sandbox's wall clock with
// WallClockExitStatus, one its suspend stopped with 0, and one OOM-killed
// under gVisor with SIGKILL's status.
func (s *service) adjustExit(e *proc.Exit) {
	// An exited container's state and stats are gVisor's task service's
	// to answer (it says what a stopped container has).
	s.tasks.end(e.ID)
	switch {
	case e.Status == 128+int(unix.SIGKILL) && s.sandboxes.expiredContainer(e.ID):
		e.Status = WallClockExitStatus
	case s.sandboxes.suspendedContainer(e.ID):
		// Its sandbox was stopped once the suspend's image was made
		// (stopSuspended): it did not fail, it was saved. 0, as gVisor's
		// own stop-after-save reports, so that a pod does not restart
		// it fresh (OnFailure) or count it failed; the trail says why.
		e.Status = 0
	case e.Status == runscWaitFailed && s.sandboxes.oomKilledContainer(e.ID):
		// The sandbox was OOM-killed under the container: it died with
		// it (SIGKILL), as Kubernetes expects of an OOMKilled container.
		e.Status = 128 + int(unix.SIGKILL)
	}
}

// armWallClock arms a started sandbox root's wall clock, once, with its
// role's limit.
func armWallClock(sb *sandboxState, root bool, fire func(string)) (time.Duration, bool) {
	if !root || sb.profile == nil {
		return 0, false
	}
	return sb.clock.Arm(sb.profile.Limits.WallClock, func() { fire(sb.id) })
}

// podLimits puts the role's memory and CPU limits (spec's, as the profile
// bounded them) on a sandbox's cgroup made before it (a pod's, which the
// kubelet makes and runsc never sets: it sets only a cgroup it creates),
// lowering what is there, never raising it. A cgroup that cannot take
// them fails the create: the role's limits would not hold.
func podLimits(cgroup string, spec *specs.Spec) ([]string, error) {
	if spec.Linux == nil || !cgroups.Exists(cgroups.Root, cgroup) {
		return nil, nil // runsc makes it, with spec's limits
	}
	mem, cpu := limitsOf(spec.Linux.Resources)
	did, err := cgroups.Lower(cgroups.Root, cgroup, mem, cpu)
	if err != nil {
		return nil, fmt.Errorf("the role's limits on the pod's cgroup %s: %w", cgroup, err)
	}
	if len(did) == 0 {
		return nil, nil
	}
	return []string{"the pod's cgroup " + cgroup + " (the kubelet's, which runsc does not set): " + strings.Join(did, ", ")}, nil
}
