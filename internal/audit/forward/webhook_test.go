package forward

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

// receiver is a real HTTP endpoint on loopback that can go down and come
// back on the same address.
type receiver struct {
	mu    sync.Mutex
	lines []string
	addr  string
	srv   *http.Server
}

func (r *receiver) start(t *testing.T) {
	t.Helper()
	addr := r.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp4", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Content-Type") != "application/x-ndjson" {
			http.Error(w, "bad content type", 400)
			return
		}
		sc := bufio.NewScanner(req.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		r.mu.Lock()
		for sc.Scan() {
			r.lines = append(r.lines, sc.Text())
		}
		r.mu.Unlock()
	})}
	go r.srv.Serve(ln)
}

func (r *receiver) stop() { r.srv.Close() }

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// TestWebhookOutage: the endpoint goes down mid-stream and comes back;
// every record arrives exactly once, in order.
func TestWebhookOutage(t *testing.T) {
	MinBackoff, MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	rcv := &receiver{}
	rcv.start(t)
	dir := t.TempDir()
	cfg := WebhookConfig{URL: "http://" + rcv.addr + "/ingest", SpoolDir: filepath.Join(dir, "spool"), MaxSpoolBytes: 1 << 30, BatchRecords: 7}
	w, err := NewWebhook(cfg, "sb")
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := audit.NewFileSink(dir, "sb", 1<<30)
	tr := audit.NewTrail(audit.Meta{Sandbox: "sb"}, fs, w)
	emit := func(n int) {
		for i := 0; i < n; i++ {
			tr.Emit(audit.NewRecord(time.Now(), audit.ClassProcess, 1, "Launch", "e"), i%5 == 0)
		}
		tr.Flush()
	}
	emit(50)
	waitFor(t, func() bool { return rcv.count() >= 50 })
	rcv.stop()
	emit(100) // spooled while down
	time.Sleep(300 * time.Millisecond)
	if rcv.count() != 50 {
		t.Fatalf("delivered %d while the endpoint was down", rcv.count())
	}
	rcv.start(t)
	tr.Close(&audit.Record{Event: audit.EventSandboxEnd})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Wait(ctx); err != nil {
		t.Fatalf("spool not delivered after the endpoint came back: %v (got %d)", err, rcv.count())
	}
	file, _ := os.ReadFile(filepath.Join(dir, "sb.jsonl"))
	want := bytes.Split(bytes.TrimSpace(file), []byte("\n"))
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if len(rcv.lines) != len(want) {
		t.Fatalf("endpoint got %d records, the file has %d", len(rcv.lines), len(want))
	}
	for i := range want {
		if rcv.lines[i] != string(want[i]) {
			t.Fatalf("record %d differs from the file's (order or content)", i)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "spool", "sb.spool")); !os.IsNotExist(err) {
		t.Fatal("a delivered spool must be removed")
	}
}

// TestWebhookResume: a spool left by a shim that died is delivered by the
// next one.
func TestWebhookResume(t *testing.T) {
	MinBackoff, MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	rcv := &receiver{}
	rcv.start(t)
	spool := t.TempDir()
	os.WriteFile(filepath.Join(spool, "dead.spool"), []byte("{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n"), 0o640)
	os.WriteFile(filepath.Join(spool, "dead.offset"), []byte("8"), 0o640) // first record was delivered
	if n := ResumeSpools(WebhookConfig{URL: "http://" + rcv.addr, SpoolDir: spool, MaxSpoolBytes: 1 << 20, BatchRecords: 10}); n != 1 {
		t.Fatalf("resumed %d spools", n)
	}
	waitFor(t, func() bool { return rcv.count() == 2 })
	waitFor(t, func() bool { _, err := os.Stat(filepath.Join(spool, "dead.spool")); return os.IsNotExist(err) })
}

func TestWebhookSpoolFull(t *testing.T) {
	w, err := NewWebhook(WebhookConfig{URL: "http://127.0.0.1:1", SpoolDir: t.TempDir(), MaxSpoolBytes: 100, BatchRecords: 1}, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Forward(bytes.Repeat([]byte("x"), 101), 1); err == nil {
		t.Fatal("a record past the spool limit must be refused (and counted by the trail)")
	}
	w.Close()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 20s")
}
