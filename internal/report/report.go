// Package report turns one sandbox's audit trail into its story for a
// person: the process tree with argv and exit codes, the files it
// created, changed and deleted (by directory), its network activity by
// host, what was refused or denied, the limits it hit, the gaps, and the
// chain's verification. It is pure: records in, a Report out; the
// renderers (text, HTML, JSON) only format it. Everything in a trail came
// from the sandbox or names the agent chose: the renderers escape it.
package report

import (
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/modelapi"
)

// Report is one sandbox's story.
type Report struct {
	Sandbox      string    `json:"sandbox_id"`
	Pod          string    `json:"pod,omitempty"`
	Namespace    string    `json:"namespace,omitempty"`
	Role         string    `json:"role,omitempty"`
	PolicyDigest string    `json:"policy_digest,omitempty"`
	Start        time.Time `json:"start"`
	End          time.Time `json:"end"`
	Records      int       `json:"records"`

	Verify    Verification  `json:"verification"`
	Turns     []*Turn       `json:"turns,omitempty"`
	Processes []*Process    `json:"processes"`
	Files     []Directory   `json:"files"`
	Network   []Host        `json:"network"`
	Refusals  []Item        `json:"refusals"`
	Limits    []Item        `json:"limits"`
	Gaps      []Item        `json:"gaps"`
	Timeline  []Item        `json:"timeline"`
	Exit      *ContainerEnd `json:"exit,omitempty"`
	// MCP is every MCP server call, linked to its model turn or not.
	MCP []MCPUse `json:"mcp,omitempty"`
}

// Verification is the chain's check.
type Verification struct {
	Intact     bool   `json:"intact"`
	Ended      bool   `json:"ended"`
	Problem    string `json:"problem,omitempty"`
	Gaps       int    `json:"gaps"`
	Unrecorded uint64 `json:"unrecorded"`
	Files      int    `json:"files"`
}

// Process is a node of the process tree.
type Process struct {
	PID       int32      `json:"pid"`
	Name      string     `json:"name,omitempty"`
	Argv      []string   `json:"argv,omitempty"`
	Exe       string     `json:"exe,omitempty"`
	Container string     `json:"container_id,omitempty"`
	Start     time.Time  `json:"start"`
	ExitCode  *int32     `json:"exit_code,omitempty"`
	Signal    *int32     `json:"signal,omitempty"`
	Children  []*Process `json:"children,omitempty"`
	// Execs are the images the process ran after its first (exec without
	// fork), oldest first.
	Execs []string `json:"execs,omitempty"`
	// ToolCall is the model tool call that started it ("" none known):
	// its own link, or its parent's.
	ToolCall string `json:"tool_call,omitempty"`

	parent *Process
	tool   *ToolUse
}

// Turn is one model call: what the model answered, and what the tool
// calls it asked for did.
type Turn struct {
	Time       time.Time  `json:"time"`
	Seq        uint64     `json:"seq"`
	Model      string     `json:"model"`
	API        string     `json:"api"`
	Tokens     int64      `json:"tokens"`
	StopReason string     `json:"stop_reason,omitempty"`
	Client     string     `json:"client,omitempty"`
	PID        int32      `json:"pid,omitempty"`
	Tools      []*ToolUse `json:"tool_calls,omitempty"`
	// SentDigest is the SHA-256 of what the model was sent; Read, the
	// newest tool result in it (what the agent had just read: where a
	// prompt injection comes from), when the role kept the content
	// (audit.model: content), and ReadCall the tool call it answered.
	SentDigest string `json:"sent_digest,omitempty"`
	Read       string `json:"read,omitempty"`
	ReadCall   string `json:"read_call,omitempty"`
}

// Refused says whether a tool call of the turn had something refused.
func (t *Turn) Refused() bool {
	for _, c := range t.Tools {
		if len(c.Refusals) > 0 {
			return true
		}
	}
	return false
}

// ToolUse is a tool call of a turn: the processes it started (linked by
// the runtime, toollink) and what was refused to them or their children.
type ToolUse struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Input     string  `json:"input,omitempty"`
	Processes []int32 `json:"processes,omitempty"`
	Refusals  []Item  `json:"refusals,omitempty"`
	// MCP are the MCP server calls the runtime linked to it.
	MCP []MCPUse `json:"mcp,omitempty"`
}

// MCPUse is one tools/call the gateway passed to an MCP server.
type MCPUse struct {
	Time     time.Time `json:"time"`
	Seq      uint64    `json:"seq"`
	Server   string    `json:"server"`
	Tool     string    `json:"tool"`
	Answered bool      `json:"answered"`
	Bytes    int64     `json:"result_bytes"`
	IsError  bool      `json:"is_error"`
	// ToolCall is the model's tool call it was linked to ("" none).
	ToolCall string `json:"tool_call,omitempty"`
}

// Directory groups the changed files under one directory.
type Directory struct {
	Dir   string       `json:"dir"`
	Files []FileChange `json:"files"`
}

// FileChange is one thing done to a file.
type FileChange struct {
	Time   time.Time `json:"time"`
	Op     string    `json:"op"` // created, changed, deleted, renamed, linked, mode
	Path   string    `json:"path"`
	Target string    `json:"target,omitempty"`
	Mode   string    `json:"mode,omitempty"`
	PID    int32     `json:"pid,omitempty"`
	Comm   string    `json:"comm,omitempty"`
}

// Host is the network activity toward one name (or address).
type Host struct {
	Host      string   `json:"host"`
	Addresses []string `json:"addresses,omitempty"`
	Lookups   int      `json:"lookups"`
	Allowed   int      `json:"allowed"`
	Denied    int      `json:"denied"`
	Requests  []string `json:"requests,omitempty"`
}

// Item is one notable record.
type Item struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Event   string    `json:"event"`
	Message string    `json:"message"`
	PID     int32     `json:"pid,omitempty"`
	Seq     uint64    `json:"seq"`
}

// ContainerEnd is how the sandbox's root ended.
type ContainerEnd struct {
	Message string `json:"message"`
	Status  string `json:"status,omitempty"`
}

const maxRequests = 20

// Build makes the report of one sandbox's records (in chain order) and
// the trail's verification.
func Build(recs []*audit.Record, v audit.VerifyResult) *Report {
	rep := &Report{Records: len(recs), Verify: Verification{Intact: v.Problem == nil, Ended: v.Ended, Gaps: v.Gaps, Unrecorded: v.Unrecorded, Files: len(v.Files)}}
	if v.Problem != nil {
		rep.Verify.Problem = v.Problem.Error()
	}
	b := builder{rep: rep, procs: map[int32]*Process{}, hosts: map[string]*Host{}, byAddr: map[string]string{}, turns: map[string]*Turn{}}
	for _, r := range recs {
		b.add(r)
	}
	b.finish()
	return rep
}

type builder struct {
	rep    *Report
	procs  map[int32]*Process // the live process of each pid
	roots  []*Process
	files  []FileChange
	hosts  map[string]*Host
	byAddr map[string]string // address -> the name it answered
	turns  map[string]*Turn  // by the model call record's id (SANDBOX/SEQ)
}

func recTime(r *audit.Record) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, r.Time)
	return t
}

func (b *builder) add(r *audit.Record) {
	rep := b.rep
	t := recTime(r)
	if rep.Sandbox == "" {
		rep.Sandbox = r.Sandbox
	}
	if rep.Start.IsZero() || t.Before(rep.Start) {
		rep.Start = t
	}
	if t.After(rep.End) {
		rep.End = t
	}
	if r.Role != "" {
		rep.Role, rep.PolicyDigest = r.Role, r.PolicyDigest
	}
	if r.PodName != "" {
		rep.Pod = r.PodNamespace + "/" + r.PodName
	}
	if r.Namespace != "" {
		rep.Namespace = r.Namespace
	}
	item := Item{Time: t, Event: r.Event, Message: r.Message, Seq: r.Seq}
	if r.Process != nil {
		item.PID = r.Process.PID
	}
	switch {
	case r.Event == "container/start":
		p := b.spawn(r.Process.PID, 0, t)
		p.Name, p.Argv, p.Container = r.Process.Name, r.Process.Argv, r.Container
		b.timeline(item, "start", "container "+r.Container+" started: "+strings.Join(r.Process.Argv, " "))
	case r.Event == "sentry/clone":
		c := b.spawn(r.Process.ChildPID, r.Process.PID, t)
		if parent := b.procs[r.Process.PID]; parent != nil {
			c.Name, c.Argv, c.Exe, c.Container = parent.Name, parent.Argv, parent.Exe, parent.Container
		}
	case r.Event == "sentry/execve":
		p := b.procs[r.Process.PID]
		if p == nil {
			p = b.spawn(r.Process.PID, r.Process.PPID, t)
		}
		if p.Exe != "" && p.Exe != r.Process.Exe || len(p.Execs) > 0 {
			p.Execs = append(p.Execs, strings.Join(r.Process.Argv, " "))
		}
		p.Name, p.Argv, p.Exe = r.Process.Name, r.Process.Argv, r.Process.Exe
		if p.Exe != "" {
			p.Name = path.Base(p.Exe) // the new image, not the comm before it
		}
		b.linkTool(p, r)
	case r.Event == "sentry/task_exit":
		if p := b.procs[r.Process.PID]; p != nil {
			p.ExitCode, p.Signal = r.Process.ExitSts, r.Process.ExitSignal
			if n := r.Process.Name; n != "" && n != p.Name {
				// Its name at exit says what it was: for a fork that ran
				// without exec (a shell's applet or subshell), whose argv
				// is its parent's, and for a multi-call binary.
				p.Name = n
				if p.Exe == "" {
					p.Argv = nil
				}
			}
			delete(b.procs, r.Process.PID)
		}
	case r.ClassUID == audit.ClassFileSystem:
		b.file(r, t)
	case r.Event == "agentbox/dns_answered":
		h := b.host(r.Detail["name"])
		h.Lookups++
		for _, a := range strings.Split(r.Detail["addresses"], ", ") {
			if a != "" {
				h.Addresses = appendUnique(h.Addresses, a)
				b.byAddr[a] = h.Host
			}
		}
	case r.Event == "agentbox/mcp_call" && r.MCP != nil:
		b.mcp(r, t)
	case r.Event == "agentbox/model_call" && r.Model != nil:
		b.turn(r, t)
		fallthrough
	case r.Event == "agentbox/egress_request":
		h := b.host(r.Detail["host"])
		h.Allowed++
		if len(h.Requests) < maxRequests {
			h.Requests = append(h.Requests, r.Detail["method"]+" "+r.Detail["path"]+" -> "+r.Detail["http_status"])
		}
	case r.Event == "agentbox/egress_connection":
		h := b.host(r.Detail["sni"])
		h.Allowed++
	case r.Event == "syscall/connect" && r.Dst != nil && r.Dst.IP != "":
		name := r.Dst.IP
		if n, ok := b.byAddr[r.Dst.IP]; ok {
			name = n
		}
		h := b.host(name)
		addr := netip.AddrPortFrom(mustAddr(r.Dst.IP), uint16(r.Dst.Port)).String()
		h.Addresses = appendUnique(h.Addresses, addr)
		if r.Detail["egress"] == "deny" {
			h.Denied++
			b.refusal(item, "connect to "+addr+" ("+name+") denied by the egress rules")
		} else {
			h.Allowed++
		}
	}
	switch r.Event {
	case "agentbox/refused", "agentbox/exec_refused", "agentbox/dns_refused", "agentbox/dns_address_withheld",
		"agentbox/egress_refused", "agentbox/egress_denied", "agentbox/sandbox_failed", "agentbox/container_failed", "agentbox/policy_refused":
		b.refusal(item, r.Message)
		if name := r.Detail["name"]; name != "" {
			b.host(name).Denied++
		} else if sni := r.Detail["sni"]; sni != "" {
			b.host(sni).Denied++
		}
	case "agentbox/limit", "agentbox/audit_full":
		item.Kind = "limit"
		rep.Limits = append(rep.Limits, item)
		rep.Timeline = append(rep.Timeline, item)
	case audit.EventGap:
		item.Kind = "gap"
		rep.Gaps = append(rep.Gaps, item)
		rep.Timeline = append(rep.Timeline, item)
	case "agentbox/anomaly":
		item.Kind = "gap"
		rep.Gaps = append(rep.Gaps, item)
	case "agentbox/role_resolved", "agentbox/profile_applied", "agentbox/exec":
		b.timeline(item, "decision", r.Message)
	case "agentbox/container_exit":
		rep.Exit = &ContainerEnd{Message: r.Message, Status: r.Detail["exit_status"]}
		b.timeline(item, "exit", r.Message)
	case audit.EventSandboxEnd:
		b.timeline(item, "end", r.Message)
	}
	if r.ClassUID == audit.ClassProcess && r.Status == "Failure" && r.Event == "syscall/execve" && r.File != nil {
		b.refusal(item, "exec of "+r.File.Path+" failed: "+errnoText(r.Errno))
	}
}

func (b *builder) timeline(it Item, kind, msg string) {
	it.Kind, it.Message = kind, msg
	b.rep.Timeline = append(b.rep.Timeline, it)
}

func (b *builder) refusal(it Item, msg string) {
	it.Kind, it.Message = "refusal", msg
	b.rep.Refusals = append(b.rep.Refusals, it)
	b.rep.Timeline = append(b.rep.Timeline, it)
	// Beside the model turn whose tool call started the process (or its
	// ancestor).
	for p := b.procs[it.PID]; p != nil && it.PID != 0; p = p.parent {
		if p.tool != nil {
			p.tool.Refusals = append(p.tool.Refusals, it)
			break
		}
	}
}

// turn starts a model turn from its call's record.
func (b *builder) turn(r *audit.Record, t time.Time) {
	m := r.Model
	tu := &Turn{Time: t, Seq: r.Seq, Model: m.Name, API: m.API, StopReason: m.StopReason, Client: m.Application, PID: pidOf(r)}
	if m.Tokens != nil {
		tu.Tokens = m.Tokens.Total
	}
	tu.SentDigest = m.RequestDigest
	if m.RequestContent != "" {
		tu.Read, tu.ReadCall, _ = modelapi.LastToolResult(modelapi.API(m.API), m.RequestContent)
	}
	for _, c := range m.ToolCalls {
		tu.Tools = append(tu.Tools, &ToolUse{ID: c.ID, Name: c.Name, Input: c.Input})
	}
	b.rep.Turns = append(b.rep.Turns, tu)
	b.turns[r.Sandbox+"/"+strconv.FormatUint(r.Seq, 10)] = tu
}

// mcp notes an MCP call, under the model's tool call it was linked to.
func (b *builder) mcp(r *audit.Record, t time.Time) {
	m := r.MCP
	u := MCPUse{Time: t, Seq: r.Seq, Server: m.Server, Tool: m.Tool, Answered: m.Answered, Bytes: m.ResultBytes, IsError: m.IsError}
	if id, name := r.Detail["tool_call_id"], r.Detail["tool_call_name"]; name != "" {
		if tu := b.turns[r.Detail["model_call"]]; tu != nil {
			for _, c := range tu.Tools {
				if c.ID == id && c.Name == name {
					u.ToolCall = id
					c.MCP = append(c.MCP, u)
				}
			}
		}
	}
	b.rep.MCP = append(b.rep.MCP, u)
}

// linkTool ties a process to the tool call the runtime linked it to, or
// to its parent's.
func (b *builder) linkTool(p *Process, r *audit.Record) {
	// Gemini's tool calls have no ids: the link names the call.
	if id, name := r.Detail["tool_call_id"], r.Detail["tool_call_name"]; name != "" {
		if tu := b.turns[r.Detail["model_call"]]; tu != nil {
			for _, c := range tu.Tools {
				if c.ID == id && c.Name == name {
					p.tool, p.ToolCall = c, id
					c.Processes = append(c.Processes, p.PID)
					return
				}
			}
		}
	}
	for q := p.parent; q != nil; q = q.parent {
		if q.tool != nil {
			p.tool, p.ToolCall = q.tool, q.tool.ID
			return
		}
	}
}

func (b *builder) spawn(pid, ppid int32, t time.Time) *Process {
	p := &Process{PID: pid, Start: t}
	if parent := b.procs[ppid]; ppid != 0 && parent != nil {
		parent.Children = append(parent.Children, p)
		p.parent, p.tool, p.ToolCall = parent, parent.tool, parent.ToolCall
	} else {
		b.roots = append(b.roots, p)
	}
	b.procs[pid] = p
	return p
}

// denied are the errnos by which the sandbox's boundary refuses a file
// operation: permission, a read-only mount.
var denied = map[int64]bool{1: true, 13: true, 30: true}
