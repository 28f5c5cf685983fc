package ingest

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
)

// frame builds a wire message: header then payload.
func frame(t pb.MessageType, dropped uint32, payload proto.Message) []byte {
	b, _ := proto.Marshal(payload)
	h := make([]byte, 8)
	binary.LittleEndian.PutUint16(h[0:], 8)
	binary.LittleEndian.PutUint16(h[2:], uint16(t))
	binary.LittleEndian.PutUint32(h[4:], dropped)
	return append(h, b...)
}

func TestReceiverSession(t *testing.T) {
	tt := newTestTrail(t, "sb")
	sock := filepath.Join(t.TempDir(), "r.sock")
	scrub, _ := audit.NewScrubber(func(n string) bool { return n == "PATH" }, nil)
	r, err := Listen(sock, tt.trail, scrub, ReceiverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := dialSession(t, sock)
	cd := &pb.ContextData{TimeNs: time.Now().UnixNano(), ThreadId: 5, ThreadGroupId: 5, ContainerId: "c1", Cwd: "/work", ProcessName: "cat", Credentials: &pb.Credentials{EffectiveUid: 65532, EffectiveGid: 65532}}
	c.Write(frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: cd, Exit: &pb.Exit{Result: 3}, Sysno: 257, Pathname: "notes.txt", Flags: 0x241}))
	c.Write(frame(pb.MessageType_MESSAGE_SENTRY_EXEC, 0, &pb.ExecveInfo{ContextData: cd, BinaryPath: "/bin/curl", Argv: []string{"curl", "-H", "Authorization: Bearer abc.def", "https://u:pw@host/?token=s3cr3t"}, Env: []string{"PATH=/bin", "AWS_SECRET_ACCESS_KEY=xyz"}}))
	c.Write(frame(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 7, &pb.Connect{ContextData: cd, Exit: &pb.Exit{Errorno: 111}, Address: []byte{2, 0, 0x1f, 0x90, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}}))
	c.Write([]byte{1, 2, 3})                                                               // too short
	c.Write(frame(pb.MessageType(999), 7, &pb.Exit{}))                                     // unknown type
	c.Write(append(frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 7, &pb.Open{}), 0xff, 0xff)) // bad protobuf
	c.Close()
	r.Close(2 * time.Second)
	recs := tt.close(t)

	byEvent := map[string]map[string]any{}
	for _, rec := range recs {
		byEvent[rec["event"].(string)] = rec
	}
	open := byEvent["syscall/openat"]
	if open == nil || open["class_uid"].(float64) != audit.ClassFileSystem || open["status"] != "Success" || open["role"] != "baseline" || open["container_id"] != "c1" {
		t.Fatalf("open record: %v", open)
	}
	if f := open["file"].(map[string]any); f["path"] != "/work/notes.txt" || f["flags"] != "O_WRONLY|O_CREAT|O_TRUNC" {
		t.Fatalf("open file: %v", f)
	}
	exec := byEvent["sentry/execve"]
	line := strings.Join(toStrings(exec["process"].(map[string]any)["argv"]), " ")
	if strings.Contains(line, "abc.def") || strings.Contains(line, "s3cr3t") || strings.Contains(line, ":pw@") {
		t.Fatalf("secrets in argv: %s", line)
	}
	env := strings.Join(toStrings(exec["process"].(map[string]any)["env"]), " ")
	if env != "PATH=/bin AWS_SECRET_ACCESS_KEY=<dropped>" {
		t.Fatalf("env: %s", env)
	}
	conn := byEvent["syscall/connect"]
	if d := conn["dst_endpoint"].(map[string]any); d["ip"] != "10.0.0.1" || d["port"].(float64) != 8080 || conn["errno"].(float64) != 111 {
		t.Fatalf("connect: %v", conn)
	}
	gap := byEvent["agentbox/gap"]
	if gap == nil || gap["counts"].(map[string]any)["gVisor dropped events (its socket to the shim was full)"].(float64) != 7 {
		t.Fatalf("gap: %v", gap)
	}
	end := recs[len(recs)-1]
	counts := end["counts"].(map[string]any)
	if counts["received"].(float64) != 6 || counts["anomalies"].(float64) != 3 || counts["sentry_dropped"].(float64) != 7 {
		t.Fatalf("end counts: %v", counts)
	}
	var anomalies int
	for _, rec := range recs {
		if rec["event"] == "agentbox/anomaly" {
			anomalies++
		}
	}
	if anomalies != 3 {
		t.Fatalf("%d anomaly records, want 3", anomalies)
	}
	if res := audit.VerifyTrail(audit.TrailFiles{Sandbox: "sb", Files: []string{filepath.Join(tt.dir, "sb.jsonl")}}, false); res.Problem != nil {
		t.Fatalf("trail does not verify: %v", res.Problem)
	}
}

// dialSession connects to a receiver and completes gVisor's handshake.
func dialSession(t *testing.T, sock string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	hs, _ := proto.Marshal(&pb.Handshake{Version: 1})
	c.Write(hs)
	buf := make([]byte, 100)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	var reply pb.Handshake
	if err != nil || proto.Unmarshal(buf[:n], &reply) != nil || reply.Version < 1 {
		t.Fatalf("handshake reply: %v", err)
	}
	return c
}

// closeWithin fails the test if r.Close(drain) has not returned after limit
// (a hang, not a timing measurement: limit is far above drain).
func closeWithin(t *testing.T, r *Receiver, drain, limit time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { r.Close(drain); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("Close(%v) still running after %v", drain, limit)
	}
}

// The reader takes events in batches; none is lost between batches, and
// a sandbox that writes as fast as it can (gVisor's sink: non-blocking
// writes, retried) gets every event in.
func TestReceiverBatchesKeepEveryEvent(t *testing.T) {
	for _, retries := range []int{0, 10} {
		t.Run(fmt.Sprintf("retries=%d", retries), func(t *testing.T) { testBatches(t, retries) })
	}
}

func testBatches(t *testing.T, retries int) {
	tt := newTestTrail(t, "sb")
	sock := filepath.Join(t.TempDir(), "r.sock")
	r, err := Listen(sock, tt.trail, nil, ReceiverOptions{SentryRetries: retries})
	if err != nil {
		t.Fatal(err)
	}
	c := dialSession(t, sock)
	const events = 5000
	cd := &pb.ContextData{TimeNs: time.Now().UnixNano(), ThreadId: 5, ThreadGroupId: 5, ContainerId: "c1", Cwd: "/", ProcessName: "ls"}
	msg := frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: cd, Exit: &pb.Exit{Errorno: 2}, Sysno: 257, Pathname: "/etc/localtime"})
	for i := 0; i < events; i++ {
		if _, err := c.Write(msg); err != nil { // blocking: waits while the queue is full
			t.Fatal(err)
		}
	}
	c.Close()
	closeWithin(t, r, 5*time.Second, time.Minute)
	recs := tt.close(t)
	counts := recs[len(recs)-1]["counts"].(map[string]any)
	if counts["received"].(float64) != events || counts["anomalies"].(float64) != 0 {
		t.Fatalf("end counts: %v, want %d received", counts, events)
	}
	var opens int
	for _, rec := range recs {
		if rec["event"] == "syscall/openat" {
			opens++
		}
	}
	if opens != events {
		t.Fatalf("%d open records, want %d", opens, events)
	}
}

// Close ends a session whatever the sandbox does: idle, still in its
// handshake, or flooding past the drain time.
func TestReceiverCloseEndsSession(t *testing.T) {
	for _, tc := range []string{"idle", "handshake", "flood"} {
		t.Run(tc, func(t *testing.T) {
			tt := newTestTrail(t, "sb")
			sock := filepath.Join(t.TempDir(), "r.sock")
			r, err := Listen(sock, tt.trail, nil, ReceiverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var c *net.UnixConn
			stop := make(chan struct{})
			flooding := make(chan struct{})
			switch tc {
			case "handshake":
				c, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
				if err != nil {
					t.Fatal(err)
				}
				for !accepted(r) {
					time.Sleep(time.Millisecond)
				}
			case "idle":
				c = dialSession(t, sock)
			case "flood":
				c = dialSession(t, sock)
				msg := frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: &pb.ContextData{ProcessName: "f"}, Exit: &pb.Exit{}, Pathname: "/x"})
				go func() {
					defer close(flooding)
					for {
						select {
						case <-stop:
							return
						default:
						}
						c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
						c.Write(msg)
					}
				}()
				time.Sleep(50 * time.Millisecond)
			}
			closeWithin(t, r, 200*time.Millisecond, 30*time.Second)
			if tc == "flood" {
				close(stop)
				<-flooding
			}
			c.Close()
			if r.Live() {
				t.Fatal("session still live after Close")
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Fatalf("socket left behind: %v", err)
			}
			recs := tt.close(t)
			counts := recs[len(recs)-1]["counts"].(map[string]any)
			if tc == "flood" && counts["received"].(float64) == 0 {
				t.Fatalf("flood: nothing received: %v", counts)
			}
		})
	}
}

// accepted reports whether r took a connection (its handshake may be pending).
func accepted(r *Receiver) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn != nil
}

func TestPauseBounds(t *testing.T) {
	for _, tc := range []struct {
		retries int
		lo, hi  time.Duration
	}{
		{0, 0, 0}, // gVisor drops at once: no pause
		{2, 0, 0}, // 75µs of retries: too short to pause
		{4, 0, 0}, // 375µs: a quarter is under 100µs
		{5, 193750 * time.Nanosecond, 193750 * time.Nanosecond}, // 775µs
		{6, 393750 * time.Nanosecond, 393750 * time.Nanosecond}, // 1.575ms
		{8, 500 * time.Microsecond, 1593750 * time.Nanosecond},  // 6.375ms
		{10, 500 * time.Microsecond, 4 * time.Millisecond},      // 22.8ms, capped
		{30, 500 * time.Microsecond, 4 * time.Millisecond},
	} {
		lo, hi := pauseBounds(tc.retries)
		if lo != tc.lo || hi != tc.hi {
			t.Errorf("pauseBounds(%d) = %v, %v; want %v, %v", tc.retries, lo, hi, tc.lo, tc.hi)
		}
	}
}

func TestNextPause(t *testing.T) {
	lo, hi := 500*time.Microsecond, 4*time.Millisecond
	for _, tc := range []struct {
		cur  time.Duration
		n    int
		want time.Duration
	}{
		{time.Millisecond, 0, 2 * time.Millisecond},           // nothing came: wait longer
		{time.Millisecond, 15, 2 * time.Millisecond},          // few
		{time.Millisecond, 16, time.Millisecond},              // in range: keep
		{time.Millisecond, 64, time.Millisecond},              // in range: keep
		{time.Millisecond, 65, 500 * time.Microsecond},        // many: shorter
		{3 * time.Millisecond, 1, 4 * time.Millisecond},       // capped
		{600 * time.Microsecond, 200, 500 * time.Microsecond}, // floored
	} {
		if got := nextPause(tc.cur, tc.n, lo, hi); got != tc.want {
			t.Errorf("nextPause(%v, %d) = %v, want %v", tc.cur, tc.n, got, tc.want)
		}
	}
}
