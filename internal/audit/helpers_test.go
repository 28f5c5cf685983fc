package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

type testTrail struct {
	dir   string
	trail *Trail
}

func newTestTrail(t *testing.T, sandbox string) *testTrail {
	t.Helper()
	dir := t.TempDir()
	fs, err := NewFileSink(dir, sandbox, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return &testTrail{dir: dir, trail: NewTrail(Meta{Sandbox: sandbox, Role: "baseline", PolicyDigest: "sha256:x"}, fs)}
}

func (tt *testTrail) close(t *testing.T) []map[string]any {
	t.Helper()
	if err := tt.trail.Close(&Record{Event: EventSandboxEnd, ClassName: "Base Event"}); err != nil {
		t.Fatal(err)
	}
	return readRecords(t, filepath.Join(tt.dir, "sb.jsonl"))
}

func readRecords(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	readLines(f, func(l []byte) {
		// The records as the package's own model (agentbox's flat
		// fields): ParseLine reads them back from OCSF.
		r, err := ParseLine(l)
		if err != nil {
			t.Fatalf("bad line %q: %v", l, err)
		}
		flat, _ := json.Marshal(r)
		var m map[string]any
		if err := jsonUnmarshal(flat, &m); err != nil {
			t.Fatalf("bad line %q: %v", l, err)
		}
		out = append(out, m)
	})
	return out
}
