package shim

import (
	"errors"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/policy"
)

// A quarantine that cannot be applied never leaves the sandbox as it was.
func TestFailClosed(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		freeze, stop error
		want         string
		stopped, err bool
	}{
		{want: "frozen"},
		{freeze: boom, want: "stopped", stopped: true, err: true},
		{freeze: boom, stop: boom, want: "neither frozen nor stopped", stopped: true, err: true},
	} {
		stopped := false
		got, err := fallBack(func() error { return tc.freeze }, func() error { stopped = true; return tc.stop })
		if got != tc.want || stopped != tc.stopped || (err != nil) != tc.err {
			t.Errorf("freeze %v stop %v: got %q stopped %v err %v", tc.freeze, tc.stop, got, stopped, err)
		}
	}
}

// Frozen, a sandbox's wall clock is held: it fires only after what it had
// left, counted from the thaw.
func TestWallClockHeldWhileFrozen(t *testing.T) {
	r := newRegistry()
	sb := &sandboxState{id: "sb"}
	r.addSandbox(sb)
	fired := make(chan time.Time, 1)
	fire := func(string) { fired <- time.Now() }
	// armTimer needs a profile with a wall clock; set the timer as it does.
	r.mu.Lock()
	sb.deadline = time.Now().Add(150 * time.Millisecond)
	sb.timer = time.AfterFunc(150*time.Millisecond, func() { fire(sb.id) })
	r.mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	r.holdTimer(sb)
	left, ok := r.wallClockLeft(sb)
	if !ok || left <= 0 || left > 110*time.Millisecond {
		t.Fatalf("held with %v left (%v)", left, ok)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case <-fired:
		t.Fatal("the wall clock ran while frozen")
	default:
	}
	thawed := time.Now()
	r.thawTimer(sb, fire)
	select {
	case at := <-fired:
		if d := at.Sub(thawed); d < left-10*time.Millisecond {
			t.Fatalf("fired %v after the thaw, with %v left", d, left)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the wall clock did not run after the thaw")
	}
	// A sandbox without a wall clock has none to hold.
	r2 := newRegistry()
	sb2 := &sandboxState{id: "sb2"}
	r2.addSandbox(sb2)
	r2.holdTimer(sb2)
	r2.thawTimer(sb2, fire)
	if _, ok := r2.wallClockLeft(sb2); ok {
		t.Fatal("a sandbox without a wall clock reports one")
	}
}

// A role's lower memory or CPU limit is applied to a running sandbox; a
// higher one is pending; an unchanged one changes nothing, even where the
// pod asked for less than its role.
func TestLowerLimits(t *testing.T) {
	role := policy.LimitsProfile{MemoryBytes: 512 << 20, CPUMillis: 1000}
	for _, tc := range []struct {
		name             string
		memory, cpu      int64
		next             policy.LimitsProfile
		memSet, cpuSet   int64
		applied, pending int
	}{
		{name: "lower both", memory: 512 << 20, cpu: 1000, next: policy.LimitsProfile{MemoryBytes: 256 << 20, CPUMillis: 500}, memSet: 256 << 20, cpuSet: 50000, applied: 2},
		{name: "higher both", memory: 512 << 20, cpu: 1000, next: policy.LimitsProfile{MemoryBytes: 1 << 30, CPUMillis: 2000}, pending: 2},
		{name: "unchanged, the pod asked for less", memory: 128 << 20, cpu: 250, next: role},
		{name: "lower than the role, above the pod's own", memory: 128 << 20, cpu: 1000, next: policy.LimitsProfile{MemoryBytes: 256 << 20, CPUMillis: 1000}},
		{name: "no limit any more", memory: 512 << 20, cpu: 1000, next: policy.LimitsProfile{CPUMillis: 1000}, pending: 1},
	} {
		res, applied, pending := lowerLimits(tc.memory, tc.cpu, role, tc.next)
		var mem, quota int64
		if res != nil && res.Memory != nil {
			mem = *res.Memory.Limit
		}
		if res != nil && res.CPU != nil {
			quota = *res.CPU.Quota
		}
		if mem != tc.memSet || quota != tc.cpuSet || len(applied) != tc.applied || len(pending) != tc.pending {
			t.Errorf("%s: memory %d quota %d applied %q pending %q", tc.name, mem, quota, applied, pending)
		}
	}
}
