package toollink

// MCP calls: a model asks for a remote MCP server's tool by a name the
// agent gives it (Claude Code and Codex: mcp__SERVER__TOOL; Gemini CLI:
// mcp_SERVER_TOOL; older releases the tool's own name, or SERVER__TOOL),
// and the agent then sends tools/call of TOOL with the same arguments. A
// call's record (agentbox/mcp_call) is linked to the model's tool call
// when the name ends with the tool's, the arguments are the same JSON,
// and no other waiting tool call matches too.

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

// mcpPending is a model's tool call that may be an MCP server's.
type mcpPending struct {
	call *audit.Record
	id   string
	name string
	args any
	at   time.Time
}

// noteMCP keeps rec's tool calls whose input is a JSON object: any may
// be an MCP tool's. The caller holds l.mu.
func (l *Linker) noteMCP(rec *audit.Record) {
	now := l.now()
	for _, c := range rec.Model.ToolCalls {
		var args map[string]any
		if c.Truncated || json.Unmarshal([]byte(c.Input), &args) != nil {
			continue
		}
		l.mcp = append(l.mcp, mcpPending{call: rec, id: c.ID, name: c.Name, args: args, at: now})
	}
	if over := len(l.mcp) - MaxPending; over > 0 {
		l.mcp = l.mcp[over:]
	}
}

// mcpName says whether a model's tool name names MCP tool tool.
func mcpName(name, tool string) bool {
	return name == tool || strings.HasSuffix(name, "__"+tool) ||
		strings.HasPrefix(name, "mcp_") && strings.HasSuffix(name, "_"+tool)
}

// AnnotateMCP adds the link to an MCP call's record whose tool and
// arguments are one waiting tool call's. The tool call is then taken.
func (l *Linker) AnnotateMCP(rec *audit.Record) {
	if rec == nil || rec.MCP == nil || strings.HasSuffix(rec.MCP.Arguments, "…") {
		return
	}
	var args map[string]any
	if a := rec.MCP.Arguments; a == "" || a == "null" {
		args = map[string]any{}
	} else if json.Unmarshal([]byte(a), &args) != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mcp = recent(l.mcp, l.now(), func(p mcpPending) time.Time { return p.at })
	match, ok := only(l.mcp, func(p mcpPending) bool { return mcpName(p.name, rec.MCP.Tool) && reflect.DeepEqual(p.args, args) })
	if !ok {
		return
	}
	p := l.mcp[match]
	l.mcp = append(l.mcp[:match], l.mcp[match+1:]...)
	link(rec, p.call, p.id, p.name)
}
