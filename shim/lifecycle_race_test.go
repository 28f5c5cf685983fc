package shim

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/api/runtime/task/v2"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/shim/sandbox"
)

// pausable stands in for runsc's task service: it pauses, resumes and
// signals, and counts a signal sent while paused (runsc would deliver
// none: a kill that would hang a stop).
type pausable struct {
	extension.TaskServiceExt
	paused           atomic.Bool
	killsWhilePaused atomic.Int64
}

func (p *pausable) Pause(context.Context, *task.PauseRequest) (*types.Empty, error) {
	p.paused.Store(true)
	return &types.Empty{}, nil
}

func (p *pausable) Resume(context.Context, *task.ResumeRequest) (*types.Empty, error) {
	p.paused.Store(false)
	return &types.Empty{}, nil
}

func (p *pausable) Kill(_ context.Context, r *task.KillRequest) (*types.Empty, error) {
	if p.paused.Load() && r.Signal == uint32(unix.SIGKILL) {
		p.killsWhilePaused.Add(1)
	}
	return &types.Empty{}, nil
}

// TestLifecycleUnderConcurrentOperations drives, at once and under -race,
// what moves a sandbox: an admin's freezes and thaws and quarantines, a
// checkpoint, kills of a member container (containerd's), and at last the
// root's stop. Every move goes through the lifecycle (freezes and thaws
// under the operation lock; a checkpoint holding it), no SIGKILL reaches a
// paused sandbox, and the sandbox ends Stopping, however they interleave.
func TestLifecycleUnderConcurrentOperations(t *testing.T) {
	fs, err := audit.NewFileSink(t.TempDir(), "sb", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	trail := audit.NewTrail(audit.Meta{Sandbox: "sb"}, fs)
	defer trail.Close(&audit.Record{Event: audit.EventSandboxEnd})
	next := &pausable{}
	s := &service{next: next, sandboxes: newRegistry(), shimCtx: context.Background()}
	sb := newSandboxState("sb", nil, nil, trail)
	s.sandboxes.addSandbox(sb)
	s.sandboxes.join("sb", "member")
	if err := sb.fire(context.Background(), sandbox.Started, ""); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loop := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f(i)
			}
		}()
	}
	admin := func(f func()) {
		sb.ops.Lock()
		defer sb.ops.Unlock()
		f()
	}
	loop(func(int) { admin(func() { s.freeze(ctx, sb, map[string]string{}) }) })
	loop(func(int) { admin(func() { s.thaw(ctx, sb, map[string]string{}) }) })
	loop(func(i int) {
		admin(func() {
			if i%2 == 0 {
				sb.fire(ctx, sandbox.Quarantine, "test")
			} else {
				sb.fire(ctx, sandbox.Release, "")
			}
		})
	})
	loop(func(int) {
		admin(func() {
			if _, err := sb.life.Fire(sandbox.Checkpoint, ""); err == nil {
				time.Sleep(time.Millisecond)
				sb.fire(ctx, sandbox.CheckpointDone, "")
			}
		})
	})
	loop(func(int) {
		s.Kill(ctx, &task.KillRequest{ID: "member", Signal: uint32(unix.SIGKILL)})
	})
	time.Sleep(300 * time.Millisecond)
	// The root's stop, while all that goes on.
	if _, err := s.Kill(ctx, &task.KillRequest{ID: "sb", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	st := sb.life.Now()
	if st.Phase != sandbox.Stopping || st.StopReason != "containerd" {
		t.Fatalf("after the root's stop: %+v", st)
	}
	if n := next.killsWhilePaused.Load(); n != 0 {
		t.Fatalf("%d SIGKILLs reached a paused sandbox", n)
	}
	if next.paused.Load() {
		t.Fatal("the stopped sandbox is left paused")
	}
}
