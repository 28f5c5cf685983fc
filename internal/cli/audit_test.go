package cli

import (
	"regexp"
	"strings"
	"testing"
	"unicode"

	"agentbox.dev/agentbox/internal/audit"
)

func TestFormatRecordEscapes(t *testing.T) {
	forged := "x\n09:02:23.417 a8 #6 agentbox/sandbox_end role=baseline Success"
	r := &audit.Record{
		Time: "2026-11-29T09:02:23.417000000Z", Sandbox: "a8", Seq: 5, Event: "syscall/openat", Role: "baseline",
		Process: &audit.Process{PID: 1, Name: "sh\r role=admin", Argv: []string{"cat", "a\x1b[31mred"}},
		File:    &audit.File{Path: forged, Flags: "O_RDONLY"},
		Status:  "Success",
		Message: "bidi \u202e txt.exe",
	}
	got := formatRecord(r)
	for _, want := range []string{
		`path="x\n09:02:23.417 a8 #6 agentbox/sandbox_end role=baseline Success"`,
		`comm="sh\r role=admin"`,
		`argv=["cat" "a\x1b[31mred"]`,
		`"bidi \u202e txt.exe"`,
		"flags=O_RDONLY", "role=baseline", "pid=1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("line lacks %s:\n%s", want, got)
		}
	}
	if strings.Count(unquoted(got), "role=") != 1 || strings.ContainsAny(got, "\n\r\x1b\u202e") {
		t.Fatalf("a hostile field forged output: %q", got)
	}
	// Clean values stay readable.
	if esc("/tmp/n") != "/tmp/n" || esc("") != `""` || esc("a b") != `"a b"` || esc("k=v") != `"k=v"` {
		t.Error("esc of plain values")
	}
}

func FuzzFormatRecord(f *testing.F) {
	f.Add("p\nq", "c", "m\x00", "ev")
	f.Fuzz(func(t *testing.T, path, comm, msg, event string) {
		r := &audit.Record{Sandbox: "s", Event: event, Process: &audit.Process{Name: comm, Argv: []string{path}},
			File: &audit.File{Path: path}, Message: msg, Status: comm}
		out := formatRecord(r)
		for _, c := range out {
			if !unicode.IsGraphic(c) && c != ' ' {
				t.Fatalf("non-graphic %U in %q", c, out)
			}
		}
		// Outside quoted values, only the formatter's own fields appear.
		if n := strings.Count(unquoted(out), " path="); n != 1 {
			t.Fatalf("path= appears %d times outside quotes: %q", n, out)
		}
	})
}

var quotedRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// unquoted is a formatted line with its quoted values taken out.
func unquoted(line string) string { return quotedRE.ReplaceAllString(line, `""`) }

// A gateway record joined to its connect reads as the process that made
// the request, with the client port that pairs it with the connect's line.
func TestFormatGatewayRecord(t *testing.T) {
	r := &audit.Record{Time: "2026-12-03T11:00:00.000000000Z", Sandbox: "a8", Seq: 9, Event: "agentbox/egress_request",
		Process: &audit.Process{PID: 11, Name: "curl"}, Dst: &audit.Endpoint{IP: "198.51.100.10", Port: 443},
		Src: &audit.Endpoint{IP: "10.88.0.7", Port: 40001}, Status: "Success", Message: "GET https://a.test/ -> 200"}
	got := formatRecord(r)
	for _, want := range []string{"pid=11", "comm=curl", "dst=198.51.100.10:443", "src=10.88.0.7:40001"} {
		if !strings.Contains(got, want) {
			t.Errorf("line lacks %s:\n%s", want, got)
		}
	}
}
