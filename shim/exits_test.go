package shim

import (
	"testing"
	"time"

	runc "github.com/containerd/go-runc"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"
)

// harness wires an exitRepair between two channels standing in for the
// runsc wait goroutines and the task service.
type harness struct {
	x      *exitRepair
	reaped chan runc.Exit
	in     chan proc.Exit
	out    chan proc.Exit
}

func newHarness() *harness {
	h := &harness{x: newExitRepair(), reaped: make(chan runc.Exit), in: make(chan proc.Exit), out: make(chan proc.Exit, 8)}
	h.x.toService = h.out
	go h.x.collect(h.reaped)
	go h.x.forward(h.in, h.out)
	return h
}

func (h *harness) next(t *testing.T) proc.Exit {
	t.Helper()
	select {
	case e := <-h.out:
		return e
	case <-time.After(reapedWaitTimeout + 5*time.Second):
		t.Fatal("no exit forwarded")
		return proc.Exit{}
	}
}

// want says the next exit forwarded is id's with status.
func (h *harness) want(t *testing.T, id string, status int) {
	t.Helper()
	if e := h.next(t); e.ID != id || e.Status != status {
		t.Fatalf("forwarded %+v, want %s with status %d", e, id, status)
	}
}

// none says no exit is forwarded within a moment.
func (h *harness) none(t *testing.T) {
	t.Helper()
	select {
	case e := <-h.out:
		t.Fatalf("forwarded %+v, want nothing more", e)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestExitRepair(t *testing.T) {
	t.Run("failed wait after sandbox reaped gets the reaped status", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.reaped <- runc.Exit{Pid: 100, Status: 7}
		h.in <- proc.Exit{ID: "c1", Status: runscWaitFailed}
		if e := h.next(t); e.Status != 7 || e.ID != "c1" {
			t.Fatalf("got %+v, want status 7", e)
		}
	})
	t.Run("failed wait before sandbox reaped waits for it", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.in <- proc.Exit{ID: "c1", Status: runscWaitFailed}
		time.Sleep(50 * time.Millisecond)
		h.reaped <- runc.Exit{Pid: 100, Status: 137}
		if e := h.next(t); e.Status != 137 {
			t.Fatalf("got %+v, want 137", e)
		}
	})
	t.Run("sandbox reaped before it was tracked", func(t *testing.T) {
		h := newHarness()
		h.reaped <- runc.Exit{Pid: 100, Status: 3}
		h.x.track("c1", 100)
		h.in <- proc.Exit{ID: "c1", Status: runscWaitFailed}
		if e := h.next(t); e.Status != 3 {
			t.Fatalf("got %+v, want 3", e)
		}
	})
	t.Run("successful wait is untouched", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.reaped <- runc.Exit{Pid: 100, Status: 9}
		h.in <- proc.Exit{ID: "c1", Status: 0}
		if e := h.next(t); e.Status != 0 {
			t.Fatalf("got %+v, want 0 (runsc wait's own answer)", e)
		}
	})
	t.Run("containers that join a sandbox are untouched", func(t *testing.T) {
		h := newHarness()
		h.reaped <- runc.Exit{Pid: 100, Status: 9}
		h.in <- proc.Exit{ID: "sub", Status: runscWaitFailed}
		if e := h.next(t); e.Status != runscWaitFailed {
			t.Fatalf("got %+v", e)
		}
	})
	t.Run("other exits are not held up by a pending repair", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.in <- proc.Exit{ID: "c1", Status: runscWaitFailed}
		h.in <- proc.Exit{ID: "exec1", Status: 4}
		h.want(t, "exec1", 4)
		h.reaped <- runc.Exit{Pid: 100, Status: 5}
		h.want(t, "c1", 5)
	})
	t.Run("a root whose start failed is reported when its sandbox is reaped", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.x.startFailed("c1")
		h.x.startFailed("c1") // reported once however often it is said
		h.reaped <- runc.Exit{Pid: 100, Status: 137}
		h.want(t, "c1", 137)
		h.none(t)
	})
	t.Run("a root whose start failed after its sandbox was reaped", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.reaped <- runc.Exit{Pid: 100, Status: 1}
		h.x.startFailed("c1")
		h.want(t, "c1", 1)
	})
	t.Run("a start retried with success leaves the report to runsc wait", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.x.startFailed("c1")
		h.x.started("c1")
		h.reaped <- runc.Exit{Pid: 100, Status: 0}
		h.in <- proc.Exit{ID: "c1", Status: 0}
		h.want(t, "c1", 0)
		h.none(t)
	})
	t.Run("a failed start of what is no sandbox root reports nothing", func(t *testing.T) {
		h := newHarness()
		h.x.startFailed("sub")
		h.reaped <- runc.Exit{Pid: 100, Status: 0}
		h.none(t)
	})
	t.Run("forget drops the sandbox pid", func(t *testing.T) {
		h := newHarness()
		h.x.track("c1", 100)
		h.reaped <- runc.Exit{Pid: 100, Status: 5}
		h.x.forget("c1")
		h.x.mu.Lock()
		_, kept := h.x.reaped[100]
		h.x.mu.Unlock()
		if kept {
			t.Fatal("reaped status kept after forget")
		}
	})
}

func TestExitRepairBoundsUntrackedPids(t *testing.T) {
	h := newHarness()
	for pid := 1; pid <= 3*recentReaped; pid++ {
		h.reaped <- runc.Exit{Pid: pid, Status: 0}
	}
	h.x.mu.Lock()
	n := len(h.x.reaped)
	h.x.mu.Unlock()
	if n > recentReaped {
		t.Fatalf("keeps %d untracked statuses, want at most %d", n, recentReaped)
	}
}
