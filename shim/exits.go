package shim

import (
	"sync"
	"time"

	runc "github.com/containerd/go-runc"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"
)

// runscWaitFailed is the status gVisor's task service reports for a
// container when `runsc wait` fails (proc.internalErrorCode).
const runscWaitFailed = 128

// reapedWaitTimeout bounds how long a failed `runsc wait` waits for the
// sandbox process's own exit to be reaped.
const reapedWaitTimeout = 10 * time.Second

// exitRepair restores the exit status of sandbox-root containers that
// gVisor's task service loses.
//
// For a short-lived container, `runsc wait` often runs after the sandbox has
// already gone ("sandbox no longer running and its exit status is
// unavailable") and the task service reports 128. The sandbox process itself
// exits with the root container's status, and as the shim is its child
// subreaper, containerd's reaper hands us that status. exitRepair sits
// between the runsc wait goroutines (proc.ExitCh) and the task service, and
// replaces a failed wait's 128 with the reaped status of the sandbox pid.
type exitRepair struct {
	mu sync.Mutex
	// roots maps a sandbox-root container id to its sandbox pid.
	// +checklocks:mu
	roots map[string]int
	// reaped holds reaped statuses of sandbox pids in roots, and of a few
	// recent other pids in case a sandbox dies before it is registered.
	// +checklocks:mu
	reaped map[int]int
	// +checklocks:mu
	recent []int
	// waiters are woken when a pid is reaped.
	// +checklocks:mu
	waiters map[int][]chan int
	// unwaited holds the sandbox-root containers whose start failed: no
	// `runsc wait` reports them, their sandbox pid's reaping does.
	// +checklocks:mu
	unwaited map[string]bool
	// adjust, when set, may rewrite every exit on its way to the task
	// service (the wall-clock limit's status).
	adjust func(*proc.Exit)
	// toService is the task service's exit source, set by install.
	toService chan<- proc.Exit
}

const recentReaped = 256

func newExitRepair() *exitRepair {
	return &exitRepair{roots: map[string]int{}, reaped: map[int]int{}, waiters: map[int][]chan int{}, unwaited: map[string]bool{}}
}

// install puts the repair between gVisor's runsc wait goroutines and the
// task service built by build. It must run before any container starts.
func (x *exitRepair) install(build func() error, reaped chan runc.Exit) error {
	toService := make(chan proc.Exit, cap(proc.ExitCh))
	fromRunsc := make(chan proc.Exit, cap(proc.ExitCh))
	proc.ExitCh = toService // captured by the task service as its exit source
	if err := build(); err != nil {
		return err
	}
	proc.ExitCh = fromRunsc // where runsc wait goroutines send from now on
	x.toService = toService
	go x.collect(reaped)
	go x.forward(fromRunsc, toService)
	return nil
}

// track registers a sandbox-root container and its sandbox pid.
func (x *exitRepair) track(id string, pid int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.roots[id] = pid
}

// livePid is the sandbox pid of a sandbox-root container while it has not
// been reaped.
func (x *exitRepair) livePid(id string) (int, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	pid, ok := x.roots[id]
	if !ok || pid <= 0 {
		return 0, false
	}
	if _, dead := x.reaped[pid]; dead {
		return 0, false
	}
	return pid, true
}

// startFailed reports the exit of a sandbox-root container whose start
// failed, once its sandbox pid is reaped. gVisor's task service waits for
// a container (`runsc wait`) only after its start succeeded: a root whose
// start failed or was cancelled (a CRI caller's timeout while runsc starts
// the sandbox) was never reported exited, even after its sandbox was
// killed, and every Wait on it (containerd's stop and forced delete)
// blocked for good. The task service takes the exit as any other: the
// container is stopped, its Wait returns, it can be deleted.
func (x *exitRepair) startFailed(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	pid, ok := x.roots[id]
	if !ok || pid <= 0 || x.unwaited[id] {
		return
	}
	x.unwaited[id] = true
	w := x.whenReapedLocked(pid)
	go func() {
		st := <-w
		x.mu.Lock()
		report := x.unwaited[id]
		delete(x.unwaited, id)
		x.mu.Unlock()
		if report {
			x.toService <- x.adjusted(proc.Exit{Timestamp: time.Now(), ID: id, Status: st})
		}
	}()
}

// started says a root's start succeeded (a retry after a failed one): its
// `runsc wait` reports it now, and the reaping must not report it again.
func (x *exitRepair) started(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.unwaited, id)
}

// forget drops a container once it is deleted.
func (x *exitRepair) forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.unwaited, id)
	if pid, ok := x.roots[id]; ok {
		delete(x.roots, id)
		delete(x.reaped, pid)
	}
}

func (x *exitRepair) collect(reaped chan runc.Exit) {
	for e := range reaped {
		x.mu.Lock()
		x.reaped[e.Pid] = e.Status
		if !x.isRootPidLocked(e.Pid) {
			x.recent = append(x.recent, e.Pid)
			if len(x.recent) > recentReaped {
				old := x.recent[0]
				x.recent = x.recent[1:]
				if !x.isRootPidLocked(old) {
					delete(x.reaped, old)
				}
			}
		}
		for _, w := range x.waiters[e.Pid] {
			w <- e.Status
		}
		delete(x.waiters, e.Pid)
		x.mu.Unlock()
	}
}

// +checklocks:x.mu
func (x *exitRepair) isRootPidLocked(pid int) bool {
	for _, p := range x.roots {
		if p == pid {
			return true
		}
	}
	return false
}

func (x *exitRepair) forward(in <-chan proc.Exit, out chan<- proc.Exit) {
	for e := range in {
		x.mu.Lock()
		pid, isRoot := x.roots[e.ID]
		x.mu.Unlock()
		if !isRoot || e.Status != runscWaitFailed {
			out <- x.adjusted(e)
			continue
		}
		go func(e proc.Exit) {
			if st, ok := x.waitReaped(pid, reapedWaitTimeout); ok {
				e.Status = st
			}
			out <- x.adjusted(e)
		}(e)
	}
}

func (x *exitRepair) adjusted(e proc.Exit) proc.Exit {
	if x.adjust != nil {
		x.adjust(&e)
	}
	return e
}

// whenReapedLocked is a channel that receives pid's reaped status: at once
// if it was reaped already, else when it is.
//
// +checklocks:x.mu
func (x *exitRepair) whenReapedLocked(pid int) chan int {
	w := make(chan int, 1)
	if st, ok := x.reaped[pid]; ok {
		w <- st
	} else {
		x.waiters[pid] = append(x.waiters[pid], w)
	}
	return w
}

// waitReaped returns the reaped status of pid, waiting up to timeout.
func (x *exitRepair) waitReaped(pid int, timeout time.Duration) (int, bool) {
	x.mu.Lock()
	w := x.whenReapedLocked(pid)
	x.mu.Unlock()
	select {
	case st := <-w:
		return st, true
	case <-time.After(timeout):
		return 0, false
	}
}
