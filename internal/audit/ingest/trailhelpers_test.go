package ingest

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"agentbox.dev/agentbox/internal/audit"
)

type testTrail struct {
	dir   string
	trail *audit.Trail
}

func newTestTrail(t *testing.T, sandbox string) *testTrail {
	t.Helper()
	dir := t.TempDir()
	fs, err := audit.NewFileSink(dir, sandbox, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return &testTrail{dir: dir, trail: audit.NewTrail(audit.Meta{Sandbox: sandbox, Role: "baseline", PolicyDigest: "sha256:x"}, fs)}
}

func (tt *testTrail) close(t *testing.T) []map[string]any {
	t.Helper()
	if err := tt.trail.Close(&audit.Record{Event: audit.EventSandboxEnd, ClassName: "Base Event"}); err != nil {
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
	scanLines(f, func(l []byte) {
		// The records as the package's own model (agentbox's flat
		// fields): ParseLine reads them back from OCSF.
		r, err := audit.ParseLine(l)
		if err != nil {
			t.Fatalf("bad line %q: %v", l, err)
		}
		flat, _ := json.Marshal(r)
		var m map[string]any
		if err := json.Unmarshal(flat, &m); err != nil {
			t.Fatalf("bad line %q: %v", l, err)
		}
		out = append(out, m)
	})
	return out
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// scanLines calls fn with each line of r (its newline kept).
func scanLines(r io.Reader, fn func([]byte)) {
	br := bufio.NewReader(r)
	for {
		l, err := br.ReadBytes('\n')
		if len(l) > 0 {
			fn(l)
		}
		if err != nil {
			return
		}
	}
}
