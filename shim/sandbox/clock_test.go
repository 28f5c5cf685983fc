package sandbox

import (
	"slices"
	"testing"
	"time"
)

// Frozen, a sandbox's wall clock is held: it fires only after what it had
// left, counted from the thaw.
func TestWallClockHeld(t *testing.T) {
	c := NewWallClock(time.Now())
	fired := make(chan time.Time, 2)
	if _, ok := c.Arm(150*time.Millisecond, func() { fired <- time.Now() }); !ok {
		t.Fatal("not armed")
	}
	if _, ok := c.Arm(150*time.Millisecond, func() { fired <- time.Now() }); ok {
		t.Fatal("armed twice")
	}
	time.Sleep(50 * time.Millisecond)
	c.Hold()
	c.Hold()
	left, ok := c.Left()
	if !ok || left <= 0 || left > 110*time.Millisecond {
		t.Fatalf("held with %v left (%v)", left, ok)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case <-fired:
		t.Fatal("the wall clock ran while frozen")
	default:
	}
	if l2, _ := c.Left(); l2 != left {
		t.Fatalf("held: %v left, then %v", left, l2)
	}
	thawed := time.Now()
	c.Thaw()
	select {
	case at := <-fired:
		if d := at.Sub(thawed); d < left-10*time.Millisecond {
			t.Fatalf("fired %v after the thaw, with %v left", d, left)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the wall clock did not run after the thaw")
	}
	if spent := c.Spent(); spent != 150*time.Millisecond {
		t.Fatalf("spent %v of a clock that ran out", spent)
	}
}

// Without a limit there is nothing to arm, hold or thaw, and Spent is how
// long the sandbox has run, after what it used before a restore.
func TestWallClockNone(t *testing.T) {
	c := NewWallClock(time.Now().Add(-time.Second))
	c.CountFrom(time.Minute)
	if _, ok := c.Arm(0, func() { t.Error("fired") }); ok {
		t.Fatal("armed without a limit")
	}
	c.Hold()
	c.Thaw()
	if _, ok := c.Left(); ok {
		t.Fatal("a sandbox without a wall clock reports one")
	}
	if s := c.Spent(); s < time.Minute+time.Second || s > time.Minute+time.Hour {
		t.Fatalf("spent %v", s)
	}
}

// A restored agent's clock counts on from what it had used; one that had
// used it all fires at once.
func TestWallClockRestored(t *testing.T) {
	c := NewWallClock(time.Now())
	c.CountFrom(59 * time.Minute)
	d, ok := c.Arm(time.Hour, func() {})
	if !ok || d != time.Minute {
		t.Fatalf("armed with %v (%v), want 1m", d, ok)
	}
	if s := c.Spent(); s < 59*time.Minute || s > 60*time.Minute {
		t.Fatalf("spent %v", s)
	}
	c.Stop()
	spent := NewWallClock(time.Now())
	spent.CountFrom(2 * time.Minute)
	fired := make(chan struct{})
	if d, _ := spent.Arm(time.Minute, func() { close(fired) }); d != time.Millisecond {
		t.Fatalf("a used-up clock armed with %v", d)
	}
	select {
	case <-fired:
	case <-time.After(2 * time.Second):
		t.Fatal("a used-up clock did not fire")
	}
}

func TestMembers(t *testing.T) {
	m := NewMembers("root")
	m.Join("a")
	m.Join("b")
	m.Join("a")
	if got := m.List(); !slices.Equal(got, []string{"root", "a", "b"}) {
		t.Fatalf("list %q", got)
	}
	if got := m.RootLast(); !slices.Equal(got, []string{"a", "b", "root"}) {
		t.Fatalf("root last %q", got)
	}
	m.Leave("a")
	m.Leave("root")
	if got := m.RootLast(); !slices.Equal(got, []string{"b", "root"}) {
		t.Fatalf("after leaving: %q", got)
	}
}
