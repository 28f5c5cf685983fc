package shim

// The shim's heap: what a start leaves behind goes back to the kernel once
// the shim is quiet, and a fresh shim does not collect during its start.

import (
	"runtime/debug"
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

// startHeapLimit is the heap past which the shim collects during its
// first burst of work, which it otherwise does without collecting.
const startHeapLimit = 48 << 20

// collectAfterStart defers the shim's garbage collection until its first
// quiet second (the idle trim), or its heap reaching startHeapLimit: its
// start (its process, gVisor's task service, the policy directory, the
// sandbox's create and start) allocates well past Go's first 4 MiB goal,
// and the cycles a fresh shim would run during it cost some 10 ms of CPU
// a pod, when pods start together. It gives the function the idle trim
// runs: from then on the shim collects as Go does by default.
func collectAfterStart() func() {
	deferredGC.once.Do(func() {
		gc := debug.SetGCPercent(-1)
		limit := debug.SetMemoryLimit(startHeapLimit)
		var restored sync.Once
		deferredGC.restore = func() {
			restored.Do(func() {
				debug.SetGCPercent(gc)
				debug.SetMemoryLimit(limit)
			})
		}
	})
	restore := deferredGC.restore
	return func() {
		restore()
		debug.FreeOSMemory()
	}
}

// deferredGC is the process's one deferral of collection (a shim process
// serves one sandbox; tests build many services in one process).
var deferredGC struct {
	once    sync.Once
	restore func()
}
