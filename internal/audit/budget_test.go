package audit

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A trail past its quota holds the sandbox's records (Emit blocks: the
// receiver stops reading) and loses none; the shim's own records are still
// written, from the reserve; after Drain, what does not fit is counted and
// the end record says so; the chain stays intact throughout.
func TestTrailQuotaBackPressure(t *testing.T) {
	dir := t.TempDir()
	fs, err := NewFileSink(dir, "flood", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.SetBudget(Budget{MaxBytes: 64 << 10, Reserve: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "flood.reserve")); err != nil || st.Size() != 1<<20 {
		t.Fatalf("reserve not allocated: %v", err)
	}
	tr := NewTrail(Meta{Sandbox: "flood"}, fs)
	var emitted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 5000; i++ {
			tr.Emit(NewRecord(time.Now(), ClassFileSystem, 14, "Open", "syscall/openat"), false)
			emitted.Add(1)
		}
	}()
	// The producer stalls once the quota is reached.
	var full *FullError
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if full, _ = tr.Full(); full != nil {
			break
		}
	}
	if full == nil || !strings.Contains(full.Reason, "quota") {
		t.Fatalf("the trail never filled: %v (emitted %d)", full, emitted.Load())
	}
	n := emitted.Load()
	time.Sleep(300 * time.Millisecond)
	if emitted.Load() != n || n >= 5000 {
		t.Fatalf("the producer was not held back: %d then %d", n, emitted.Load())
	}
	if c := tr.Counters(); c.Lost != 0 {
		t.Fatalf("records lost while held back: %+v", c)
	}
	// The shim's own record gets through, from the reserve.
	tr.Emit(NewRecord(time.Now(), ClassBase, 99, "Limit Hit", "agentbox/limit"), true)
	if fs.ReserveLeft() >= 1<<20 {
		t.Fatal("the shim's record must be written from the reserve")
	}
	tr.Drain()
	<-done
	if err := tr.Close(&Record{Event: EventSandboxEnd, ClassName: "Base Event"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "flood.reserve")); !os.IsNotExist(err) {
		t.Error("the reserve must be given back at close")
	}
	trails, _ := FindTrails(dir)
	res := VerifyTrail(trails[0], false)
	if res.Problem != nil || !res.Ended {
		t.Fatalf("chain: %+v", res)
	}
	c := tr.Counters()
	if res.Gaps == 0 || res.Unrecorded != c.Lost || c.Lost == 0 || uint64(res.Records) != c.Written {
		t.Fatalf("the end must account for every record: verify %+v, counters %+v", res, c)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "flood.jsonl"))
	if !strings.Contains(string(b), `"event_code":"agentbox/limit"`) || !strings.Contains(string(b), "trail full: the sandbox's quota") {
		t.Fatal("the limit record and the gap's reason must be in the trail")
	}
}

// A trail that cannot reserve its own space does not start.
func TestTrailReserveRefusedWhenFull(t *testing.T) {
	dir := t.TempDir()
	fs, err := NewFileSink(dir, "late", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	free, err := freeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = fs.SetBudget(Budget{MinFree: free, Reserve: 1 << 20})
	if err == nil || !strings.Contains(err.Error(), "min_free_bytes") {
		t.Fatalf("want the start refused: %v", err)
	}
}

func TestPruneEndedOldestFirst(t *testing.T) {
	dir, spool := t.TempDir(), t.TempDir()
	write := func(name, last string, age time.Duration) {
		p := filepath.Join(dir, name+".jsonl")
		body := strings.Repeat(`{"event":"syscall/openat"}`+"\n", 100) + `{"event":"` + last + `"}` + "\n"
		os.WriteFile(p, []byte(body), 0o640)
		ts := time.Now().Add(-age)
		os.Chtimes(p, ts, ts)
	}
	write("old", EventSandboxEnd, 3*time.Hour)
	write("older-running", "syscall/openat", 5*time.Hour)
	write("undelivered", EventSandboxEnd, 4*time.Hour)
	write("new", EventSandboxEnd, time.Hour)
	os.WriteFile(filepath.Join(spool, "undelivered.spool"), []byte("x"), 0o640)
	st, _ := os.Stat(filepath.Join(dir, "old.jsonl"))
	removed, err := Prune(dir, spool, 3*st.Size())
	if err != nil || strings.Join(removed, ",") != "old" {
		t.Fatalf("removed %v, %v: want the oldest ended, delivered trail only", removed, err)
	}
	for _, keep := range []string{"older-running", "undelivered", "new"} {
		if _, err := os.Stat(filepath.Join(dir, keep+".jsonl")); err != nil {
			t.Errorf("%s must be kept", keep)
		}
	}
}
