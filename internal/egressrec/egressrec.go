// Package egressrec turns what a sandbox's egress decided into its trail's
// records: the gateway's connections and requests, the secrets it found
// echoed back, the resolver's answers and refusals, and the egress rules'
// verdict added to each connect the Sentry saw. Pure: names, methods and
// paths come from the sandbox, and are scrubbed like argv.
package egressrec

import (
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/egressev"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// Gateway turns a gateway event into a record. Names, methods and
// paths come from the sandbox: scrubbed like argv.
func Gateway(e egressev.Event, scrub *audit.RoleScrubber) *audit.Record {
	clean := func(s string) string { return scrubbed(scrub, s) }
	name := e.SNI
	if e.Host != "" {
		name = e.Host
	}
	name = clean(name)
	detail := map[string]string{"protocol": e.Proto, "sni": clean(e.SNI), "host": clean(e.Host), "egress_rule": e.Rule,
		"method": clean(e.Method), "path": clean(e.Path), "dialled": e.Dialled, "reason": clean(e.Reason),
		"bytes_sent": fmt.Sprint(e.Sent), "bytes_received": fmt.Sprint(e.Received), "duration": e.Duration.Round(time.Microsecond).String()}
	if e.Client.IsValid() {
		detail["client"] = e.Client.String()
	}
	if e.Status != 0 {
		detail["http_status"] = fmt.Sprint(e.Status)
	}
	if m := e.MCP; m != nil {
		// The calls let through are those it recorded each of.
		var called []string
		for _, c := range m.Each {
			called = append(called, c.Tool)
		}
		for k, v := range map[string][]string{"mcp_calls": called, "mcp_refused": m.Refused, "mcp_hidden": m.Hidden, "mcp_server_requests": m.Asked} {
			if len(v) > 0 {
				detail[k] = clean(clipList(v, 2048))
			}
		}
	}
	var typ audit.RecordType
	status, msg := "Success", ""
	switch e.Kind {
	case egressev.Request:
		typ, detail["egress"] = audit.TypeEgressRequest, "allow"
		scheme := "http"
		if e.Proto == "https" {
			scheme = "https"
		}
		if e.KeyWait > 0 {
			detail["claim_key_wait"] = e.KeyWait.Round(time.Millisecond).String()
			if e.KeyNotGiven {
				detail["claim_key"] = "none: the sandbox's claim gave no key for this host in time (a warm sandbox's request), sent without it"
			}
		}
		if len(e.Injected) > 0 {
			detail["injected"] = strings.Join(e.Injected, ", ")
		}
		msg = fmt.Sprintf("%s %s://%s%s -> %d (%s)", detail["method"], scheme, name, detail["path"], e.Status, e.Rule)
	case egressev.Passthrough:
		typ, detail["egress"] = audit.TypeEgressConnection, "allow"
		msg = fmt.Sprintf("tls %s:%d via %s: %d bytes sent, %d received (%s)", name, e.Port, e.Dialled, e.Sent, e.Received, e.Rule)
	case egressev.WebSocketClosed:
		typ, detail["egress"] = audit.TypeWebSocketClosed, "allow"
		msg = fmt.Sprintf("websocket %s%s via %s closed after %s: %d bytes sent, %d received (%s)", name, detail["path"], e.Dialled,
			e.Duration.Round(time.Millisecond), e.Sent, e.Received, detail["reason"])
	default:
		typ, detail["egress"], status = audit.TypeEgressRefused, "deny", "Failure"
		if e.Limit != "" {
			typ, detail["limit"] = audit.TypeModelLimit, e.Limit
			msg = fmt.Sprintf("model call to %s%s refused: %s", name, detail["path"], detail["reason"])
			break
		}
		target := name
		if target == "" {
			target = "port " + fmt.Sprint(e.Port)
		}
		msg = fmt.Sprintf("%s refused: %s", target, detail["reason"])
	}
	for k, v := range detail {
		if v == "" || ((k == "bytes_sent" || k == "bytes_received") && v == "0") {
			delete(detail, k)
		}
	}
	var model *audit.ModelCall
	if e.Kind == egressev.Request && e.Model != nil {
		typ, model = audit.TypeModelCall, modelCall(e.Model, clean)
		msg = modelMessage(model, msg)
	}
	r := typ.New(status, msg, detail)
	r.Model = model
	endpoints(r, e)
	if r.Dst == nil {
		r.Dst = &audit.Endpoint{Port: e.Port}
	}
	return r
}

// modelCall is the record of what the gateway read of a model call. What
// the model and the client said comes from the sandbox or its origin:
// scrubbed like argv.
func modelCall(m *egressev.ModelCall, clean func(string) string) *audit.ModelCall {
	res := m.Response
	out := &audit.ModelCall{Name: clean(res.Model), Provider: m.API.Provider(), Application: clean(m.Application), API: string(m.API),
		Requested: clean(m.Request.Model), Stream: m.Request.Stream, StopReason: clean(res.StopReason), Events: res.Events,
		RequestDigest: m.Request.Digest, RequestBytes: m.Request.Bytes, Error: clean(res.Error), Problem: res.Problem,
		Endpoint: clean(m.Endpoint.Name)}
	if m.Budgeted {
		out.Budget = &audit.ModelCharge{Reserved: m.Reserved, Charged: m.Charged, CapSet: m.CapSet}
	}
	if out.Name == "" {
		out.Name = out.Requested
	}
	if m.FirstByte > 0 {
		out.FirstByteMS = float64(m.FirstByte.Microseconds()) / 1000
	}
	if res.Usage.Known {
		out.Tokens = &audit.Tokens{Prompt: res.Usage.Prompt, Completion: res.Usage.Completion, Total: res.Usage.Total}
	}
	if !m.Answered && out.Problem == "" {
		out.Problem = "no response"
	}
	// What the role's audit.model keeps: calls, neither the tool calls'
	// inputs nor the digest of what was sent (so they are not scrubbed
	// to be dropped); content, the conversation's newest messages too.
	out.Keep = m.Keep
	calls := m.Keep == policy.ModelCalls
	if calls {
		out.RequestDigest = ""
	}
	for _, c := range res.ToolCalls {
		tc := audit.ToolCall{ID: clean(c.ID), Name: clean(c.Name)}
		if !calls {
			tc.Input, tc.Truncated = clean(c.Input), c.Truncated
		}
		out.ToolCalls = append(out.ToolCalls, tc)
	}
	if m.Keep == policy.ModelContent {
		out.RequestContent, out.ContentCut = clean(m.Request.Content), m.Request.ContentCut
	}
	return out
}

// modelMessage says what a model call was, after the request's line.
func modelMessage(m *audit.ModelCall, request string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model call to %s", orUnknown(m.Name))
	if t := m.Tokens; t != nil {
		fmt.Fprintf(&b, ": %d prompt + %d completion tokens", t.Prompt, t.Completion)
	}
	if m.StopReason != "" {
		fmt.Fprintf(&b, ", stop %s", m.StopReason)
	}
	if len(m.ToolCalls) > 0 {
		names := make([]string, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			names[i] = c.Name
		}
		fmt.Fprintf(&b, ", tool calls %s", strings.Join(names, ", "))
	}
	if m.Error != "" {
		fmt.Fprintf(&b, ", error %q", m.Error)
	}
	if m.Problem != "" {
		fmt.Fprintf(&b, " (%s)", m.Problem)
	}
	return b.String() + "; " + request
}

func orUnknown(s string) string {
	if s == "" {
		return "an unnamed model"
	}
	return s
}

// scrubbed is s as the role's scrubber leaves it ("" stays "").
func scrubbed(scrub *audit.RoleScrubber, s string) string {
	if s == "" || scrub == nil {
		return s
	}
	return scrub.Args([]string{s})[0]
}

// endpoints sets a gateway record's source (the agent's end) and its
// destination (the address the gateway dialled, where it did).
func endpoints(r *audit.Record, e egressev.Event) {
	if e.Client.IsValid() {
		r.Src = &audit.Endpoint{IP: e.Client.Addr().Unmap().String(), Port: int(e.Client.Port())}
	}
	if ap, err := netip.ParseAddrPort(e.Dialled); err == nil {
		r.Dst = &audit.Endpoint{IP: ap.Addr().String(), Port: int(ap.Port())}
	}
}

// Reflected are the records of the injected secrets e's response
// carried back, one per place and encoding (the gateway replaced them).
func Reflected(e egressev.Event, scrub *audit.RoleScrubber) []*audit.Record {
	var out []*audit.Record
	path := scrubbed(scrub, e.Path)
	for _, x := range e.Reflected {
		detail := map[string]string{"host": e.Host, "method": e.Method, "path": path, "where": x.Where, "encoding": x.Encoding,
			"count": fmt.Sprint(x.Count), "egress_rule": e.Rule, "http_status": fmt.Sprint(e.Status)}
		r := audit.TypeSecretReflected.New("Success", fmt.Sprintf("the secret injected toward %s came back in its response (%s, %s, %d time(s)): replaced before the agent read it",
			e.Host, x.Where, x.Encoding, x.Count), detail)
		endpoints(r, e)
		out = append(out, r)
	}
	return out
}

// maxMCPArguments bounds a call's arguments in its record.
const maxMCPArguments = 1024

// MCPCalls are one record per tools/call the gateway let through to an
// MCP server, with what came back. The arguments come from the sandbox:
// scrubbed like argv, and bounded.
func MCPCalls(e egressev.Event, scrub *audit.RoleScrubber) []*audit.Record {
	if e.MCP == nil {
		return nil
	}
	var out []*audit.Record
	for _, c := range e.MCP.Each {
		args := scrubbed(scrub, c.Arguments)
		if len(args) > maxMCPArguments {
			args = strings.ToValidUTF8(args[:maxMCPArguments], "") + "…"
		}
		m := &audit.MCPCall{Server: e.Host, Tool: scrubbed(scrub, c.Tool), Arguments: args, Session: scrubbed(scrub, e.MCP.Session),
			Application: e.MCP.Application, Answered: c.Answered, ResultBytes: c.ResultBytes, IsError: c.IsError}
		outcome := "no answer"
		switch {
		case c.Answered && c.IsError:
			outcome = fmt.Sprintf("an error (%d bytes)", c.ResultBytes)
		case c.Answered:
			outcome = fmt.Sprintf("a result of %d bytes", c.ResultBytes)
		}
		detail := map[string]string{"host": e.Host, "method": e.Method, "path": scrubbed(scrub, e.Path), "egress_rule": e.Rule, "http_status": fmt.Sprint(e.Status)}
		r := audit.TypeMCPCall.New("Success", fmt.Sprintf("MCP %s: tools/call %s -> %s", e.Host, m.Tool, outcome), detail)
		r.MCP = m
		endpoints(r, e)
		out = append(out, r)
	}
	return out
}

// RuleGateway names, in connect records, a connection to the pod's egress
// gateway: the gateway's own record says what it decided by name.
const RuleGateway = "egress gateway (decided by name)"

// DNS turns a resolver decision into a record. The name comes from
// the sandbox: it is scrubbed like argv.
func DNS(d egressev.Decision, scrub *audit.RoleScrubber) *audit.Record {
	name := scrubbed(scrub, d.Name)
	detail := map[string]string{"name": name, "type": d.Type, "rule": d.Rule, "rcode": d.Rcode,
		"transport": map[bool]string{true: "tcp", false: "udp"}[d.TCP]}
	status := "Failure"
	typ := map[egressev.Outcome]audit.RecordType{egressev.DNSAnswered: audit.TypeDNSAnswered, egressev.DNSRefused: audit.TypeDNSRefused,
		egressev.DNSFailed: audit.TypeDNSFailed, egressev.DNSMalformed: audit.TypeDNSMalformed}[d.Outcome]
	var msg string
	switch d.Outcome {
	case egressev.DNSAnswered:
		status = "Success"
		var addrs []string
		for _, a := range d.Addrs {
			addrs = append(addrs, a.String())
		}
		detail["addresses"] = strings.Join(addrs, ", ")
		if d.Gateway.IsValid() {
			detail["answered_with"] = d.Gateway.String() + " (the egress gateway)"
		}
		if d.Kept {
			detail["answered_from"] = "the kept answer (upstream not asked)"
		}
		var withheld []string
		for _, w := range d.Withheld {
			withheld = append(withheld, w.Addr.String()+": "+w.Reason)
		}
		detail["withheld"] = strings.Join(withheld, "; ")
		if d.TTL > 0 {
			detail["allowed_for"] = d.TTL.String()
		}
		msg = fmt.Sprintf("%s %s answered %s (%s)", d.Type, name, d.Rcode, d.Rule)
	case egressev.DNSRefused:
		msg = fmt.Sprintf("%s %s refused: %s", d.Type, name, d.Rule)
	default:
		msg = fmt.Sprintf("%s %s %s", d.Type, name, d.Outcome)
	}
	for k, v := range detail {
		if v == "" {
			delete(detail, k)
		}
	}
	if d.Err != nil {
		detail["error"] = d.Err.Error()
		msg += ": " + d.Err.Error()
	}
	return typ.New(status, msg, detail)
}

// Withheld says that an answered address was not opened, and why.
func Withheld(d egressev.Decision, w egressev.Withheld, scrub *audit.RoleScrubber) *audit.Record {
	name := scrubbed(scrub, d.Name)
	return audit.TypeDNSWithheld.New("Failure",
		fmt.Sprintf("%s %s answered %s, not opened: %s", d.Type, name, w.Addr, w.Reason),
		map[string]string{"name": name, "type": d.Type, "rule": d.Rule, "address": w.Addr.String(), "reason": w.Reason})
}

// ConnectDecision adds to each connect record what the egress rules do with
// its destination (the live plan's, once the role tightened), and which
// rule decides. The pod's resolver and gateway
// (dnsAddr) do not pass the rules: they have a link of their own, and the
// gateway decides each connection by name (its own records).
func ConnectDecision(start *netpolicy.Plan, live *atomic.Pointer[netpolicy.Plan], dnsAddr netip.Addr) func(*audit.Record) {
	gwPorts := map[int]bool{}
	for _, p := range start.HostPorts() {
		gwPorts[p] = true
	}
	return func(r *audit.Record) {
		if r.Event != "syscall/connect" || r.Dst == nil || r.Dst.IP == "" {
			return
		}
		pl := start
		if p := live.Load(); p != nil {
			pl = p
		}
		addr, err := netip.ParseAddr(r.Dst.IP)
		if err != nil {
			return
		}
		allow, rule := pl.Decide(addr, r.Dst.Port)
		if dnsAddr.IsValid() && addr.Unmap() == dnsAddr {
			switch {
			case r.Dst.Port == netpolicy.DNSPort:
				allow, rule = true, "pod resolver"
			case gwPorts[r.Dst.Port]:
				allow, rule = true, RuleGateway
			default:
				allow, rule = false, "pod resolver: no gateway port"
			}
		}
		if r.Detail == nil {
			r.Detail = map[string]string{}
		}
		r.Detail["egress"] = map[bool]string{true: "allow", false: "deny"}[allow]
		r.Detail["egress_rule"] = rule
	}
}

// clipList joins names, bounded to n bytes, saying how many there were
// when it cut.
func clipList(names []string, n int) string {
	s := strings.Join(names, ", ")
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s… (%d in all)", strings.ToValidUTF8(s[:n], ""), len(names))
}
