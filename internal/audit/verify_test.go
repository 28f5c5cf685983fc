package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTrail writes n event records and an end record for sandbox sb.
func writeTrail(t *testing.T, n int) (string, [][]byte) {
	t.Helper()
	tt := newTestTrail(t, "sb")
	for i := 0; i < n; i++ {
		r := NewRecord(time.Now(), ClassFileSystem, 14, "Open", "syscall/openat")
		r.File = &File{Path: "/tmp/f" + string(rune('a'+i))}
		tt.trail.Emit(r, false)
	}
	tt.close(t)
	path := filepath.Join(tt.dir, "sb.jsonl")
	b, _ := os.ReadFile(path)
	lines := bytes.SplitAfter(b, []byte("\n"))
	return path, lines[:len(lines)-1]
}

func TestVerifyDetectsTampering(t *testing.T) {
	path, lines := writeTrail(t, 6) // seq 1..6 events, 7 end
	if res := VerifyTrail(TrailFiles{Files: []string{path}}, false); res.Problem != nil || res.Records != 7 || !res.Ended {
		t.Fatalf("intact trail: %+v", res)
	}
	join := func(ls ...[]byte) []byte { return bytes.Join(ls, nil) }
	cases := []struct {
		name      string
		content   []byte
		firstBad  uint64
		wantWords string
	}{
		{"modified", join(lines[0], lines[1], bytes.Replace(lines[2], []byte("/tmp/fc"), []byte("/tmp/xx"), 1), lines[3], lines[4], lines[5], lines[6]), 3, "modified"},
		{"modified hash", join(lines[0], tamperHash(lines[1]), lines[2]), 2, "modified"},
		{"deleted", join(lines[0], lines[1], lines[3], lines[4], lines[5], lines[6]), 3, "deleted"},
		{"deleted first", join(lines[1], lines[2], lines[3], lines[4], lines[5], lines[6]), 1, "deleted from the start"},
		{"inserted", join(lines[0], lines[1], lines[1], lines[2], lines[3], lines[4], lines[5], lines[6]), 2, "reordered or inserted"},
		{"reordered", join(lines[0], lines[2], lines[1], lines[3], lines[4], lines[5], lines[6]), 2, "records 2..2 were deleted"},
		{"truncated", join(lines[0], lines[1], lines[2], lines[3]), 5, "truncated"},
		{"cut mid-line", join(lines[0], lines[1], lines[2][:40]), 3, "no hash"},
		{"appended after end", join(lines[0], lines[1], lines[2], lines[3], lines[4], lines[5], lines[6], lines[6]), 7, "appended"},
		{"empty", nil, 1, "empty trail"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "sb.jsonl")
			os.WriteFile(p, tc.content, 0o644)
			res := VerifyTrail(TrailFiles{Files: []string{p}}, false)
			if res.Problem == nil {
				t.Fatal("tampering not detected")
			}
			if res.FirstBad != tc.firstBad || !strings.Contains(res.Problem.Error(), tc.wantWords) {
				t.Fatalf("first bad %d (want %d): %v", res.FirstBad, tc.firstBad, res.Problem)
			}
		})
	}
	// A sandbox still running: no end record is fine with open.
	p := filepath.Join(t.TempDir(), "sb.jsonl")
	os.WriteFile(p, join(lines[0], lines[1]), 0o644)
	if res := VerifyTrail(TrailFiles{Files: []string{p}}, true); res.Problem != nil || res.Ended {
		t.Fatalf("open trail: %+v", res)
	}
}

// A sink that fails (a full disk) loses records without breaking the
// chain, and a gap record says how many once writing works again.
func TestTrailSurvivesFailingSink(t *testing.T) {
	tt := newTestTrail(t, "sb")
	good := tt.trail.file.f
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("/dev/full:", err)
	}
	tt.trail.Emit(NewRecord(time.Now(), ClassProcess, 1, "Launch", "before"), true)
	tt.trail.mu.Lock()
	tt.trail.file.f = full
	tt.trail.mu.Unlock()
	for i := 0; i < 5; i++ {
		tt.trail.Emit(NewRecord(time.Now(), ClassProcess, 1, "Launch", "lost"), true)
	}
	tt.trail.mu.Lock()
	tt.trail.file.f = good
	tt.trail.mu.Unlock()
	full.Close()
	tt.trail.Emit(NewRecord(time.Now(), ClassProcess, 1, "Launch", "after"), true)
	recs := tt.close(t)
	var events []string
	for _, r := range recs {
		events = append(events, r["event"].(string))
	}
	got := strings.Join(events, ",")
	if got != "before,agentbox/gap,after,"+EventSandboxEnd {
		t.Fatalf("events %s", got)
	}
	gap := recs[1]
	var lost float64
	for _, v := range gap["counts"].(map[string]any) {
		lost += v.(float64)
	}
	if lost < 5 {
		t.Fatalf("gap accounts for %v records, want at least the 5 lost: %v", lost, gap)
	}
	if recs[3]["counts"].(map[string]any)["lost"].(float64) < 5 {
		t.Fatalf("end record: %v", recs[3]["counts"])
	}
	if res := VerifyTrail(TrailFiles{Files: []string{filepath.Join(tt.dir, "sb.jsonl")}}, false); res.Problem != nil {
		t.Fatalf("chain broken by the failure: %v", res.Problem)
	}
}

func TestRotationKeepsTheChain(t *testing.T) {
	dir := t.TempDir()
	fs, _ := NewFileSink(dir, "sb", 4096)
	tr := NewTrail(Meta{Sandbox: "sb"}, fs)
	for i := 0; i < 200; i++ {
		tr.Emit(NewRecord(time.Now(), ClassFileSystem, 14, "Open", "syscall/openat"), i%10 == 0)
	}
	tr.Close(&Record{Event: EventSandboxEnd})
	trails, err := FindTrails(dir)
	if err != nil || len(trails) != 1 || len(trails[0].Files) < 3 {
		t.Fatalf("want several segments: %+v %v", trails, err)
	}
	if res := VerifyTrail(trails[0], false); res.Problem != nil || res.Records != 201 {
		t.Fatalf("rotated trail: %+v", res)
	}
	// Dropping a middle segment is caught.
	os.Remove(trails[0].Files[1])
	trails, _ = FindTrails(dir)
	if res := VerifyTrail(trails[0], false); res.Problem == nil || !strings.Contains(res.Problem.Error(), "deleted") {
		t.Fatalf("missing segment: %+v", res)
	}
}

// A reused sandbox id never appends to the old chain: it gets a trail of
// its own, and both verify on their own.
func TestFileSinkNeverAppends(t *testing.T) {
	dir := t.TempDir()
	fs, err := NewFileSink(dir, "sb", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	fs.WriteBatch([]byte("first\n"))
	fs.Close()
	fs2, err := NewFileSink(dir, "sb", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fs2.Close()
	if fs2.Name() != "sb@2" || fs2.Path() != filepath.Join(dir, "sb@2.jsonl") {
		t.Fatalf("second trail of sb: %s at %s", fs2.Name(), fs2.Path())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sb.jsonl")); string(b) != "first\n" {
		t.Fatalf("the first trail changed: %q", b)
	}
}

// tamperHash changes the first digit of a line's own fingerprint.
func tamperHash(line []byte) []byte {
	i := bytes.LastIndex(line, []byte(`"value":"`)) + len(`"value":"`)
	out := append([]byte(nil), line...)
	out[i] = "10"[bytes.IndexByte([]byte("01"), out[i])&1]
	return out
}

// A restored sandbox's trail names the checkpoint record of the trail it
// continues; verify follows the link, and refuses a forged one.
func TestVerifyFollowsRestore(t *testing.T) {
	a := newTestTrail(t, "sbA")
	a.trail.Emit(TypeContainerStart.New("Success", "started", nil), true)
	seq, hash, err := a.trail.Mark(TypeCheckpointed.New("Success", "checkpoint cp1", map[string]string{"checkpoint": "cp1"}))
	if err != nil || seq != 2 || len(hash) != 64 {
		t.Fatalf("Mark: %d %q %v", seq, hash, err)
	}
	a.trail.Close(&Record{Event: EventSandboxEnd, ClassName: "Base Event"})
	restoredTrail := func(cp, prevSeq, prevHash string) VerifyResult {
		b := newTestTrail(t, "sbB")
		b.trail.Emit(TypeRestored.New("Success", "restores "+cp, map[string]string{"checkpoint": cp, "previous_sandbox": "sbA",
			"previous_seq": prevSeq, "previous_hash": prevHash}), true)
		b.trail.Close(&Record{Event: EventSandboxEnd, ClassName: "Base Event"})
		return VerifyTrail(TrailFiles{Files: []string{filepath.Join(b.dir, "sbB.jsonl")}}, false)
	}
	resA := VerifyTrail(TrailFiles{Files: []string{filepath.Join(a.dir, "sbA.jsonl")}}, false)
	if resA.Problem != nil || len(resA.Checkpoints) != 1 || resA.Checkpoints[0].Hash != hash {
		t.Fatalf("checkpointed trail: %+v", resA)
	}
	resB := restoredTrail("cp1", "2", hash)
	if resB.Problem != nil || resB.RestoredFrom == nil {
		t.Fatalf("restored trail: %+v", resB)
	}
	if given, err := LinkProblem(resB, []VerifyResult{resA, resB}); !given || err != nil {
		t.Fatalf("link: %v %v", given, err)
	}
	if given, err := LinkProblem(resB, []VerifyResult{resB}); given || err != nil {
		t.Fatalf("link without the earlier trail: %v %v", given, err)
	}
	for _, forged := range []VerifyResult{restoredTrail("cp1", "2", strings.Repeat("0", 64)), restoredTrail("cp1", "1", hash), restoredTrail("cp2", "2", hash)} {
		if _, err := LinkProblem(forged, []VerifyResult{resA, forged}); err == nil {
			t.Fatalf("a forged link was accepted: %+v", forged.RestoredFrom)
		}
	}
}
