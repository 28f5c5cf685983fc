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
//	   │                  │  ▲  │     Thaw     │
//	   │        Checkpoint│  │  │Stop          │Stop
//	   │                  ▼  │  ▼              ▼
//	   │        Checkpointing─┘ Stopping ◄──────┘
//	   │     CheckpointDone│       │
//	   │           Suspend └──────►│
//	   │                           │ Exit
//	   └───────── Exit ──────────► Ended ◄── Exit (from every phase)
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
// The shim's order is then: a sandbox's operation lock (it serializes what
// changes enforcement: an admin's request, a live tightening, a
// checkpoint), then any of these leaves, or its registry's map lock, one at
// a time.
package sandbox

import (
	"errors"
	"fmt"
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
)

var eventNames = [...]string{"start", "freeze", "thaw", "checkpoint", "checkpoint-done", "suspend", "stop", "exit", "quarantine", "release"}

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
// keep the phase; Next checks the quarantine itself.
var transitions = map[Phase]map[Event]Phase{
	Creating: {Started: Running, Exit: Ended, Quarantine: Creating, Release: Creating},
	Running:  {Freeze: Frozen, Checkpoint: Checkpointing, Stop: Stopping, Exit: Ended, Quarantine: Running, Release: Running},
	Frozen:   {Thaw: Running, Checkpoint: Checkpointing, Stop: Stopping, Exit: Ended, Quarantine: Frozen, Release: Frozen},
	// CheckpointDone goes back to the phase the checkpoint began in
	// (Running, or Frozen: containerd pauses a task to checkpoint it);
	// the table's Running is Next's answer when that is not known.
	Checkpointing: {CheckpointDone: Running, Suspend: Stopping, Stop: Stopping, Exit: Ended},
	Stopping:      {Stop: Stopping, Exit: Ended},
	Ended:         {},
}

// ErrIllegal is the error of an event a sandbox's state does not allow.
var ErrIllegal = errors.New("not allowed")

// Next is the phase a sandbox in phase p, quarantined or not, moves to on
// ev; an illegal move's error wraps ErrIllegal and says why.
func Next(p Phase, quarantined bool, ev Event) (Phase, error) {
	next, ok := transitions[p][ev]
	switch {
	case !ok:
		return p, fmt.Errorf("%w: the sandbox is %s, and cannot %s", ErrIllegal, p, ev)
	case ev == Quarantine && quarantined:
		return p, fmt.Errorf("%w: the sandbox is already quarantined", ErrIllegal)
	case ev == Release && !quarantined:
		return p, fmt.Errorf("%w: the sandbox is not quarantined", ErrIllegal)
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
}

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
	st Status // guarded by mu
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
	_, err := Next(l.st.Phase, l.st.Quarantined(), ev)
	return err
}

// Fire moves the sandbox on ev and returns its state before. reason is a
// quarantine's (ignored otherwise).
func (l *Lifecycle) Fire(ev Event, reason string) (Status, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	before := l.st
	next, err := Next(l.st.Phase, l.st.Quarantined(), ev)
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
	case CheckpointDone:
		next = l.st.CheckpointFrom
	}
	l.st.Phase = next
	return before, nil
}
