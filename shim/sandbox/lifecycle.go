// Package sandbox is what the shim knows of one sandbox's life: the phase
// it is in and the moves between phases that are legal, its quarantine,
// its wall clock and its containers. It holds no handle on runsc, the
// network or the trail: the shim does those things, and asks this package
// first whether they may be done.
//
// # Lifecycle
//
// A sandbox is in one phase at a time:
//
//	            Started              Freeze
//	Creating ───────────► Running ◄────────► Frozen
//	   │                  │  ▲  │     Thaw    │ ▲
//	   │        Checkpoint│  │  │Stop     Stop│ │CheckpointDone
//	   │                  ▼  │  ▼             ▼ │(begun frozen)
//	   │      Checkpointing──┘ Stopping ◄─────┘ │
//	   │       │ │ CheckpointDone ▲   ▲         │
//	   │       │ └────────────────┼───┼─────────┘
//	   │       └──── Suspend ─────┘   │
//	   ├──────────── Abandon ─────────┘
//	   │                              │ Exit
//	   └───────── Exit ──────────► Ended ◄── Exit (from every phase)
//
// A checkpoint ends where it began: Running, or Frozen (containerd pauses
// a task to checkpoint it). Abandon is a restore that failed at start.
// How a sandbox came to stop is kept with its phase: the checkpoint a
// Suspend stopped it after, the checkpoint an Abandon gave up, the first
// Stop's reason (StopWallClock: its wall-clock limit).
//
// Quarantine is not a phase of its own: it is the state of the sandbox's
// egress, and it holds across a freeze and a checkpoint (a sandbox frozen
// while quarantined is still quarantined when it thaws; its checkpoint
// records it). Quarantine and Release are legal in Running and Frozen;
// Quarantine only when the sandbox is not quarantined, Release only when it
// is. Quarantine and Release are legal in Creating too: a sandbox whose root
// has not started yet can be cut off before it does. State names the whole:
// "quarantined" is Running with its egress cut.
//
// Every legal move is in the transitions table; anything else is refused
// with ErrIllegal, naming the phase and the event.
//
// # Locks
//
// Each type here has one mutex, and each is a leaf: it is held only to read
// or write its own fields, never while taking another lock or calling out
// (a WallClock's fire runs on the timer's goroutine, without its lock).
// The fields each guards are annotated (+checklocks), and make lint runs
// gVisor's checklocks analyzer over this package and the shim.
//
// The shim's order, outermost first:
//
//  1. a sandbox's operation lock (ops): it serializes what changes
//     enforcement (an admin's request, a live tightening, a checkpoint).
//     Every move but Stop, Exit and Abandon is made under it. Those three
//     come from limits, containerd and runsc, whatever an admin is doing:
//     they need no lock, and every phase but Ended allows a Stop. The
//     control socket's server takes no lock of its own around a request:
//     its handler takes ops;
//  2. the sandbox's pause lock (pauseMu): runsc's pause or resume with the
//     move it makes (Freeze, Thaw, a frozen sandbox's Stop), so that a
//     stop never resumes a sandbox a freeze under way then pauses;
//  3. any of these leaves, or the shim's registry or exit locks, one at a
//     time.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Phase is where a sandbox is in its life.
type Phase uint8

const (
	// Creating: the root container is being created; nothing runs yet.
	Creating Phase = iota
	// Running: the root container was started.
	Running
	// Frozen: runsc paused the whole sandbox; its wall clock is held.
	Frozen
	// Checkpointing: gVisor is writing the sandbox's memory out.
	Checkpointing
	// Stopping: its containers were killed (by an admin, a limit, a
	// failed quarantine or tightening, or a suspend); their exits are
	// awaited.
	Stopping
	// Ended: the root container exited or was deleted.
	Ended
)

var phaseNames = [...]string{"creating", "running", "frozen", "checkpointing", "stopping", "ended"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// Event is what moves a sandbox from one phase to another.
type Event uint8

const (
	// Started: the root container started (or was restored).
	Started Event = iota
	// Freeze: runsc paused the sandbox.
	Freeze
	// Thaw: runsc resumed it.
	Thaw
	// Checkpoint: a checkpoint begins.
	Checkpoint
	// CheckpointDone: a checkpoint that leaves the sandbox running ended
	// (made or failed).
	CheckpointDone
	// Suspend: a checkpoint that stops the sandbox was made.
	Suspend
	// Stop: its containers are being killed.
	Stop
	// Exit: the root container exited or was deleted.
	Exit
	// Quarantine: its egress was cut.
	Quarantine
	// Release: its egress was given back.
	Release
	// Abandon: its restore failed at start, and its sandbox process is
	// being killed.
	Abandon
)

var eventNames = [...]string{"start", "freeze", "thaw", "checkpoint", "checkpoint-done", "suspend", "stop", "exit", "quarantine", "release", "abandon"}

func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", e)
}

// Events lists every event, for tests and docs.
func Events() []Event {
	out := make([]Event, len(eventNames))
	for i := range out {
		out[i] = Event(i)
	}
	return out
}

// Phases lists every phase.
func Phases() []Phase {
	out := make([]Phase, len(phaseNames))
	for i := range out {
		out[i] = Phase(i)
	}
	return out
}

// transitions are the legal moves: from a phase, on an event, to a phase.
// An event a phase does not list is illegal in it. Quarantine and Release
// keep the phase; Next checks the quarantine itself. CheckpointDone goes
// back to the phase the checkpoint began in (Running, or Frozen:
// containerd pauses a task to checkpoint it): both are listed, and Next
// takes the one the status says.
var transitions = map[Phase]map[Event][]Phase{
	Creating:      {Started: {Running}, Stop: {Stopping}, Exit: {Ended}, Quarantine: {Creating}, Release: {Creating}, Abandon: {Stopping}},
	Running:       {Freeze: {Frozen}, Checkpoint: {Checkpointing}, Stop: {Stopping}, Exit: {Ended}, Quarantine: {Running}, Release: {Running}},
	Frozen:        {Thaw: {Running}, Checkpoint: {Checkpointing}, Stop: {Stopping}, Exit: {Ended}, Quarantine: {Frozen}, Release: {Frozen}},
	Checkpointing: {CheckpointDone: {Running, Frozen}, Suspend: {Stopping}, Stop: {Stopping}, Exit: {Ended}},
	Stopping:      {Stop: {Stopping}, Exit: {Ended}},
	Ended:         {},
}

// ErrIllegal is the error of an event a sandbox's state does not allow.
var ErrIllegal = errors.New("not allowed")

// Next is the phase a sandbox in state st moves to on ev; an illegal
// move's error wraps ErrIllegal and says why.
func Next(st Status, ev Event) (Phase, error) {
	targets, ok := transitions[st.Phase][ev]
	switch {
	case !ok:
		return st.Phase, fmt.Errorf("%w: the sandbox is %s, and cannot %s", ErrIllegal, st.Phase, ev)
	case ev == Quarantine && st.Quarantined():
		return st.Phase, fmt.Errorf("%w: the sandbox is already quarantined", ErrIllegal)
	case ev == Release && !st.Quarantined():
		return st.Phase, fmt.Errorf("%w: the sandbox is not quarantined", ErrIllegal)
	}
	next := targets[0]
	if ev == CheckpointDone {
		next = st.CheckpointFrom
		if !slices.Contains(targets, next) {
			return st.Phase, fmt.Errorf("%w: a checkpoint that began %s cannot return there", ErrIllegal, next)
		}
	}
	return next, nil
}

// Status is a sandbox's state at one moment.
type Status struct {
	Phase Phase
	// Quarantine is the quarantine's reason ("" when the sandbox is not
	// quarantined), since QuarantinedAt.
	Quarantine    string
	QuarantinedAt time.Time
	// FrozenAt is when it was frozen (zero unless Frozen).
	FrozenAt time.Time
	// CheckpointFrom is the phase the last checkpoint began in.
	CheckpointFrom Phase
	// How it came to stop, once it did: the checkpoint a suspend stopped
	// it after, the checkpoint whose restore failed, or the first stop's
	// reason (StopWallClock: its wall-clock limit).
	SuspendedInto, RestoreFailed, StopReason string
}

// StopWallClock is the reason of a stop by the wall-clock limit.
const StopWallClock = "wallClock"

// Quarantined reports whether the sandbox's egress is cut.
func (s Status) Quarantined() bool { return s.QuarantinedAt != (time.Time{}) }

// State names the whole state, as `agentbox sandbox status` shows it:
// running, quarantined, frozen, checkpointing, stopping...
func (s Status) State() string {
	if s.Phase == Running && s.Quarantined() {
		return "quarantined"
	}
	return s.Phase.String()
}

// Lifecycle is one sandbox's state; it moves only by the transitions
// table. Safe for concurrent use; its zero value is a sandbox Creating.
type Lifecycle struct {
	mu sync.Mutex
	// +checklocks:mu
	st Status
	// changed is closed, and replaced, at each move (nil until a waiter
	// asks for it).
	// +checklocks:mu
	changed chan struct{}
}

// Now returns the sandbox's state.
func (l *Lifecycle) Now() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// Can says whether ev is legal now (nil) or why not, without moving.
// A caller that does the work between Can and Fire holds the sandbox's
// operation lock, so that no other operation moves it meanwhile; Stop and
// Exit, which come from limits and runsc, may still.
func (l *Lifecycle) Can(ev Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := Next(l.st, ev)
	return err
}

// Fire moves the sandbox on ev and returns its state before. reason is a
// quarantine's, a stop's, or the checkpoint's of a suspend or an abandoned
// restore (ignored otherwise).
func (l *Lifecycle) Fire(ev Event, reason string) (Status, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	before := l.st
	next, err := Next(l.st, ev)
	if err != nil {
		return before, err
	}
	now := time.Now()
	switch ev {
	case Quarantine:
		l.st.Quarantine, l.st.QuarantinedAt = reason, now
	case Release:
		l.st.Quarantine, l.st.QuarantinedAt = "", time.Time{}
	case Freeze:
		l.st.FrozenAt = now
	case Thaw:
		l.st.FrozenAt = time.Time{}
	case Checkpoint:
		l.st.CheckpointFrom = l.st.Phase
	case Suspend:
		l.st.SuspendedInto = reason
	case Abandon:
		l.st.RestoreFailed = reason
	case Stop:
		if l.st.StopReason == "" {
			l.st.StopReason = reason
		}
	}
	l.st.Phase = next
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return before, nil
}

// Wait waits, at most d or until ctx ends, for the sandbox's state to
// satisfy cond, and returns it and whether it does.
func (l *Lifecycle) Wait(ctx context.Context, d time.Duration, cond func(Status) bool) (Status, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		l.mu.Lock()
		st := l.st
		if cond(st) {
			l.mu.Unlock()
			return st, true
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return st, false
		case <-ctx.Done():
			return st, false
		}
	}
}
