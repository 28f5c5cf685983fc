package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/audit"
)

// writeTrail writes a small ended trail for a pod's sandbox, timed now.
func writeTrail(t *testing.T, dir, sandbox, ns, pod string) {
	t.Helper()
	var c audit.Chain
	var out []byte
	for _, rt := range []audit.RecordType{audit.TypeRoleResolved, audit.TypeContainerExit, audit.TypeSandboxEnd} {
		r := rt.New("Success", rt.Name, nil)
		r.Sandbox, r.PodNamespace, r.PodName, r.Role = sandbox, ns, pod, "coder"
		var h string
		out, h = c.SealAppend(out, r)
		c.Commit(h)
	}
	if err := os.WriteFile(filepath.Join(dir, sandbox+".jsonl"), out, 0o640); err != nil {
		t.Fatal(err)
	}
}

func runApp(args ...string) (string, error) {
	app := App()
	var b bytes.Buffer
	app.Writer, app.ErrWriter = &b, &b
	app.ExitErrHandler = func(*cli.Context, error) {}
	err := app.Run(append([]string{"agentbox"}, args...))
	return b.String(), err
}

func TestAuditReportSelects(t *testing.T) {
	dir := t.TempDir()
	writeTrail(t, dir, "new", "agents", "c-1")
	time.Sleep(2 * time.Millisecond)
	writeTrail(t, dir, "other", "agents", "c-2")
	// Read after "new" (the directory is read by name), but its sandbox
	// began an hour before: not the latest.
	writeTrailAt(t, dir, "old", "agents", "c-1", time.Now().Add(-time.Hour))
	os.Rename(filepath.Join(dir, "old.jsonl"), filepath.Join(dir, "zz-old.jsonl"))
	out, err := runApp("audit", "report", "--pod", "agents/c-1", dir)
	if err != nil || !strings.HasPrefix(out, "sandbox new  pod agents/c-1") {
		t.Fatalf("--pod picks the pod's latest sandbox: %v\n%s", err, out)
	}
	out, err = runApp("audit", "report", "--sandbox", "other", "-o", "json", dir)
	if err != nil || !strings.Contains(out, `"sandbox_id": "other"`) || !strings.Contains(out, `"intact": true`) {
		t.Fatalf("--sandbox -o json: %v\n%s", err, out)
	}
	for _, bad := range [][]string{
		{"audit", "report", dir},
		{"audit", "report", "--sandbox", "other", "--pod", "agents/c-1", dir},
		{"audit", "report", "--pod", "c-1", dir},
		{"audit", "report", "--sandbox", "other", "-o", "pdf", dir},
		{"audit", "report", "--sandbox", "missing", dir},
	} {
		if _, err := runApp(bad...); err == nil {
			t.Errorf("%v: want an error", bad)
		}
	}
	// A tampered trail is reported as broken, not hidden.
	p := filepath.Join(dir, "other.jsonl")
	b, _ := os.ReadFile(p)
	if !bytes.Contains(b, []byte(`agentbox/container_exit"`)) {
		t.Fatal("nothing to tamper with")
	}
	os.WriteFile(p, bytes.Replace(b, []byte(`agentbox/container_exit"`), []byte(`agentbox/container_exiT"`), 1), 0o640)
	if out, err := runApp("audit", "report", "--sandbox", "other", dir); err != nil || !strings.Contains(out, "CHAIN  BROKEN") {
		t.Fatalf("tampered: %v\n%s", err, out)
	}
}

// writeTrailAt is writeTrail with a first record from the past: the
// trail's files carry only what the records say.
func writeTrailAt(t *testing.T, dir, sandbox, ns, pod string, at time.Time) {
	t.Helper()
	writeTrail(t, dir, sandbox, ns, pod)
	p := filepath.Join(dir, sandbox+".jsonl")
	b, _ := os.ReadFile(p)
	lines := bytes.SplitAfter(b, []byte("\n"))
	r, err := audit.ParseLine(lines[0])
	if err != nil {
		t.Fatal(err)
	}
	old := []byte(`"time_dt":"` + r.Time + `"`)
	lines[0] = bytes.Replace(lines[0], old, []byte(`"time_dt":"`+at.UTC().Format(time.RFC3339Nano)+`"`), 1)
	os.WriteFile(p, bytes.Join(lines, nil), 0o640)
}

// --class agentbox is every record of the shim's own, whatever its OCSF
// class; network is the whole Network Activity category.
func TestTailClassFilter(t *testing.T) {
	own := audit.TypeDNSRefused.New("Failure", "x", nil)
	conn := audit.NewRecord(time.Now(), audit.ClassNetwork, 1, "Open", "syscall/connect")
	open := audit.NewRecord(time.Now(), audit.ClassFileSystem, 14, "Open", "syscall/openat")
	for _, tc := range []struct {
		class string
		want  [3]bool // own, conn, open
	}{
		{"agentbox", [3]bool{true, false, false}},
		{"network", [3]bool{true, true, false}},
		{"file", [3]bool{false, false, true}},
		{"4003", [3]bool{true, false, false}},
		{"", [3]bool{true, true, true}},
	} {
		c, err := parseClass(tc.class)
		if err != nil {
			t.Fatal(err)
		}
		f := tailFilter{class: c}
		got := [3]bool{f.match(own), f.match(conn), f.match(open)}
		if got != tc.want {
			t.Errorf("--class %q: %v, want %v", tc.class, got, tc.want)
		}
	}
}
