package ingest

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/ocsf"
)

var update = flag.Bool("update", false, "rewrite ../testdata/ocsf-golden.jsonl")

// corpus is one record of every kind agentbox writes: each record type of
// its own, and each Sentry point through ToRecord, sealed in one chain.
func corpus(t *testing.T) []byte {
	t.Helper()
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	details := map[string]map[string]string{
		"agentbox/dns_answered":         {"name": "api.example.com", "type": "A", "rcode": "NOERROR", "addresses": "198.51.100.7", "rule": "api.example.com"},
		"agentbox/dns_refused":          {"name": "evil.example", "type": "A", "rcode": "REFUSED", "rule": "no rule"},
		"agentbox/dns_failed":           {"name": "api.example.com", "type": "AAAA", "rcode": "SERVFAIL"},
		"agentbox/dns_address_withheld": {"name": "api.example.com", "type": "A", "address": "10.0.0.1", "reason": "private"},
		"agentbox/egress_request":       {"method": "GET", "host": "api.example.com", "path": "/v1/models", "http_status": "200", "egress": "allow"},
		"agentbox/model_limit":          {"method": "POST", "host": "api.openai.com", "path": "/v1/responses", "http_status": "429", "egress": "deny", "limit": "model_tokens", "reason": "this sandbox's model budget is spent: 1000 of 1000 tokens used (limits.model.tokens)"},
		"agentbox/model_call":           {"method": "POST", "host": "api.anthropic.com", "path": "/v1/messages", "http_status": "200", "egress": "allow", "injected": "X-Api-Key"},
		"agentbox/egress_connection":    {"sni": "api.example.com", "dialled": "198.51.100.7:443", "egress": "allow"},
		"agentbox/egress_refused":       {"sni": "evil.example", "reason": "no rule allows evil.example", "egress": "deny"},
		"agentbox/websocket_closed":     {"host": "api.example.com", "path": "/ws", "dialled": "198.51.100.7:443", "bytes_sent": "12", "bytes_received": "40", "reason": "idle for 2m0s", "egress": "allow"},
		"agentbox/secret_reflected":     {"method": "GET", "host": "api.example.com", "path": "/echo", "http_status": "200", "where": "body", "encoding": "base64", "count": "1"},
		"agentbox/exec":                 {"exec_id": "e1"},
		"agentbox/limit":                {"limit": "wall_clock"},
		"agentbox/quarantined":          {"command_uid": "sb1/q1", "reason": "exfiltration", "requested_by_uid": "0"},
		"agentbox/checkpointed":         {"checkpoint": "cp1", "suspended": "true"},
		"agentbox/restored": {"checkpoint": "cp1", "previous_sandbox": "sb0", "previous_seq": "41",
			"previous_hash": "5f0c6b7b8d0b5d7e1c2a3f4e5d6c7b8a9f0e1d2c3b4a5968778695a4b3c2d1e0", "image_digest": "sha256:ab"},
	}
	var recs, end []*audit.Record
	for _, rt := range audit.Catalog {
		r := rt.New("Success", "a "+rt.Name+" record", details[rt.Name])
		switch rt.Name {
		case "agentbox/exec":
			r.Process = &audit.Process{Argv: []string{"sh", "-c", "id"}}
		case "agentbox/egress_request", "agentbox/egress_connection", "agentbox/websocket_closed", "agentbox/secret_reflected", "agentbox/model_call", "agentbox/mcp_call":
			if rt.Name == "agentbox/mcp_call" {
				r.Detail = map[string]string{"method": "POST", "host": "mcp.example.com", "path": "/mcp"}
				r.MCP = &audit.MCPCall{Server: "mcp.example.com", Tool: "search_issues", Arguments: `{"q":"flaky test"}`, Session: "s-1",
					Application: "claude-code/2.1.328", Answered: true, ResultBytes: 412}
			}
			if rt.Name == "agentbox/model_call" {
				r.Model = &audit.ModelCall{Name: "claude-sonnet-4-5", Provider: "Anthropic", Application: "claude-cli/2.1.328", Tokens: &audit.Tokens{Prompt: 1500, Completion: 57, Total: 1557},
					API: "anthropic", Requested: "claude-sonnet-4-5", Stream: true, StopReason: "tool_use", FirstByteMS: 41.2, Events: 10, RequestDigest: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", RequestBytes: 5120,
					ToolCalls: []audit.ToolCall{{ID: "toolu_01", Name: "Bash", Input: `{"command":"go test ./..."}`}}}
			}
			r.Dst = &audit.Endpoint{IP: "198.51.100.7", Port: 443}
			// The gateway's client, joined to the connect that opened it.
			r.Src = &audit.Endpoint{IP: "10.88.0.7", Port: 40001}
			x := audit.NewConnectIndex(netip.MustParseAddr("169.254.53.53"), 1)
			uid := uint32(65532)
			x.Note(&audit.Record{Event: "syscall/connect", Time: "t7", Seq: 107,
				Process: &audit.Process{PID: 7, Exe: "/usr/bin/curl", Argv: []string{"curl", "https://a.test/"}, Env: []string{"TOKEN=x"}, UID: &uid},
				Dst:     &audit.Endpoint{Family: "inet", IP: "169.254.53.53", Port: 443}, Src: &audit.Endpoint{Family: "inet", IP: "10.88.0.7", Port: 40001}})
			var emitted []*audit.Record
			x.Emit(r, func(r *audit.Record) { emitted = append(emitted, r) })
			if len(emitted) != 1 || r.Process == nil {
				t.Fatal("corpus: the gateway record was not joined")
			}
		case audit.EventGap, audit.EventSandboxEnd:
			r.Counts = map[string]uint64{"sentry_dropped": 3}
		}
		if rt.Severity == audit.SeverityLow {
			r.Status = "Failure"
		}
		if rt.Name == audit.EventSandboxEnd {
			end = append(end, r)
			continue
		}
		recs = append(recs, r)
	}
	cd := &pb.ContextData{TimeNs: at.UnixNano(), ThreadId: 7, ThreadGroupId: 7, ParentThreadGroupId: 1, ContainerId: "c1", Cwd: "/work", ProcessName: "agent",
		Credentials: &pb.Credentials{EffectiveUid: 65532, EffectiveGid: 65532}}
	ok, fail := &pb.Exit{Result: 3}, &pb.Exit{Errorno: 13}
	addr := []byte{2, 0, 0x01, 0xbb, 198, 51, 100, 7, 0, 0, 0, 0, 0, 0, 0, 0}
	unix := append([]byte{1, 0}, "/run/x.sock"...)
	for _, m := range []Message{
		{Payload: &pb.Start{ContextData: cd, Id: "c1", Cwd: "/work", Args: []string{"/agent", "--task", "x"}, Env: []string{"PATH=/bin"}}},
		{Payload: &pb.ExecveInfo{ContextData: cd, BinaryPath: "/usr/bin/git", Argv: []string{"git", "status"}, Env: []string{"HOME=/work"}}},
		{Payload: &pb.Execve{ContextData: cd, Exit: fail, Pathname: "/tmp/x", Argv: []string{"/tmp/x"}}},
		{Payload: &pb.CloneInfo{ContextData: cd, CreatedThreadGroupId: 8}},
		{Payload: &pb.TaskExit{ContextData: cd, ExitStatus: 1 << 8}},
		{Payload: &pb.TaskExit{ContextData: cd, ExitStatus: 9}},
		{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 257, Pathname: "notes.txt", Flags: 0x241, Mode: 0o644}},
		{Payload: &pb.Open{ContextData: cd, Exit: fail, Sysno: 2, Pathname: "/etc/shadow"}},
		{Payload: &pb.Chdir{ContextData: cd, Exit: ok, Sysno: 80, Pathname: "/work/repo"}},
		{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 263, Fd: -100, Pathname: "repo", Flags: atRemoveDir}},
		{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 87, Pathname: "notes.txt"}},
		{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 83, Pathname: "out", Mode: 0o755}},
		{Payload: &pb.Open{ContextData: cd, Exit: fail, Sysno: 90, Pathname: "/etc/passwd", Mode: 0o777}},
		{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 76, Pathname: "log"}},
		{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 82, Pathname: "config.new", Argv: []string{"", "config"}}},
		{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 266, Pathname: "/etc/shadow", Fd: -100, Argv: []string{"", "s"}}},
		{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 86, Pathname: "a", Argv: []string{"", "b"}}},
		{Payload: &pb.Socket{ContextData: cd, Exit: ok, Domain: 2, Type: 1}},
		{Payload: &pb.Connect{ContextData: cd, Exit: &pb.Exit{Errorno: 115}, Address: addr}},
		{Payload: withLocalAddress(&pb.Connect{ContextData: cd, Exit: &pb.Exit{Errorno: 115}, Address: addr}, []byte{2, 0, 0x9c, 0x41, 10, 88, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0})},
		{Payload: &pb.Connect{ContextData: cd, Exit: fail, Address: unix}},
		{Payload: &pb.Bind{ContextData: cd, Exit: ok, Address: addr}},
		{Payload: &pb.Listen{ContextData: cd, Exit: ok}},
		{Payload: &pb.Accept{ContextData: cd, Exit: ok, Sysno: 288, Address: addr}},
	} {
		r := ToRecord(m, nopScrubber{})
		if r == nil {
			t.Fatalf("%T: no record", m.Payload)
		}
		recs = append(recs, r)
	}
	recs = append(recs, end...)
	defer func(n string) { audit.Node = n }(audit.Node)
	audit.Node = "node-1"
	var c audit.Chain
	var out []byte
	for i, r := range recs {
		if strings.HasPrefix(r.Event, "agentbox/") {
			r.Stamp(at.Add(time.Duration(i) * time.Millisecond))
		}
		r.Sandbox, r.Container, r.PodNamespace, r.PodName, r.Role, r.PolicyDigest = "sb1", "c1", "agents", "coder-7", "coder", "sha256:feed"
		var h string
		out, h = c.SealAppend(out, r)
		c.Commit(h)
	}
	return out
}

type nopScrubber struct{}

func (nopScrubber) Env(e []string) []string  { return e }
func (nopScrubber) Args(a []string) []string { return a }

func schema(t *testing.T) *ocsf.Schema {
	t.Helper()
	s, err := ocsf.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != audit.SchemaVersion {
		t.Fatalf("records say OCSF %s, the schema copy is %s", audit.SchemaVersion, s.Version)
	}
	return s
}

// validateLines checks every line against the schema and returns the
// number that conform.
func validateLines(t *testing.T, s *ocsf.Schema, name string, b []byte) int {
	t.Helper()
	n := 0
	for i, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if probs := s.ValidateJSON(line); len(probs) > 0 {
			for _, p := range probs {
				t.Errorf("%s:%d: %v", name, i+1, p)
			}
			continue
		}
		n++
	}
	return n
}

// The golden corpus conforms to OCSF, and the encoder still writes it.
func TestGoldenCorpusIsOCSF(t *testing.T) {
	s := schema(t)
	got := corpus(t)
	const golden = "../testdata/ocsf-golden.jsonl"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	n := validateLines(t, s, golden, want)
	t.Logf("%d records of %s conform to OCSF %s", n, golden, s.Version)
	if !bytes.Equal(got, want) {
		t.Fatalf("the encoder no longer writes %s (run go test -run TestGoldenCorpusIsOCSF -update after checking the change)", golden)
	}
	var v audit.Verifier
	for _, l := range bytes.SplitAfter(want, []byte("\n")) {
		if len(l) > 0 {
			v.Line(golden, l)
		}
	}
	if res := v.Finish(true); res.Problem != nil {
		t.Fatalf("golden chain: %v", res.Problem)
	}
}
