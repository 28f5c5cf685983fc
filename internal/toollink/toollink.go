// Package toollink links the processes an agent runs to the model tool
// calls that asked for them. A model call's record (agentbox/model_call)
// names the tool calls the model made; when the sandbox then starts a
// shell whose script is a tool call's command (sh -c, bash -lc: exactly,
// or holding it whole when the agent's tool wraps it), the process's
// record gets the link: the tool call's id and name, and the model call
// record's id. A link is written only when it is sure: the command came
// before the process, on the same sandbox, and no other waiting tool call
// matches it too. Pure: records in, details out.
package toollink

import (
	"encoding/json"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

// Bounds: a tool call waits for its process at most Window, and at most
// MaxPending wait (the oldest go first); a command held inside a larger
// script must be at least MinContained bytes (a short one could be any
// wrapper's word).
const (
	Window       = 10 * time.Minute
	MaxPending   = 256
	MinContained = 8
)

// Linker is one sandbox's waiting tool calls. Safe for concurrent use:
// the gateway notes model calls, the audit receiver annotates processes.
type Linker struct {
	mu      sync.Mutex
	pending []pending
	// mcp are the tool calls that may be an MCP server's (mcp.go).
	mcp []mcpPending
	now func() time.Time
}

type pending struct {
	call    *audit.Record // its model call's record (Seq set once written)
	id      string
	name    string
	command string   // the shell script the tool runs
	argv    []string // or the whole argv, when the tool gave one
	at      time.Time
}

// New makes a linker.
func New() *Linker { return &Linker{now: time.Now} }

// Note takes a model call's record: its tool calls that run a command
// wait for their process.
func (l *Linker) Note(rec *audit.Record) {
	if rec == nil || rec.Model == nil || len(rec.Model.ToolCalls) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noteMCP(rec)
	now := l.now()
	for _, c := range rec.Model.ToolCalls {
		if c.Truncated {
			continue // its command is not whole: never guess
		}
		cmd, argv := Command(c.Input)
		if cmd == "" && len(argv) == 0 {
			continue
		}
		l.pending = append(l.pending, pending{call: rec, id: c.ID, name: c.Name, command: cmd, argv: argv, at: now})
	}
	if over := len(l.pending) - MaxPending; over > 0 {
		l.pending = l.pending[over:]
	}
}

// Annotate adds the link to a process record (sentry/execve) whose shell
// script is one waiting tool call's command. The tool call is then taken.
func (l *Linker) Annotate(rec *audit.Record) {
	if rec == nil || rec.Event != "sentry/execve" || rec.Process == nil {
		return
	}
	script, isShell := shellScript(rec.Process.Argv)
	argv := rec.Process.Argv
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = recent(l.pending, l.now(), func(p pending) time.Time { return p.at })
	match, ok := only(l.pending, func(p pending) bool { return matches(p, argv, script, isShell) })
	if !ok {
		return
	}
	p := l.pending[match]
	l.pending = append(l.pending[:match], l.pending[match+1:]...)
	link(rec, p.call, p.id, p.name)
}

// recent are the waiting tool calls still within Window.
func recent[T any](waiting []T, now time.Time, at func(T) time.Time) []T {
	keep := waiting[:0]
	for _, p := range waiting {
		if now.Sub(at(p)) <= Window {
			keep = append(keep, p)
		}
	}
	return keep
}

// only is the one waiting tool call that matches (false: none, or more
// than one: not sure which).
func only[T any](waiting []T, match func(T) bool) (int, bool) {
	found := -1
	for i, p := range waiting {
		if !match(p) {
			continue
		}
		if found >= 0 {
			return 0, false
		}
		found = i
	}
	return found, found >= 0
}

// link writes into rec the tool call it is linked to, and that call's
// model call record.
func link(rec, call *audit.Record, id, name string) {
	if rec.Detail == nil {
		rec.Detail = map[string]string{}
	}
	rec.Detail["tool_call_id"] = id
	rec.Detail["tool_call_name"] = name
	if call.Seq != 0 {
		rec.Detail["model_call"] = call.Sandbox + "/" + strconv.FormatUint(call.Seq, 10)
	}
	if call.Model != nil {
		rec.Detail["model"] = call.Model.Name
	}
}

func matches(p pending, argv []string, script string, isShell bool) bool {
	if len(p.argv) > 0 && slices.Equal(p.argv, argv) {
		return true
	}
	if !isShell {
		return false
	}
	cmd := p.command
	if cmd == "" && len(p.argv) >= 3 {
		if s, ok := shellScript(p.argv); ok {
			cmd = s
		}
	}
	cmd = strings.TrimSpace(cmd)
	switch {
	case cmd == "":
		return false
	case strings.TrimSpace(script) == cmd:
		return true
	case len(cmd) < MinContained:
		return false
	case strings.Contains(script, cmd):
		return true
	}
	// A wrapper that single-quotes the command (eval '…') spells each '
	// in it as '\'' or '"'"'.
	if !strings.Contains(cmd, "'") {
		return false
	}
	for _, q := range []string{`'\''`, `'"'"'`} {
		if strings.Contains(script, "'"+strings.ReplaceAll(cmd, "'", q)+"'") {
			return true
		}
	}
	return false
}

// shells are the interpreters whose -c script is a tool's command.
var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "zsh": true, "ash": true}

// shellScript is argv's script when argv is a shell run with -c (bash
// -c, bash -lc, sh -c -l ...).
func shellScript(argv []string) (string, bool) {
	if len(argv) < 3 || !shells[path.Base(argv[0])] {
		return "", false
	}
	// The script is the first argument after the options, one of which
	// holds c.
	c := false
	for _, a := range argv[1:] {
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return a, c && a != "-" && a != "--"
		}
		if !strings.HasPrefix(a, "--") && strings.Contains(a[1:], "c") {
			c = true
		}
	}
	return "", false
}

// Command is the command a tool call's input (JSON) asks to run: a
// string (the shell script), or an argv. Field names the agents use:
// command, cmd, script.
func Command(input string) (string, []string) {
	var in map[string]json.RawMessage
	if json.Unmarshal([]byte(input), &in) != nil {
		return "", nil
	}
	for _, k := range []string{"command", "cmd", "script"} {
		raw, ok := in[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, nil
		}
		var argv []string
		if json.Unmarshal(raw, &argv) == nil && len(argv) > 0 {
			return "", argv
		}
	}
	return "", nil
}
