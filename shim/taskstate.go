package shim

import (
	"sync"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/protobuf"

	"agentbox.dev/agentbox/internal/sentrystats"
)

// runningTasks holds the containers created or started and not exited,
// and answers their State and Stats without runsc.
//
// gVisor's task service answers every State by running `runsc state`
// (about 30 ms of CPU), and containerd asks for it after every Start, and
// for a pod's container also between its Create and its Start (the CRI's
// NRI adaptation reads the new task's pid): three runsc processes on each
// CRI pod's start path. What that answer says the shim knows itself: the
// pid (Create's answer, which Start's repeats), the bundle and stdio (the
// Create request), and whether it was started (no exit seen, not deleted,
// and for a created one neither signalled nor being started). Only those
// cases are answered here, and only while the container's sandbox runs
// (not creating, frozen, checkpointing or stopping): anything else, and
// every exec'd process, is asked of gVisor's task service as before. Their
// Stats are read from their sandbox's control socket
// (internal/sentrystats), for the same reason: containerd's CRI asks every
// container once a second.
type runningTasks struct {
	mu sync.Mutex
	// created holds what a container's Create said, until it starts;
	// its pid is 0 until the Create succeeded, and again once the
	// container was signalled or its start began (unsure).
	// +checklocks:mu
	created map[string]taskState
	// running holds each container started and not exited.
	// +checklocks:mu
	running map[string]taskState
}

// taskState is what a running container's State says, and where its
// stats are read.
type taskState struct {
	bundle, stdin, stdout, stderr string
	terminal                      bool
	pid                           uint32
	// stats is its sandbox's, when the shim reads them (nil: gVisor's).
	stats *sentrystats.Sandbox
}

// create remembers what a container's State will say of its bundle,
// stdio and pid (its Create's answer).
func (t *runningTasks) create(r *task.CreateTaskRequest, pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.created == nil {
		t.created = map[string]taskState{}
	}
	t.created[r.ID] = taskState{bundle: r.Bundle, stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal, pid: pid}
}

// unsure notes that a container not yet started may be leaving that
// state (signalled, or being started): until it is seen started, its
// State is runsc's to say, which gVisor's task service answers only once
// a start under way has ended.
func (t *runningTasks) unsure(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st, ok := t.created[id]; ok {
		st.pid = 0
		t.created[id] = st
	}
}

// start marks a created container running with its pid, its stats read
// from sb when that is set.
func (t *runningTasks) start(id string, pid uint32, sb *sentrystats.Sandbox) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.created[id]
	if !ok {
		return
	}
	delete(t.created, id)
	st.pid, st.stats = pid, sb
	if t.running == nil {
		t.running = map[string]taskState{}
	}
	t.running[id] = st
}

// end forgets a container that exited or was deleted.
func (t *runningTasks) end(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.created, id)
	delete(t.running, id)
}

// state is the State of a running or created container, as gVisor's task
// service would answer it, if it is one.
func (t *runningTasks) state(id string) (*task.StateResponse, bool) {
	t.mu.Lock()
	status := tasktypes.Status_RUNNING
	st, ok := t.running[id]
	if !ok {
		status = tasktypes.Status_CREATED
		st, ok = t.created[id]
		ok = ok && st.pid != 0
	}
	t.mu.Unlock()
	if !ok {
		return nil, false
	}
	return &task.StateResponse{
		ID:       id,
		Bundle:   st.bundle,
		Pid:      st.pid,
		Status:   status,
		Stdin:    st.stdin,
		Stdout:   st.stdout,
		Stderr:   st.stderr,
		Terminal: st.terminal,
		// gVisor's answer for a process that has not exited.
		ExitedAt: protobuf.ToTimestamp(time.Time{}),
	}, true
}

// statsOf is where a running container's stats are read, if it is one
// whose stats the shim reads.
func (t *runningTasks) statsOf(id string) (sentrystats.Sandbox, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.running[id]
	if !ok || st.stats == nil {
		return sentrystats.Sandbox{}, false
	}
	return *st.stats, true
}
