package shim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/typeurl/v2"

	"agentbox.dev/agentbox/internal/audit"
)

func TestNamespaceFromTheRequest(t *testing.T) {
	if got := namespaceOf(namespaces.WithNamespace(context.Background(), "k8s.io")); got != "k8s.io" {
		t.Fatalf("namespace %q: the request's namespace must win", got)
	}
}

// TestDeleteRacesExitPublication runs Delete's egress removal against the
// root's exit being published, twice over, under -race: the egress state is
// taken once, under the sandbox's lock, and removal waits for the drop
// counters the exit scheduled (recorded before the rules go).
func TestDeleteRacesExitPublication(t *testing.T) {
	dir := t.TempDir()
	fs, err := audit.NewFileSink(dir, "sb", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	trail := audit.NewTrail(audit.Meta{Sandbox: "sb"}, fs)
	sb := &sandboxState{id: "sb", audit: &sandboxAudit{trail: trail}}
	ns := filepath.Join(dir, "netns") // stands in for the pod's namespace
	os.WriteFile(ns, nil, 0o644)
	if err := sb.setEgress(ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	drops := 0
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			sb.scheduleDrops(func(held string) {
				if !strings.HasPrefix(held, "/proc/") {
					t.Errorf("drops read %q, not the held namespace", held)
				}
				time.Sleep(50 * time.Millisecond)
				drops++ // one run only: scheduleDrops starts it once
				trail.Emit(audit.RecordType{Name: "test/drops", Activity: "Drops"}.New("Success", "counted", nil), true)
			})
		}()
		go func() {
			defer wg.Done()
			time.Sleep(10 * time.Millisecond)
			removeEgress(context.Background(), sb)
		}()
	}
	wg.Wait()
	if drops != 1 {
		t.Fatalf("the counters were recorded %d times", drops)
	}
	if e, ok := sb.takeEgress(); ok {
		t.Fatalf("egress state left after removal: %+v", e)
	}
	trail.Close(&audit.Record{Event: audit.EventSandboxEnd})
	b, _ := os.ReadFile(filepath.Join(dir, "sb.jsonl"))
	removed, counted := strings.Index(string(b), `"event_code":"agentbox/egress_removed"`), strings.Index(string(b), `"event_code":"test/drops"`)
	if strings.Count(string(b), `"event_code":"agentbox/egress_removed"`) != 1 || counted < 0 || removed < counted {
		t.Fatalf("removal must be recorded once, after the drop counters:\n%s", b)
	}
}

// TestWithOOMKills: the OOM kill count lands where containerd's CRI reads
// it, in v1 and v2 metrics alike, and gVisor's other figures stay.
func TestWithOOMKills(t *testing.T) {
	v1, _ := typeurl.MarshalAnyToProto(&cgroup1stats.Metrics{Memory: &cgroup1stats.MemoryStat{Cache: 7}})
	out, err := withOOMKills(v1, 3)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := typeurl.UnmarshalAny(out)
	if got := m.(*cgroup1stats.Metrics); got.MemoryOomControl.GetOomKill() != 3 || got.Memory.GetCache() != 7 {
		t.Fatalf("v1: %+v", got)
	}
	v2, _ := typeurl.MarshalAnyToProto(&cgroup2stats.Metrics{Pids: &cgroup2stats.PidsStat{Current: 4}})
	if out, err = withOOMKills(v2, 2); err != nil {
		t.Fatal(err)
	}
	m, _ = typeurl.UnmarshalAny(out)
	if got := m.(*cgroup2stats.Metrics); got.MemoryEvents.GetOomKill() != 2 || got.Pids.GetCurrent() != 4 {
		t.Fatalf("v2: %+v", got)
	}
	other, _ := typeurl.MarshalAnyToProto(&cgroup2stats.PidsStat{})
	if _, err := withOOMKills(other, 1); err == nil {
		t.Fatal("metrics of another type must be left alone")
	}
}

// TestIdleTrim: a burst of starts gives the heap back once, a delay after
// the last of them.
func TestIdleTrim(t *testing.T) {
	var calls atomic.Int32
	done := make(chan struct{}, 4)
	tr := &idleTrim{delay: 500 * time.Millisecond, fn: func() { calls.Add(1); done <- struct{}{} }}
	for i := 0; i < 3; i++ {
		tr.soon()
	}
	if calls.Load() != 0 {
		t.Fatalf("trimmed during the burst (%d)", calls.Load())
	}
	<-done
	time.Sleep(100 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d trims after one burst, want 1", n)
	}
	tr.soon() // a later start: once more
	<-done
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d trims after two bursts, want 2", n)
	}
}
