package shim

// The task API calls the shim forwards to gVisor's task service as they
// are, or nearly: State of a created or running container is answered in
// the shim, Kill thaws a frozen sandbox first, Stats adds the OOM kills,
// Shutdown waits for Delete's cleanup.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	task "github.com/containerd/containerd/api/runtime/task/v2"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	errgrpc "github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/shim/sandbox"
)

// State of a created or running container is the shim's to answer while
// its sandbox runs (runningTasks); anything else is gVisor's.
func (s *service) State(ctx context.Context, r *task.StateRequest) (*task.StateResponse, error) {
	if r.ExecID == "" {
		if sb, ok := s.sandboxes.of(r.ID); ok && sb.life.Now().Phase == sandbox.Running {
			if st, ok := s.tasks.state(r.ID); ok {
				return st, nil
			}
		}
	}
	resp, err := s.next.State(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Pids(ctx context.Context, r *task.PidsRequest) (*task.PidsResponse, error) {
	resp, err := s.next.Pids(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

// Kill forwards. A kill that arrives while the sandbox is being
// checkpointed waits for it (bounded: waitCheckpoint), so that a pod
// stopped while it is suspended is stopped after its image is complete. A
// SIGKILL for a frozen sandbox resumes it first: runsc signals no
// container of a paused sandbox (containerd stopping a frozen pod).
func (s *service) Kill(ctx context.Context, r *task.KillRequest) (*types.Empty, error) {
	if r.ExecID == "" {
		s.tasks.unsure(r.ID)
	}
	if sb, ok := s.sandboxes.of(r.ID); ok {
		if r.ExecID == "" {
			holdForSuspend(ctx, sb)
		}
		if waited, ok := waitCheckpoint(ctx, sb); waited > 0 {
			msg := fmt.Sprintf("a stop (signal %d) waited %v for the checkpoint under way", r.Signal, waited.Round(time.Millisecond))
			if !ok {
				msg = fmt.Sprintf("a stop (signal %d) waited %v for the checkpoint under way, and went ahead without it", r.Signal, waited.Round(time.Millisecond))
			}
			s.record(r.ID, audit.TypeStopped.New("Success", msg, map[string]string{"container_id": r.ID, "signal": fmt.Sprint(r.Signal), "waited": waited.Round(time.Millisecond).String()}), true)
		}
		if r.Signal == uint32(unix.SIGKILL) {
			if release := s.readyForKill(ctx, sb, r); release != nil {
				defer release()
			}
		}
		if sb.life.Now().SuspendedInto != "" {
			// Its suspend stopped it already: the stop asked for is done.
			if resp, err := s.next.Kill(ctx, r); err == nil {
				return resp, nil
			}
			return &types.Empty{}, nil
		}
	}
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

// Update applies a container's resource update (a pod's in-place resize,
// ctr task update) only under its role's limits: above them it is refused
// with the field named, and the trail records the refusal.
func (s *service) Update(ctx context.Context, r *task.UpdateTaskRequest) (*types.Empty, error) {
	sb, ok := s.sandboxes.of(r.ID)
	if !ok || sb.profile == nil {
		resp, err := s.next.Update(ctx, r)
		return resp, errgrpc.ToGRPC(err)
	}
	sb.ops.Lock()
	defer sb.ops.Unlock()
	res, err := linuxResources(r)
	if err == nil {
		err = sb.profile.BoundUpdate(res)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("container_id", r.ID).Warn("agentbox: resource update refused")
		s.record(r.ID, audit.TypeLimit.New("Failure", "resource update refused: "+err.Error(),
			map[string]string{"limit": "update", "container_id": r.ID}), true)
		return nil, errgrpc.ToGRPC(fmt.Errorf("agentbox: update of %s refused: %w", r.ID, err))
	}
	resp, err := s.next.Update(ctx, r)
	if err == nil && r.ID == sb.id {
		sb.tookLimits(res)
	}
	return resp, errgrpc.ToGRPC(err)
}

// linuxResources reads an update's resources: the OCI LinuxResources, as
// containerd sends them (JSON); anything else is refused, named.
func linuxResources(r *task.UpdateTaskRequest) (*specs.LinuxResources, error) {
	if r.Resources == nil || len(r.Resources.GetValue()) == 0 {
		return nil, nil
	}
	if !strings.HasSuffix(r.Resources.GetTypeUrl(), "/LinuxResources") {
		return nil, errkind.InvalidArgument(fmt.Errorf("resources of type %q: agentbox takes the OCI LinuxResources", r.Resources.GetTypeUrl()))
	}
	var res specs.LinuxResources
	if err := json.Unmarshal(r.Resources.GetValue(), &res); err != nil {
		return nil, errkind.InvalidArgument(fmt.Errorf("resources: %w", err))
	}
	return &res, nil
}

func (s *service) Wait(ctx context.Context, r *task.WaitRequest) (*task.WaitResponse, error) {
	resp, err := s.next.Wait(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

// Stats adds what gVisor's task service leaves out of a container's
// cgroup metrics: the OOM kill count (memory.oom_control in v1,
// memory.events in v2), from the OOM kills gVisor reported for the
// container's sandbox. gVisor enforces memory per sandbox, so each
// container of a pod reports its sandbox's count. The CRI's pod metrics
// (container_oom_events_total) read it.
//
// A running container's are read in the shim, from its sandbox's control
// socket (internal/sentrystats): gVisor's task service runs runsc for
// each call, and containerd asks each container once a second. When the
// sandbox does not answer so, gVisor's task service is asked.
func (s *service) Stats(ctx context.Context, r *task.StatsRequest) (*task.StatsResponse, error) {
	resp, err := s.inShimStats(ctx, r.ID)
	if resp == nil {
		if err != nil {
			log.G(ctx).WithError(err).WithField("container_id", r.ID).Debug("agentbox: stats asked of runsc")
		}
		resp, err = s.next.Stats(ctx, r)
	}
	if err != nil || resp == nil || resp.Stats == nil {
		return resp, errgrpc.ToGRPC(err)
	}
	sb, ok := s.sandboxes.of(r.ID)
	if !ok {
		return resp, nil
	}
	kills := sb.oomKills.Load()
	if stats, err := withOOMKills(resp.Stats, kills); err == nil {
		resp.Stats = stats
	} else {
		log.G(ctx).WithError(err).Debug("agentbox: stats left as gVisor gave them")
	}
	return resp, nil
}

// inShimStats is a running container's stats read from its sandbox (nil
// when it is not read so, with the reason when there is one).
func (s *service) inShimStats(ctx context.Context, id string) (*task.StatsResponse, error) {
	sb, ok := s.tasks.statsOf(id)
	if !ok {
		return nil, nil
	}
	stats, err := sb.Read(ctx, id)
	if err != nil {
		return nil, err
	}
	return &task.StatsResponse{Stats: stats}, nil
}

// withOOMKills sets the OOM kill count in cgroup v1 or v2 metrics where
// gVisor left it out.
func withOOMKills(stats *anypb.Any, kills uint64) (*anypb.Any, error) {
	m, err := typeurl.UnmarshalAny(stats)
	if err != nil {
		return nil, err
	}
	switch v := m.(type) {
	case *cgroup1stats.Metrics:
		if v.MemoryOomControl == nil {
			v.MemoryOomControl = &cgroup1stats.MemoryOomControl{}
		}
		v.MemoryOomControl.OomKill = kills
	case *cgroup2stats.Metrics:
		if v.MemoryEvents == nil {
			v.MemoryEvents = &cgroup2stats.MemoryEvents{}
		}
		v.MemoryEvents.OomKill = kills
	default:
		return nil, fmt.Errorf("metrics of type %T", m)
	}
	return typeurl.MarshalAnyToProto(m)
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
	// gVisor forgets a container when runsc deletes it, before the shim
	// has closed what it keeps for it (the root's rules, its trail).
	s.deleting.Wait()
	s.sd.Shutdown()
	return resp, nil
}

// killFrozenWait bounds how long a SIGKILL of one container of a sandbox
// waits for the sandbox's operation lock.
const killFrozenWait = 5 * time.Second

// readyForKill readies a sandbox for a SIGKILL: runsc signals no container
// of a paused sandbox. The root container's is the sandbox's stop: a Stop
// move (from whatever phase it is in), which resumes a frozen sandbox.
// Another container's, or an exec's, is forwarded under the sandbox's
// operation lock, so that no freeze comes between (the lock is released by
// the returned func): a frozen sandbox is thawed first, as an admin's thaw
// does. The lock is waited for at most killFrozenWait (a checkpoint holding
// it was waited for already); without it the kill goes as it is.
//
// +checklocksignore: the operation lock is handed to the caller, held,
// with the func that releases it (checklocks follows no lock across a
// return).
func (s *service) readyForKill(ctx context.Context, sb *sandboxState, r *task.KillRequest) (release func()) {
	if r.ID == sb.id && r.ExecID == "" {
		// From whatever phase it is in (the lifecycle refuses Stop only
		// when Ended, and stopMove says nothing of that): a checkpoint
		// begun after Kill waited for the last one (waitCheckpoint) must
		// not leave the sandbox running with its stop lost. Stop keeps the
		// first reason.
		s.stopMove(ctx, sb, "containerd")
		return nil
	}
	deadline := time.Now().Add(killFrozenWait)
	for !sb.ops.TryLock() {
		if time.Now().After(deadline) {
			log.G(ctx).Warn("agentbox: a kill of a sandbox's container went without its operation lock (held longer than the wait)")
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	if sb.life.Now().Phase == sandbox.Frozen {
		if d, err := s.unpause(ctx, sb); err != nil {
			log.G(ctx).WithError(err).Warn("agentbox: thawing a frozen sandbox to deliver a kill")
		} else {
			sb.audit.trail.Emit(audit.TypeThawed.New("Success", fmt.Sprintf("thawed after %v frozen, to be killed", d.Round(time.Millisecond)), nil), true)
		}
	}
	return sb.ops.Unlock
}
