package shim

// Suspend: a sandbox stopped once its image is committed, a stop held
// while a suspend may be about to begin or a checkpoint is under way, and
// the forced deletes and kills a suspended sandbox needs.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/shim/sandbox"
)

// stopSuspended stops a sandbox whose suspend image is committed, still
// frozen: its sandbox process is killed (as an OOM kill does), so that no
// task of it runs after the image was taken. Only when that process cannot
// be told apart safely does gVisor resume its kernel to kill every
// container (runsc signals no container of a paused sandbox): its tasks
// then run for milliseconds, and what they do is not in the image.
func (s *service) stopSuspended(ctx context.Context, sb *sandboxState) {
	err := killSandboxProcess(s.exits, sb.id)
	if err == nil {
		return
	}
	log.G(ctx).WithError(err).Warn("agentbox: killing a suspended sandbox's process; resuming it to kill its containers instead")
	if _, err := s.next.Resume(ctx, &task.ResumeRequest{ID: sb.id}); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: resuming a suspended sandbox to stop it")
	}
	s.killMembers(ctx, sb)
}

// forceDelete has runsc delete a container of a sandbox stopSuspended
// killed. gVisor's task service then finds it gone, as it expects of a
// checkpointed container.
func forceDelete(ctx context.Context, cfg *config.Config, containerdAddress, id string) {
	root := filepath.Join(cfg.RunscRoot(containerdAddress), namespaceOf(ctx))
	out, err := exec.CommandContext(ctx, cfg.Runsc.Binary, "--root", root, "delete", "--force", id).CombinedOutput()
	if err != nil {
		log.G(ctx).WithError(err).WithField("container_id", id).Warnf("agentbox: runsc delete --force of a suspended container: %s", briefError(string(out)))
	}
}

// killSandboxProcess sends SIGKILL to the sandbox process of root
// container id, through a pidfd, once /proc says that process is the
// shim's own child (the shim is the sandbox's subreaper) and not reaped.
func killSandboxProcess(x *exitRepair, id string) error {
	pid, ok := x.livePid(id)
	if !ok {
		return errors.New("no live sandbox process is known")
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	defer func() { _ = unix.Close(fd) }()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	if ppid := procField(string(status), "PPid"); ppid != fmt.Sprint(os.Getpid()) {
		return fmt.Errorf("process %d's parent is %s, not this shim", pid, ppid)
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// briefError is runsc's error message without what makes it unreadable:
// only its first line (a stack trace may follow), and each ": "-separated
// part longer than 160 bytes (a dump of the object gVisor failed on can
// be megabytes) cut to its start and size. The cause, usually the last part,
// stays.
func briefError(msg string) string {
	msg, _, _ = strings.Cut(msg, "\n")
	parts := strings.Split(msg, ": ")
	for i, p := range parts {
		if len(p) > 160 {
			parts[i] = strings.ToValidUTF8(p[:64], "") + fmt.Sprintf("... [%d bytes left out]", len(p)-64)
		}
	}
	out := strings.TrimRight(strings.Join(parts, ": "), ": ")
	if len(out) > 1024 {
		out = strings.ToValidUTF8(out[:1024], "") + " [...]"
	}
	return out
}

// procField is a field of a /proc/PID/status file.
func procField(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// suspendHold is how long a stop of an agent-sandbox Sandbox's pod whose
// role keeps memory on suspend waits for the node agent's suspend to begin:
// the Sandbox's controller deletes the pod as the node agent, seeing the
// same change, asks for the checkpoint.
const suspendHold = 5 * time.Second

// holdForSuspend holds a stop of a pod that a suspend may be about to
// save (its role keeps memory, and the node agent linked it to a Sandbox)
// until a checkpoint begins, at most suspendHold. Any other stop goes at
// once.
func holdForSuspend(ctx context.Context, sb *sandboxState) {
	if sb.profile == nil || sb.profile.Suspend != policy.SuspendMemory || sb.owner.Load() == nil || sb.life.Now().SuspendedInto != "" {
		return
	}
	sb.life.Wait(ctx, suspendHold, func(st sandbox.Status) bool {
		return st.Phase == sandbox.Checkpointing || st.SuspendedInto != "" || st.Phase == sandbox.Ended
	})
}

// checkpointStopWait bounds how long a kill waits for a checkpoint under
// way (the kubelet's stop of a pod being suspended).
const checkpointStopWait = 60 * time.Second

// waitCheckpoint holds a kill while the sandbox is being checkpointed, at
// most checkpointStopWait: a suspend's image is then complete before the
// stop, and a snapshot is not cut short. It says how long it waited.
func waitCheckpoint(ctx context.Context, sb *sandboxState) (time.Duration, bool) {
	if sb.life.Now().Phase != sandbox.Checkpointing {
		return 0, true
	}
	start := time.Now()
	_, ok := sb.life.Wait(ctx, checkpointStopWait, func(st sandbox.Status) bool { return st.Phase != sandbox.Checkpointing })
	return time.Since(start), ok
}
