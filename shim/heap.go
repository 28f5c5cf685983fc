package shim

// The shim's heap: what a start leaves behind goes back to the kernel once
// the shim is quiet.

import (
	"sync"
	"time"
)

// trimDelay is how long after the last start the shim gives its free heap
// back to the kernel.
const trimDelay = time.Second

// idleTrim runs fn (debug.FreeOSMemory) once after the last of a burst of
// calls to soon. A start leaves garbage (the policy directory parsed and
// compiled, the spec, gVisor's options, the receiver's and the gateway's
// setup) that Go would collect only at its next cycle, up to two minutes
// later on an idle shim, and return to the kernel more slowly still. One
// collection of a small heap costs about a millisecond of CPU.
type idleTrim struct {
	mu sync.Mutex
	// delay and fn are set when it is made, read under mu.
	// +checklocks:mu
	delay time.Duration
	// +checklocks:mu
	fn func()
	// +checklocks:mu
	timer *time.Timer
}

func (t *idleTrim) soon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer == nil {
		t.timer = time.AfterFunc(t.delay, t.fn)
		return
	}
	t.timer.Reset(t.delay)
}
