package shim

import (
	"encoding/json"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// PhaseTraceEnv names a file the shim appends one JSON line to per Create
// and Start, with the milliseconds each phase took (hack/bench.sh sets it
// in containerd's environment, which shims inherit). Unset: no tracing.
const PhaseTraceEnv = "AGENTBOX_PHASE_TRACE"

// PhaseTrace is one line of the trace: a request and its phases.
type PhaseTrace struct {
	Op      string  `json:"op"`
	ID      string  `json:"id"`
	TotalMS float64 `json:"total_ms"`
	// TotalCPUMS is the CPU time (user and system) the shim and the
	// children it waited for used during the request: the shim serves
	// one pod, so it is this request's and the pod's other work's.
	TotalCPUMS float64 `json:"total_cpu_ms"`
	Phases     []Phase `json:"phases"`
}

// Phase is one step of a request: the milliseconds it took, and the CPU
// milliseconds the shim and the children it waited for (runsc's
// commands) used meanwhile. A runsc command's CPU is counted once it has
// been waited for, so it lands in the phase that ran it. The sandbox's own
// processes (the Sentry, the gofers) are not the shim's children: their
// CPU is not here.
type Phase struct {
	Name  string  `json:"name"`
	MS    float64 `json:"ms"`
	CPUMS float64 `json:"cpu_ms"`
}

// phases times the steps of one request; nil when tracing is off.
type phases struct {
	op, id, path      string
	start, last       time.Time
	startCPU, lastCPU time.Duration
	steps             []Phase
}

// cpuUsed is the user and system time of this process and of the children
// it has waited for.
func cpuUsed() time.Duration {
	var total time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if unix.Getrusage(who, &ru) == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// newPhases starts timing a request, or returns nil (whose methods do
// nothing) when PhaseTraceEnv is unset.
func newPhases(op, id string) *phases {
	path := os.Getenv(PhaseTraceEnv)
	if path == "" {
		return nil
	}
	now, cpu := time.Now(), cpuUsed()
	return &phases{op: op, id: id, path: path, start: now, last: now, startCPU: cpu, lastCPU: cpu}
}

// mark ends the current phase under name. Safe on nil.
func (p *phases) mark(name string) {
	if p == nil {
		return
	}
	now, cpu := time.Now(), cpuUsed()
	p.steps = append(p.steps, Phase{Name: name, MS: millis(now.Sub(p.last)), CPUMS: millis(cpu - p.lastCPU)})
	p.last, p.lastCPU = now, cpu
}

var traceMu sync.Mutex

// done appends the trace line. Safe on nil.
func (p *phases) done() {
	if p == nil {
		return
	}
	line, err := json.Marshal(PhaseTrace{Op: p.op, ID: p.id, TotalMS: millis(time.Since(p.start)),
		TotalCPUMS: millis(cpuUsed() - p.startCPU), Phases: p.steps})
	if err != nil {
		return
	}
	traceMu.Lock()
	defer traceMu.Unlock()
	f, err := os.OpenFile(p.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	// A trace line that cannot be written is lost: the trace is a
	// developer's aid, never a record.
	_, _ = f.Write(append(line, '\n'))
	_ = f.Close()
}
