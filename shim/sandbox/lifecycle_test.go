package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// legal is every move a sandbox may make, written out by hand apart from
// the transitions table: "from [quarantined] --event--> to".
var legal = map[string]bool{
	"creating --start--> running":                true,
	"creating --exit--> ended":                   true,
	"creating --quarantine--> creating":          true,
	"creating quarantined --start--> running":    true,
	"creating quarantined --exit--> ended":       true,
	"creating quarantined --release--> creating": true,
	"creating --abandon--> stopping":             true,
	"creating quarantined --abandon--> stopping": true,
	"creating --stop--> stopping":                true,
	"creating quarantined --stop--> stopping":    true,

	"running --freeze--> frozen":                        true,
	"running --checkpoint--> checkpointing":             true,
	"running --stop--> stopping":                        true,
	"running --exit--> ended":                           true,
	"running --quarantine--> running":                   true,
	"running quarantined --freeze--> frozen":            true,
	"running quarantined --checkpoint--> checkpointing": true,
	"running quarantined --stop--> stopping":            true,
	"running quarantined --exit--> ended":               true,
	"running quarantined --release--> running":          true,
	"frozen --thaw--> running":                          true,
	"frozen --checkpoint--> checkpointing":              true,
	"frozen quarantined --checkpoint--> checkpointing":  true,
	"frozen --stop--> stopping":                         true,
	"frozen --exit--> ended":                            true,
	"frozen --quarantine--> frozen":                     true,
	"frozen quarantined --thaw--> running":              true,
	"frozen quarantined --stop--> stopping":             true,
	"frozen quarantined --exit--> ended":                true,
	"frozen quarantined --release--> frozen":            true,
	// A checkpoint ends where it began: running, or frozen.
	"checkpointing from running --checkpoint-done--> running":             true,
	"checkpointing from frozen --checkpoint-done--> frozen":               true,
	"checkpointing from running quarantined --checkpoint-done--> running": true,
	"checkpointing from frozen quarantined --checkpoint-done--> frozen":   true,
	"checkpointing from running --suspend--> stopping":                    true,
	"checkpointing from frozen --suspend--> stopping":                     true,
	"checkpointing from running --stop--> stopping":                       true,
	"checkpointing from frozen --stop--> stopping":                        true,
	"checkpointing from running --exit--> ended":                          true,
	"checkpointing from frozen --exit--> ended":                           true,
	"checkpointing from running quarantined --suspend--> stopping":        true,
	"checkpointing from frozen quarantined --suspend--> stopping":         true,
	"checkpointing from running quarantined --stop--> stopping":           true,
	"checkpointing from frozen quarantined --stop--> stopping":            true,
	"checkpointing from running quarantined --exit--> ended":              true,
	"checkpointing from frozen quarantined --exit--> ended":               true,
	"stopping --stop--> stopping":                                         true,
	"stopping --exit--> ended":                                            true,
	"stopping quarantined --stop--> stopping":                             true,
	"stopping quarantined --exit--> ended":                                true,
	// Ended allows nothing.
}

// Every phase, quarantined or not, on every event: the legal moves land
// where the list says, and every other is refused with ErrIllegal and the
// sandbox stays where it was.
func TestTransitionTable(t *testing.T) {
	seen := 0
	for _, p := range Phases() {
		origins := []Phase{Running}
		if p == Checkpointing {
			origins = []Phase{Running, Frozen}
		}
		for _, origin := range origins {
			for _, q := range []bool{false, true} {
				for _, ev := range Events() {
					from := p.String()
					if p == Checkpointing {
						from += " from " + origin.String()
					}
					st := Status{Phase: p, CheckpointFrom: origin}
					if q {
						from += " quarantined"
						st.QuarantinedAt = time.Unix(1, 0)
					}
					next, err := Next(st, ev)
					move := fmt.Sprintf("%s --%s--> %s", from, ev, next)
					switch {
					case err == nil && !legal[move]:
						t.Errorf("%s: allowed, and the list does not have it", move)
					case err == nil:
						seen++
					case !errors.Is(err, ErrIllegal):
						t.Errorf("%s --%s--> refused with %v, not ErrIllegal", from, ev, err)
					case next != p:
						t.Errorf("%s --%s--> refused, yet moved to %s", from, ev, next)
					}
				}
			}
		}
	}
	if seen != len(legal) {
		t.Errorf("%d moves allowed, the list has %d", seen, len(legal))
	}
}

// A Lifecycle keeps its quarantine through a freeze and a checkpoint, and
// names the whole state.
func TestLifecycle(t *testing.T) {
	var l Lifecycle
	step := func(ev Event, reason, wantState string) {
		t.Helper()
		if _, err := l.Fire(ev, reason); err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
		if got := l.Now().State(); got != wantState {
			t.Fatalf("after %s: %s, want %s", ev, got, wantState)
		}
	}
	if l.Now().State() != "creating" {
		t.Fatalf("a new sandbox is %s", l.Now().State())
	}
	if err := l.Can(Freeze); err == nil {
		t.Fatal("a sandbox being created can be frozen")
	}
	step(Started, "", "running")
	step(Quarantine, "exfiltration", "quarantined")
	if _, err := l.Fire(Quarantine, "again"); err == nil || l.Now().Quarantine != "exfiltration" {
		t.Fatalf("a second quarantine: %v, reason %q", err, l.Now().Quarantine)
	}
	step(Freeze, "", "frozen")
	if l.Now().FrozenAt.IsZero() || !l.Now().Quarantined() {
		t.Fatalf("frozen: %+v", l.Now())
	}
	// containerd pauses a task to checkpoint it: the checkpoint ends
	// where it began.
	step(Checkpoint, "", "checkpointing")
	step(CheckpointDone, "", "frozen")
	if err := l.Can(Started); err == nil {
		t.Fatal("a frozen sandbox can start again")
	}
	step(Thaw, "", "quarantined")
	step(Checkpoint, "", "checkpointing")
	if err := l.Can(Quarantine); err == nil {
		t.Fatal("a checkpointing sandbox can be quarantined again")
	}
	step(CheckpointDone, "", "quarantined")
	before, err := l.Fire(Release, "")
	if err != nil || before.Quarantine != "exfiltration" || l.Now().Quarantined() {
		t.Fatalf("release: %v; before %+v, now %+v", err, before, l.Now())
	}
	step(Stop, "", "stopping")
	for _, ev := range []Event{Started, Freeze, Thaw, Checkpoint, Quarantine} {
		if err := l.Can(ev); err == nil {
			t.Errorf("a stopping sandbox can %s", ev)
		}
	}
	step(Exit, "", "ended")
	for _, ev := range Events() {
		if err := l.Can(ev); err == nil {
			t.Errorf("an ended sandbox can %s", ev)
		}
	}
}

// Events from many goroutines (an admin, a limit, runsc's exit) move the
// sandbox one at a time, and it ends where the last legal move left it.
func TestLifecycleConcurrent(t *testing.T) {
	var l Lifecycle
	if _, err := l.Fire(Started, ""); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				l.Fire(Freeze, "")
				l.Fire(Thaw, "")
				l.Fire(Quarantine, fmt.Sprint(i))
				l.Fire(Release, "")
			}
		}()
	}
	wg.Wait()
	if _, err := l.Fire(Stop, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Fire(Exit, ""); err != nil || l.Now().Phase != Ended {
		t.Fatalf("%v %v", err, l.Now().Phase)
	}
}

// How a sandbox stopped is its lifecycle's: the first stop's reason, a
// suspend's checkpoint, an abandoned restore's; and a waiter sees each
// move.
func TestLifecycleStopsAndWaits(t *testing.T) {
	var l Lifecycle
	l.Fire(Started, "")
	l.Fire(Checkpoint, "")
	done := make(chan Status)
	go func() {
		st, _ := l.Wait(context.Background(), 5*time.Second, func(s Status) bool { return s.Phase != Checkpointing })
		done <- st
	}()
	time.Sleep(10 * time.Millisecond)
	l.Fire(Suspend, "cp-1")
	if st := <-done; st.Phase != Stopping || st.SuspendedInto != "cp-1" {
		t.Fatalf("the waiter saw %+v", st)
	}
	l.Fire(Stop, StopWallClock)
	l.Fire(Stop, "admin")
	if st := l.Now(); st.StopReason != StopWallClock {
		t.Fatalf("stop reason %q, want the first", st.StopReason)
	}
	if _, ok := l.Wait(context.Background(), 20*time.Millisecond, func(s Status) bool { return s.Phase == Running }); ok {
		t.Fatal("a wait for what does not come returned true")
	}
	var a Lifecycle
	if _, err := a.Fire(Abandon, "cp-2"); err != nil || a.Now().RestoreFailed != "cp-2" || a.Now().Phase != Stopping {
		t.Fatalf("abandon: %v %+v", err, a.Now())
	}
}
