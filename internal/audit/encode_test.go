package audit

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"
)

func sampleRecords() []*Record {
	res, st, sig := int64(3), int32(0), int32(9)
	uid := uint32(65532)
	at := time.Date(2026, 12, 2, 3, 4, 5, 123456789, time.UTC)
	return []*Record{
		{Time: "2026-12-02T03:04:05.123456789Z", ClassUID: ClassEventLog, ClassName: "Event Log Activity", ActivityID: 99, ActivityName: "Gap", Severity: SeverityMedium, Event: "agentbox/gap", Counts: map[string]uint64{"b": 2, "a": 1}, Detail: map[string]string{"z": "<&>", "y": "\u2028"}, Sandbox: "sb"},
		{at: at, ClassUID: 1001, ClassName: "File System Activity", ActivityID: 14, ActivityName: "Open", Status: "Success", Result: &res,
			Process: &Process{PID: 1, TID: 2, PPID: 7, Name: "cat\x00\x1f", Argv: []string{"a\"b", "c\\d", "\xef\xbf\xbd"}, Env: []string{"A=b"}, Exe: "/bin/cat", Cwd: "/", UID: &uid, GID: &uid, ExitSts: &st, ExitSignal: &sig, ChildPID: 4},
			File:    &File{Path: "/etc/passwd", Flags: "O_RDONLY", Mode: 0o644}, Target: &File{Path: "/etc/x", Mode: 0o600}, Dst: &Endpoint{Family: "inet", IP: "10.0.0.1", Port: 80, Path: "", Type: "stream"},
			Message: "tab\there\nnewline", Event: "syscall/openat", Sandbox: "sb", Container: "c", Namespace: "k8s.io", PodNamespace: "ns", PodName: "p", Role: "r", PolicyDigest: "d", Errno: 2, Seq: 7, PrevHash: "abc"},
		{at: at, ClassUID: ClassProcess, ClassName: "Process Activity", ActivityID: 1, ActivityName: "Launch", Event: "agentbox/exec", Process: &Process{Argv: []string{"sh", "-c", "id"}}, Detail: map[string]string{"exec_id": "e1"}, Sandbox: "sb"},
		// A gateway record joined to the connect that opened its connection.
		{at: at, ClassUID: ClassNetwork, ClassName: "Network Activity", ActivityID: 1, ActivityName: "Open", Status: "Success", Event: "agentbox/egress_connection",
			Process: &Process{PID: 9, Exe: "/usr/bin/curl", Argv: []string{"curl", "https://a.test/"}, UID: &uid}, joined: true,
			Dst: &Endpoint{IP: "198.51.100.7", Port: 443}, Src: &Endpoint{IP: "10.88.0.7", Port: 40001}, Detail: map[string]string{"connect_event": "12"}, Sandbox: "sb"},
		// A model call: the ai_operation profile's objects, and the rest.
		{at: at, ClassUID: ClassHTTP, ClassName: "HTTP Activity", ActivityID: 99, ActivityName: "Model Call", Status: "Success", Event: "agentbox/model_call",
			Process: &Process{PID: 12, Exe: "/usr/bin/node", UID: &uid}, joined: true, Dst: &Endpoint{IP: "10.88.0.1", Port: 443},
			Detail: map[string]string{"host": "api.anthropic.com", "method": "POST", "path": "/v1/messages", "http_status": "200"},
			Model: &ModelCall{Name: "claude-sonnet-4-5", Provider: "Anthropic", Application: "claude-cli/2.1 <x>", Tokens: &Tokens{1500, 57, 1557},
				API: "anthropic", Requested: "claude-sonnet-4-5", Stream: true, StopReason: "tool_use", FirstByteMS: 12.5, Events: 10,
				RequestDigest: "ab12", RequestBytes: 4096, ToolCalls: []ToolCall{{ID: "toolu_1", Name: "Bash", Input: `{"command":"go test ./..."}`, Truncated: true}}},
			Sandbox: "sb", Seq: 3, PrevHash: "abc"},
		// A claimed sandbox's record carries its claim and the task's
		// identity (the tenant also as OCSF's metadata.tenant_uid); a warm
		// one's, the pool holding it.
		{at: at, ClassUID: ClassProcess, ClassName: "Process Activity", ActivityID: 1, ActivityName: "Launch", Event: "agentbox/exec", Process: &Process{Argv: []string{"ls"}}, Sandbox: "sb",
			PodNamespace: "agents", PodName: "sb1", Claim: &Claim{Name: "task-1", UID: "c-uid", Subject: "alice@example.com", Tenant: "acme", Task: "T-42"}},
		{at: at, ClassUID: ClassProcess, ClassName: "Process Activity", ActivityID: 1, ActivityName: "Launch", Event: "agentbox/exec", Process: &Process{Argv: []string{"ls"}}, Sandbox: "sb",
			PodNamespace: "agents", PodName: "sb1", Claim: &Claim{Name: "task-2", UID: "c-uid2"}},
		{at: at, ClassUID: ClassProcess, ClassName: "Process Activity", ActivityID: 1, ActivityName: "Launch", Event: "agentbox/exec", Process: &Process{Argv: []string{"ls"}}, Sandbox: "sb",
			PodNamespace: "agents", PodName: "sb1", WarmPool: "agents"},
		// One that got no answer: no tokens, no model named.
		{at: at, ClassUID: ClassHTTP, ClassName: "HTTP Activity", ActivityID: 99, ActivityName: "Model Call", Status: "Success", Event: "agentbox/model_call",
			Detail: map[string]string{"host": "api.openai.com"}, Model: &ModelCall{API: "openai", Problem: "no response"}, Sandbox: "sb"},
		// An MCP call, answered with an error; and one with no session,
		// never answered.
		{at: at, ClassUID: ClassHTTP, ClassName: "HTTP Activity", ActivityID: 99, ActivityName: "MCP Call", Status: "Success", Event: "agentbox/mcp_call",
			Detail: map[string]string{"host": "mcp.example.com", "method": "POST"}, Sandbox: "sb",
			MCP: &MCPCall{Server: "mcp.example.com", Tool: "get_issue", Arguments: `{"n":1}`, Session: "s-1", Application: "codex_exec/0.169.0", Answered: true, ResultBytes: 88, IsError: true}},
		{at: at, ClassUID: ClassHTTP, ClassName: "HTTP Activity", ActivityID: 99, ActivityName: "MCP Call", Status: "Failure", Event: "agentbox/mcp_call",
			Detail: map[string]string{"host": "mcp.example.com", "method": "POST"}, Sandbox: "sb", MCP: &MCPCall{Server: "mcp.example.com", Tool: "search"}},
	}
}

// roundTrip seals r and parses the line back.
func roundTrip(t *testing.T, r *Record) (*Record, []byte) {
	t.Helper()
	var c Chain
	c.Commit("0000000000000000000000000000000000000000000000000000000000000000")
	line, _ := c.SealAppend(nil, r)
	var v any
	if err := json.Unmarshal(line, &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, line)
	}
	got, err := ParseLine(line)
	if err != nil {
		t.Fatalf("ParseLine: %v\n%s", err, line)
	}
	return got, line
}

func sameRecord(t *testing.T, want, got *Record) {
	t.Helper()
	w := *want
	if w.Time == "" {
		w.Time = w.at.UTC().Format(time.RFC3339Nano)
	}
	w.at = time.Time{}
	if !reflect.DeepEqual(&w, got) {
		a, _ := json.Marshal(&w)
		b, _ := json.Marshal(got)
		t.Fatalf("round trip differs:\nwant %s\n got %s", a, b)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		got, line := roundTrip(t, r)
		sameRecord(t, r, got)
		if !IsOCSF(line) || !bytes.HasSuffix(line, []byte(fingerprintSuffix+"\n")) {
			t.Fatalf("line does not end with its fingerprint: %s", line)
		}
	}
}

// FuzzEncode: for any strings, the record parses back to what was sealed,
// and the line stays one JSON object on one line.
func FuzzEncode(f *testing.F) {
	f.Add("a", "b\x00", "c", "<\u2028>")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		for _, s := range []string{a, b, c, d} {
			if !utf8Valid(s) {
				t.Skip("invalid UTF-8 is replaced, by design")
			}
		}
		r := sampleRecords()[1]
		r.Message, r.Process.Name, r.Process.Argv, r.File.Path = a, b, []string{c, d}, d
		r.Detail = map[string]string{a: b, c: d}
		r.Counts = map[string]uint64{b: 1}
		r.Claim = &Claim{Name: "task", UID: "u", Subject: a, Tenant: b, Task: c}
		got, line := roundTrip(t, r)
		if bytes.Count(line, []byte("\n")) != 1 {
			t.Fatalf("not one line: %q", line)
		}
		sameRecord(t, r, got)
	})
}

// utf8Valid: ToValidUTF8(s, "\xff") == s held for "\xff" itself.
func utf8Valid(s string) bool { return utf8.ValidString(s) }
