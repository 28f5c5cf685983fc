package shim

import (
	"context"
	"errors"
	"net/netip"
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
	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/dnsproxy"
)

func TestReadSmallFile(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "resolv.conf")
	os.WriteFile(ok, []byte("search a\n"), 0o644)
	if b, err := readSmallFile(ok, 64); err != nil || string(b) != "search a\n" {
		t.Fatalf("%q %v", b, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readSmallFile(fifo, 64); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO must be refused at once: %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 100), 0o644)
	if _, err := readSmallFile(big, 64); err == nil {
		t.Error("a file over the limit must be refused")
	}
	link := filepath.Join(dir, "link")
	os.Symlink(ok, link)
	if _, err := readSmallFile(link, 64); err == nil {
		t.Error("a symlink must not be followed")
	}
}

func TestDNSRecord(t *testing.T) {
	scrub, err := audit.NewScrubber(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A token smuggled in a name is redacted like one in argv.
	r := dnsRecord(dnsproxy.Decision{Outcome: dnsproxy.Refused, Name: "ghp_abcdefghijklmnopqrstuvwxyz0123.evil.test", Type: "A", Rule: "no host rule matches", Rcode: "RCodeNameError"}, scrub)
	if r.Event != "agentbox/dns_refused" || r.Status != "Failure" || strings.Contains(r.Message, "ghp_abc") || !strings.Contains(r.Detail["name"], audit.Redacted) {
		t.Errorf("refused: %+v %v", r, r.Detail)
	}
	r = dnsRecord(dnsproxy.Decision{Outcome: dnsproxy.Answered, Name: "api.example.com", Type: "A", Rule: "allow[0] host api.example.com",
		Rcode: "RCodeSuccess", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}, TTL: 5 * time.Minute}, scrub)
	if r.Event != "agentbox/dns_answered" || r.Status != "Success" || r.Detail["addresses"] != "192.0.2.1, 192.0.2.2" || r.Detail["allowed_for"] != "5m0s" || r.Detail["transport"] != "udp" {
		t.Errorf("answered: %+v %v", r, r.Detail)
	}
	r = dnsRecord(dnsproxy.Decision{Outcome: dnsproxy.Failed, Name: "api.example.com", Type: "AAAA", Err: errors.New("upstream down"), TCP: true}, scrub)
	if r.Event != "agentbox/dns_failed" || r.Detail["error"] != "upstream down" || r.Detail["transport"] != "tcp" || !strings.HasSuffix(r.Message, ": upstream down") {
		t.Errorf("failed: %+v %v", r, r.Detail)
	}
	if _, ok := r.Detail["addresses"]; ok {
		t.Error("empty details are left out")
	}
}

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
