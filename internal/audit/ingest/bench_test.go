package ingest

import (
	"testing"
	"time"

	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
)

// BenchmarkReceiverPipeline is the receiver's per-event work on one core:
// decode the wire message, map it to a record, scrub, join with the
// sandbox's metadata, seal it into the hash chain and write it to the trail
// file. Reported as events/s.
func BenchmarkReceiverPipeline(b *testing.B) {
	dir := b.TempDir()
	fs, err := audit.NewFileSink(dir, "sb", 1<<40)
	if err != nil {
		b.Fatal(err)
	}
	tr := audit.NewTrail(audit.Meta{Sandbox: "sb", PodNamespace: "agents", PodName: "coder-1", Role: "coder", PolicyDigest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}, fs)
	scrub, _ := audit.NewScrubber(func(n string) bool { return n == "PATH" }, nil)
	r := &Receiver{trail: tr, scrub: scrub}
	cd := &pb.ContextData{TimeNs: time.Now().UnixNano(), ThreadId: 42, ThreadGroupId: 42, ParentThreadGroupId: 1, ContainerId: "coder-1-agent", Cwd: "/workspace/project", ProcessName: "find", Credentials: &pb.Credentials{EffectiveUid: 65532, EffectiveGid: 65532}}
	msgs := [][]byte{
		frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: cd, Exit: &pb.Exit{Result: 3}, Sysno: 257, Fd: -100, Pathname: "src/internal/audit/receiver.go", Flags: 0x80000}),
		frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: cd, Exit: &pb.Exit{Errorno: 2}, Sysno: 257, Fd: -100, Pathname: "src/missing.go"}),
		frame(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 0, &pb.Connect{ContextData: cd, Exit: &pb.Exit{}, Address: []byte{2, 0, 1, 187, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}}),
		frame(pb.MessageType_MESSAGE_SENTRY_EXEC, 0, &pb.ExecveInfo{ContextData: cd, BinaryPath: "/usr/bin/git", Argv: []string{"git", "status", "--short"}, Env: []string{"PATH=/bin", "HOME=/home/agent"}}),
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		r.Process(msgs[i%len(msgs)])
	}
	tr.Flush()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	if c := tr.Counters(); c.Lost != 0 || c.Written != uint64(b.N) {
		b.Fatalf("counters %+v after %d events", c, b.N)
	}
	tr.Close(&audit.Record{Event: audit.EventSandboxEnd})
}
