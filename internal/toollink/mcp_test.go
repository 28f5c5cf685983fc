package toollink

import (
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

func mcpCall(tool, args string) *audit.Record {
	return &audit.Record{Event: "agentbox/mcp_call", MCP: &audit.MCPCall{Server: "mcp.test", Tool: tool, Arguments: args}}
}

func TestLinksMCP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []*audit.Record
		mcp   *audit.Record
		want  string // tool call id linked ("" none)
	}{
		{"Claude Code's name", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__issues__get_issue", Input: `{"n":1,"repo":"a"}`})},
			mcpCall("get_issue", `{"repo":"a","n":1}`), "t1"},
		{"Gemini CLI's name", []*audit.Record{call(4, audit.ToolCall{ID: "g1", Name: "mcp_issues_get_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1}`), "g1"},
		{"Gemini CLI's name that only ends like it", []*audit.Record{call(4, audit.ToolCall{ID: "g1", Name: "mcp_issues_forget_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1}`), ""},
		{"a single underscore without mcp_", []*audit.Record{call(4, audit.ToolCall{ID: "g1", Name: "issues_get_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1}`), ""},
		{"the tool's own name (older Gemini CLI)", []*audit.Record{call(4, audit.ToolCall{ID: "g1", Name: "get_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1}`), "g1"},
		{"no arguments", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__issues__list", Input: `{}`})},
			mcpCall("list", ``), "t1"},
		{"other arguments", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__issues__get_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":2}`), ""},
		{"a name that only ends like it", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__issues__forget_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1}`), ""},
		{"two match: none", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__a__get_issue", Input: `{"n":1}`}), call(5, audit.ToolCall{ID: "t2", Name: "mcp__b__get_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1}`), ""},
		{"truncated arguments: never guess", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__i__get_issue", Input: `{"n":1}`})},
			mcpCall("get_issue", `{"n":1…`), ""},
		{"a truncated tool call", []*audit.Record{call(4, audit.ToolCall{ID: "t1", Name: "mcp__i__get_issue", Input: `{"n":1}`, Truncated: true})},
			mcpCall("get_issue", `{"n":1}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New()
			for _, c := range tc.calls {
				l.Note(c)
			}
			l.AnnotateMCP(tc.mcp)
			if got := tc.mcp.Detail["tool_call_id"]; got != tc.want {
				t.Fatalf("linked %q, want %q (%v)", got, tc.want, tc.mcp.Detail)
			}
			if tc.want != "" && (tc.mcp.Detail["model_call"] != "sb/4" || tc.mcp.Detail["model"] != "m") {
				t.Fatalf("detail %v", tc.mcp.Detail)
			}
		})
	}
	// Taken once; and a tool call waits only for the window.
	l := New()
	l.Note(call(4, audit.ToolCall{ID: "t1", Name: "mcp__i__get_issue", Input: `{"n":1}`}))
	first, second := mcpCall("get_issue", `{"n":1}`), mcpCall("get_issue", `{"n":1}`)
	l.AnnotateMCP(first)
	l.AnnotateMCP(second)
	if first.Detail["tool_call_id"] != "t1" || second.Detail["tool_call_id"] != "" {
		t.Fatalf("first %v, second %v", first.Detail, second.Detail)
	}
	now := time.Now()
	l.now = func() time.Time { return now }
	l.Note(call(6, audit.ToolCall{ID: "t2", Name: "mcp__i__get_issue", Input: `{"n":1}`}))
	l.now = func() time.Time { return now.Add(Window + time.Second) }
	late := mcpCall("get_issue", `{"n":1}`)
	l.AnnotateMCP(late)
	if late.Detail["tool_call_id"] != "" {
		t.Fatalf("linked past the window: %v", late.Detail)
	}
}
