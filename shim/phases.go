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

// phases times the steps of one request.
type phases struct {
	op, id string
	start  time.Time
	last   time.Time
	steps  []phase
}

type phase struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
}

func newPhases(op, id string) *phases {
	now := time.Now()
	return &phases{op: op, id: id, start: now, last: now}
}

// mark ends the current phase under name. Safe on nil.
func (p *phases) mark(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.steps = append(p.steps, phase{Name: name, MS: float64(now.Sub(p.last).Microseconds()) / 1000})
	p.last = now
}

var traceMu sync.Mutex

// done appends the trace line, when tracing is on.
func (p *phases) done() {
	path := os.Getenv(PhaseTraceEnv)
	if p == nil || path == "" {
		return
	}
	line, err := json.Marshal(struct {
		Op      string  `json:"op"`
		ID      string  `json:"id"`
		TotalMS float64 `json:"total_ms"`
		Phases  []phase `json:"phases"`
	}{p.op, p.id, float64(time.Since(p.start).Microseconds()) / 1000, p.steps})
	if err != nil {
		return
	}
	traceMu.Lock()
	defer traceMu.Unlock()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	f.Write(append(line, '\n'))
	f.Close()
}
