package modelscript

import (
	"fmt"
	"slices"
	"strings"
)

// The MCP task: the agent has a remote MCP server named "issues" (the
// e2e suite's scripted server: search_issues, get_issue, get_secret,
// delete_repo), and the model asks for its tools in turn: one the role
// allows, one it denies, one that answers with a prompt injection, the
// tool the injection asks for (one the role does not allow), and the
// allowed one again (past the role's budget of one call).
const (
	MCPPrompt = "Triage issue 7 with the issues tools."
	MCPDone   = "Triage done: issue 7 is the parser's crash on empty input."
	// MCPServer is the server's name in each CLI's settings.
	MCPServer = "issues"
)

// mcpCall is a model turn of the MCP task.
type mcpCall struct {
	tool string
	args map[string]any
}

// MCPCalls are the task's tool calls in order, the injected one
// included: what the model asks for when nothing stops it.
var MCPCalls = []mcpCall{
	{"get_issue", map[string]any{"number": 7}},
	{"get_secret", map[string]any{"name": "deploy_key"}},
	{"search_issues", map[string]any{"q": "crash"}},
	{"delete_repo", map[string]any{"confirm": true}}, // asked for by the injection only
	{"get_issue", map[string]any{"number": 8}},
}

// Tool is a call's tool, as the server names it.
func (c mcpCall) Tool() string { return c.tool }

// mcpName is the name agent a gives the server's tool: the name offered
// (Claude Code and Codex: mcp__issues__TOOL, Gemini CLI: mcp_issues_TOOL),
// else the name the offered get_issue's shape gives it (a tool the
// server's list did not show the agent).
func mcpName(r Request, tool string) (string, bool) {
	for _, t := range r.Tools {
		if t == "mcp__"+MCPServer+"__"+tool || t == "mcp_"+MCPServer+"_"+tool || t == MCPServer+"__"+tool {
			return t, true
		}
	}
	if tool == "get_issue" {
		return "", false
	}
	known, ok := mcpName(r, "get_issue")
	return strings.TrimSuffix(known, "get_issue") + tool, ok
}

// nextMCP is the MCP task's next turn.
func nextMCP(r Request, a Agent) Turn {
	steps := slices.Clip(MCPCalls[:3])
	if r.Injected {
		steps = append(steps, MCPCalls[3])
	}
	steps = append(steps, MCPCalls[4])
	if r.Results >= len(steps) {
		return Turn{Text: MCPDone}
	}
	s := steps[r.Results]
	name, ok := mcpName(r, s.tool)
	if !ok {
		return Turn{Text: fmt.Sprintf("The %s server's tools are not offered: %v", MCPServer, r.Tools)}
	}
	id := fmt.Sprintf("call_e2e_mcp_%s_%d", a.API, r.Results+1)
	if a.API == "anthropic" {
		id = fmt.Sprintf("toolu_e2e_mcp_%d", r.Results+1)
	}
	call := &ToolCall{ID: id, Name: name, Input: s.args}
	if ns, tool, ok := strings.Cut(name, "__"+MCPServer+"__"); ok && r.Namespaces[ns+"__"+MCPServer] {
		// A namespace's tool is called by its name in the namespace.
		call.Namespace, call.Name = ns+"__"+MCPServer, tool
	}
	return Turn{Tool: call}
}
