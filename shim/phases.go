package shim

import (
	"encoding/json"
	"os"
	"sync"
	"time"
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
	Phases  []Phase `json:"phases"`
}

// Phase is one step of a request and the milliseconds it took.
type Phase struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
}

// phases times the steps of one request; nil when tracing is off.
type phases struct {
	op, id, path string
	start        time.Time
	last         time.Time
	steps        []Phase
}

// newPhases starts timing a request, or returns nil (whose methods do
// nothing) when PhaseTraceEnv is unset.
func newPhases(op, id string) *phases {
	path := os.Getenv(PhaseTraceEnv)
	if path == "" {
		return nil
	}
	now := time.Now()
	return &phases{op: op, id: id, path: path, start: now, last: now}
}

// mark ends the current phase under name. Safe on nil.
func (p *phases) mark(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.steps = append(p.steps, Phase{Name: name, MS: float64(now.Sub(p.last).Microseconds()) / 1000})
	p.last = now
}

var traceMu sync.Mutex

// done appends the trace line. Safe on nil.
func (p *phases) done() {
	if p == nil {
		return
	}
	line, err := json.Marshal(PhaseTrace{p.op, p.id, float64(time.Since(p.start).Microseconds()) / 1000, p.steps})
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
