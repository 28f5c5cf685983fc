package suggest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	gproto "google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/audit/ingest"
	"agentbox.dev/agentbox/internal/policy"
)

type nop struct{}

func (nop) Env(e []string) []string  { return e }
func (nop) Args(a []string) []string { return a }

// run: an agent under a loose role writes a script in /workspace and
// runs it, writes a note in /tmp, calls a model host and fetches from a
// package index, and is refused a name; the run takes 90 s.
func run(t *testing.T) []*audit.Record {
	t.Helper()
	at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	cd := func(pid int32, name string, s int) *pb.ContextData {
		return &pb.ContextData{TimeNs: at.Add(time.Duration(s) * time.Second).UnixNano(), ThreadId: pid, ThreadGroupId: pid, Cwd: "/workspace", ProcessName: name}
	}
	var recs []*audit.Record
	add := func(r *audit.Record, s int) {
		r.Sandbox, r.Role, r.Seq = "sb1", "loose", uint64(len(recs)+1)
		if r.Time != "" { // the runtime's own record, as the CLI reads it
			recs = append(recs, r)
			return
		}
		var c audit.Chain
		line, _ := c.SealAppend(nil, r)
		back, err := audit.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, back)
	}
	msg := func(m gproto.Message, s int) { add(ingest.ToRecord(ingest.Message{Payload: m}, nop{}), s) }
	own := func(rt audit.RecordType, status, m string, d map[string]string, port, s int) {
		r := rt.New(status, m, d)
		r.Time = at.Add(time.Duration(s) * time.Second).Format(time.RFC3339Nano)
		if port != 0 {
			r.Dst = &audit.Endpoint{Port: port}
		}
		add(r, s)
	}
	own(audit.TypeRoleResolved, "Success", "role loose", nil, 0, 0)
	msg(&pb.Start{ContextData: cd(1, "sh", 1), Id: "c", Args: []string{"sh", "-c", "work"}}, 1)
	msg(&pb.Open{ContextData: cd(1, "sh", 2), Exit: &pb.Exit{Result: 3}, Sysno: unix.SYS_OPENAT, Pathname: "/workspace/run.sh", Flags: unix.O_CREAT | unix.O_WRONLY}, 2)
	msg(&pb.Open{ContextData: cd(1, "sh", 3), Exit: &pb.Exit{Result: 3}, Sysno: unix.SYS_OPENAT, Pathname: "/tmp/note", Flags: unix.O_CREAT | unix.O_WRONLY}, 3)
	msg(&pb.Open{ContextData: cd(1, "sh", 3), Exit: &pb.Exit{Result: 3}, Sysno: unix.SYS_OPENAT, Pathname: "/etc/passwd", Flags: unix.O_RDONLY}, 3)
	msg(&pb.CloneInfo{ContextData: cd(1, "sh", 4), CreatedThreadGroupId: 5}, 4)
	msg(&pb.ExecveInfo{ContextData: cd(5, "sh", 5), BinaryPath: "/workspace/run.sh", Argv: []string{"/workspace/run.sh"}}, 5)
	msg(&pb.CloneInfo{ContextData: cd(5, "run.sh", 6), CreatedThreadGroupId: 6}, 6)
	msg(&pb.ExecveInfo{ContextData: cd(6, "run.sh", 7), BinaryPath: "/usr/bin/curl", Argv: []string{"curl", "https://pypi.org/simple/"}}, 7)
	own(audit.TypeEgressRequest, "Success", "GET https://pypi.org/simple/", map[string]string{"host": "pypi.org", "egress": "allow"}, 443, 8)
	own(audit.TypeEgressRequest, "Success", "GET https://pypi.org/simple/x", map[string]string{"host": "pypi.org", "egress": "allow"}, 443, 9)
	call := audit.TypeModelCall.New("Success", "model call", map[string]string{"host": "api.anthropic.com"})
	call.Dst = &audit.Endpoint{Port: 443}
	call.Model = &audit.ModelCall{Name: "claude-x", API: "anthropic"}
	call.Time = at.Add(10 * time.Second).Format(time.RFC3339Nano)
	add(call, 10)
	own(audit.TypeEgressRequest, "Success", "POST https://mcp.example/mcp", map[string]string{"host": "mcp.example", "egress": "allow"}, 443, 10)
	for _, tool := range []string{"search_issues", "get_issue", "search_issues"} {
		c := audit.TypeMCPCall.New("Success", "MCP call", map[string]string{"host": "mcp.example"})
		c.Dst = &audit.Endpoint{Port: 443}
		c.MCP = &audit.MCPCall{Server: "mcp.example", Tool: tool, Answered: true}
		c.Time = at.Add(10 * time.Second).Format(time.RFC3339Nano)
		add(c, 10)
	}
	own(audit.TypeDNSRefused, "Failure", "A telemetry.example refused", map[string]string{"name": "telemetry.example"}, 0, 11)
	msg(&pb.TaskExit{ContextData: cd(6, "curl", 12)}, 12)
	msg(&pb.TaskExit{ContextData: cd(5, "run.sh", 13)}, 13)
	msg(&pb.TaskExit{ContextData: cd(1, "sh", 90)}, 90)
	own(audit.TypeSandboxEnd, "Success", "sandbox ended", map[string]string{"memory_peak_bytes": "314572800", "cpu_seconds": "42.500"}, 0, 90)
	return recs
}

func TestObserve(t *testing.T) {
	u := Observe(run(t))
	if strings.Join(u.Written, " ") != "/tmp/note /workspace/run.sh" || strings.Join(u.Executed, " ") != "/workspace/run.sh" {
		t.Errorf("files: written %v, executed %v", u.Written, u.Executed)
	}
	want := []Host{{"api.anthropic.com", 443, "anthropic", 1, nil}, {"mcp.example", 443, "mcp", 1, []string{"search_issues", "get_issue"}}, {"pypi.org", 443, "", 2, nil}}
	if !reflect.DeepEqual(u.Hosts, want) {
		t.Errorf("hosts: %+v", u.Hosts)
	}
	if u.Refused["telemetry.example"] != 1 || u.PeakProcesses != 3 || u.Wall != 90*time.Second || u.Roles[0] != "loose" ||
		u.MemoryPeak != 300<<20 || u.CPU != 42500*time.Millisecond {
		t.Errorf("use: %+v", u)
	}
}

// TestSuggestLoads: the suggestion is a role the loader takes, inheriting
// coder, and it allows what the run did and nothing it did not.
func TestSuggestLoads(t *testing.T) {
	u := Observe(run(t))
	y := Suggest(u, Options{Name: "from-trail", Inherits: "coder"})
	for _, want := range []string{
		"writable: [/tmp, /workspace]", "# /workspace: 1 file(s) written, e.g. /workspace/run.sh",
		"allowExec: [/workspace]", "# /workspace: it ran what it wrote there: /workspace/run.sh",
		"- {host: api.anthropic.com, ports: [443], api: anthropic}   # 1 request(s)", "- {host: pypi.org, ports: [443]}   # 2 request(s)",
		`- {host: mcp.example, ports: [443], api: mcp, tools: {allow: ["get_issue", "search_issues"]}}   # 1 request(s)`,
		"# refused under the role it ran under, and not added: telemetry.example (1)",
		"maxProcesses: 32   # at most 3 processes at once", "wallClock: 5m   # its longest run took 1m30s",
		"memory: 450Mi   # its sandbox's peak was 300 MiB (gVisor included), x1.5, at least 128Mi", "cpuTime: 2m   # its sandbox used 42.5s of CPU, x2, at least 1m",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("lacks %q:\n%s", want, y)
		}
	}
	file := filepath.Join(t.TempDir(), "suggested.yaml")
	if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := policy.LoadPaths("../../policies", file)
	if err != nil {
		t.Fatalf("the suggestion does not load: %v\n%s", err, y)
	}
	p, err := set.Profile("from-trail")
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if f, err := Diff(u, p); err != nil || len(f) != 0 {
		t.Fatalf("the suggestion refuses its own run: %v %+v", err, f)
	}
	// A role with less memory than the run's peak refuses it.
	small := *p
	small.Limits.MemoryBytes = 256 << 20
	if f, _ := Diff(u, &small); len(f) != 1 || f[0].What+": "+f[0].Why != "a peak of 300 MiB: limits.memory 256 MiB" {
		t.Errorf("a role with 256 MiB: %+v", f)
	}
	// The parent it replaces: coder, which allows neither host, and
	// baseline, which allows no exec and no network.
	for role, want := range map[string][]string{
		"coder":    {"api.anthropic.com:443", "pypi.org:443"},
		"baseline": {"api.anthropic.com:443", "pypi.org:443", "write /workspace/run.sh: not under filesystem.writable [/tmp]"},
	} {
		p, err := set.Profile(role)
		if err != nil {
			t.Fatal(err)
		}
		f, err := Diff(u, p)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, x := range f {
			got = append(got, x.What+": "+x.Why)
		}
		for _, w := range want {
			if !strings.Contains(strings.Join(got, "\n"), w) {
				t.Errorf("%s: lacks %q in %q", role, w, got)
			}
		}
	}
}

// TestSuggestNoHostLoads: a run that reached no host, suggested under a
// parent with an allow list (coder), is a role that loads: egress none
// with the parent's list replaced by an empty one.
func TestSuggestNoHostLoads(t *testing.T) {
	u := Observe(run(t))
	u.Hosts, u.Direct, u.Refused = nil, nil, nil
	for _, parent := range []string{"coder", "baseline"} {
		y := Suggest(u, Options{Name: "quiet", Inherits: parent})
		if !strings.Contains(y, "egress: none") || !strings.Contains(y, "allow: []") {
			t.Errorf("under %s:\n%s", parent, y)
		}
		file := filepath.Join(t.TempDir(), "quiet.yaml")
		if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		set, err := policy.LoadPaths("../../policies", file)
		if err != nil {
			t.Fatalf("under %s, the suggestion does not load: %v\n%s", parent, err, y)
		}
		p, err := set.Profile("quiet")
		if err != nil {
			t.Fatal(err)
		}
		if p.Network.Egress != policy.EgressNone || len(p.Network.Allow) != 0 {
			t.Errorf("under %s: egress %s, allow %v", parent, p.Network.Egress, p.Network.Allow)
		}
	}
}
