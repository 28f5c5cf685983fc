package forward

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The OTLP body carries each line exactly, in order, with its fields
// copied out; a line that is not a record is carried as it is.
func TestOTLPLogs(t *testing.T) {
	// The golden corpus: every record type the trail writes.
	lines, err := os.ReadFile(filepath.Join("..", "testdata", "ocsf-golden.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines = append(lines, "not a record \"\xff\n"...)
	var req struct {
		ResourceLogs []struct {
			ScopeLogs []struct {
				LogRecords []struct {
					Time     string `json:"timeUnixNano"`
					Severity int    `json:"severityNumber"`
					Body     struct {
						String string `json:"stringValue"`
					} `json:"body"`
					Attributes []struct {
						Key string `json:"key"`
					} `json:"attributes"`
				} `json:"logRecords"`
			} `json:"scopeLogs"`
		} `json:"resourceLogs"`
	}
	if err := json.Unmarshal(OTLPLogs(lines), &req); err != nil {
		t.Fatal(err)
	}
	got := req.ResourceLogs[0].ScopeLogs[0].LogRecords
	want := bytes.Split(bytes.TrimRight(lines, "\n"), []byte("\n"))
	if len(got) != len(want) {
		t.Fatalf("%d log records for %d lines", len(got), len(want))
	}
	for i, lr := range got[:len(got)-1] {
		if lr.Body.String != string(want[i]) || lr.Time == "" || lr.Severity == 0 || len(lr.Attributes) != 4 {
			t.Fatalf("record %d: %+v", i, lr)
		}
	}
	if last := got[len(got)-1]; last.Body.String != "not a record \"\ufffd" || len(last.Attributes) != 0 {
		t.Fatalf("the non-record line: %+v", last)
	}
}
