package shim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPhaseTraceCPU: each phase carries its wall and CPU milliseconds, and
// a phase that burns CPU shows it.
func TestPhaseTraceCPU(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phases.jsonl")
	t.Setenv(PhaseTraceEnv, path)
	p := newPhases("create", "x")
	time.Sleep(20 * time.Millisecond)
	p.mark("sleep")
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	p.mark("spin")
	p.done()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tr PhaseTrace
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatal(err)
	}
	if len(tr.Phases) != 2 || tr.Op != "create" || tr.ID != "x" {
		t.Fatalf("%+v", tr)
	}
	sleep, spin := tr.Phases[0], tr.Phases[1]
	if sleep.MS < 20 || spin.MS < 50 || spin.CPUMS < 10 || tr.TotalCPUMS < spin.CPUMS || sleep.CPUMS < 0 {
		t.Errorf("phases %+v, total CPU %.1f ms", tr.Phases, tr.TotalCPUMS)
	}
	// Unset: no trace, and a nil trace's methods do nothing.
	t.Setenv(PhaseTraceEnv, "")
	off := newPhases("create", "z")
	if off != nil {
		t.Fatal("a trace with PhaseTraceEnv unset")
	}
	off.mark("a")
	off.done()
}
