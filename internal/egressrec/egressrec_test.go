package egressrec

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/egressev"
	"agentbox.dev/agentbox/internal/modelapi"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func TestDNS(t *testing.T) {
	scrub, err := audit.NewScrubber(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A token smuggled in a name is redacted like one in argv.
	r := DNS(egressev.Decision{Outcome: egressev.DNSRefused, Name: "ghp_abcdefghijklmnopqrstuvwxyz0123.evil.test", Type: "A", Rule: "no host rule matches", Rcode: "RCodeNameError"}, scrub)
	if r.Event != "agentbox/dns_refused" || r.Status != "Failure" || strings.Contains(r.Message, "ghp_abc") || !strings.Contains(r.Detail["name"], audit.Redacted) {
		t.Errorf("refused: %+v %v", r, r.Detail)
	}
	r = DNS(egressev.Decision{Outcome: egressev.DNSAnswered, Name: "api.example.com", Type: "A", Rule: "allow[0] host api.example.com",
		Rcode: "RCodeSuccess", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}, TTL: 5 * time.Minute}, scrub)
	if r.Event != "agentbox/dns_answered" || r.Status != "Success" || r.Detail["addresses"] != "192.0.2.1, 192.0.2.2" || r.Detail["allowed_for"] != "5m0s" || r.Detail["transport"] != "udp" {
		t.Errorf("answered: %+v %v", r, r.Detail)
	}
	r = DNS(egressev.Decision{Outcome: egressev.DNSFailed, Name: "api.example.com", Type: "AAAA", Err: errors.New("upstream down"), TCP: true}, scrub)
	if r.Event != "agentbox/dns_failed" || r.Detail["error"] != "upstream down" || r.Detail["transport"] != "tcp" || !strings.HasSuffix(r.Message, ": upstream down") {
		t.Errorf("failed: %+v %v", r, r.Detail)
	}
	if _, ok := r.Detail["addresses"]; ok {
		t.Error("empty details are left out")
	}
}

// Each kind of gateway event becomes its record: the name the agent gave,
// scrubbed; the address dialled as the destination; empty and zero details
// left out.
func TestGateway(t *testing.T) {
	scrub, err := audit.NewScrubber(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort("[::ffff:10.0.0.5]:40000")
	for _, tc := range []struct {
		name     string
		e        egressev.Event
		event    string
		status   string
		msg      string
		detail   map[string]string
		dst      audit.Endpoint
		noDetail []string
	}{
		{name: "request", e: egressev.Event{Kind: egressev.Request, Client: client, Port: 443, Proto: "https", SNI: "api.test", Host: "api.test",
			Rule: "allow[0] host api.test", Dialled: "192.0.2.7:443", Method: "POST", Path: "/v1/x", Status: 201, Sent: 10, Received: 20, Injected: []string{"Authorization"}},
			event: "agentbox/egress_request", status: "Success", msg: "POST https://api.test/v1/x -> 201 (allow[0] host api.test)",
			detail: map[string]string{"egress": "allow", "injected": "Authorization", "http_status": "201", "bytes_sent": "10", "client": "[::ffff:10.0.0.5]:40000"},
			dst:    audit.Endpoint{IP: "192.0.2.7", Port: 443}},
		{name: "a request that waited for its claim's key", e: egressev.Event{Kind: egressev.Request, Port: 443, Proto: "https", Host: "api.test", Rule: "r", Dialled: "192.0.2.7:443",
			Method: "GET", Path: "/", Status: 200, KeyWait: 3 * time.Second, KeyNotGiven: true},
			event: "agentbox/egress_request", status: "Success", detail: map[string]string{"claim_key_wait": "3s"},
			dst: audit.Endpoint{IP: "192.0.2.7", Port: 443}, noDetail: []string{"injected"}},
		{name: "a request its claim's key reached in time", e: egressev.Event{Kind: egressev.Request, Port: 443, Proto: "https", Host: "api.test", Rule: "r", Dialled: "192.0.2.7:443",
			Method: "GET", Path: "/", Status: 200, KeyWait: 40 * time.Millisecond, Injected: []string{"Authorization"}},
			event: "agentbox/egress_request", status: "Success", detail: map[string]string{"claim_key_wait": "40ms", "injected": "Authorization"},
			dst: audit.Endpoint{IP: "192.0.2.7", Port: 443}, noDetail: []string{"claim_key"}},
		{name: "an MCP call the rule refused", e: egressev.Event{Kind: egressev.Refused, Port: 443, Proto: "https", Host: "mcp.test", Rule: "r", Method: "POST", Path: "/mcp",
			Reason: "mcp: tool delete_repo is not allowed by r", MCP: &egressev.MCPEvent{Refused: []string{"delete_repo"}}},
			event: "agentbox/egress_refused", status: "Failure", detail: map[string]string{"mcp_refused": "delete_repo"}, dst: audit.Endpoint{Port: 443}, noDetail: []string{"mcp_calls"}},
		{name: "passthrough", e: egressev.Event{Kind: egressev.Passthrough, Port: 443, Proto: "tls", SNI: "pypi.test", Rule: "r", Dialled: "192.0.2.8:443"},
			event: "agentbox/egress_connection", status: "Success", msg: "tls pypi.test:443 via 192.0.2.8:443: 0 bytes sent, 0 received (r)",
			detail: map[string]string{"sni": "pypi.test", "egress": "allow"}, dst: audit.Endpoint{IP: "192.0.2.8", Port: 443},
			noDetail: []string{"bytes_sent", "bytes_received", "host", "method", "client"}},
		{name: "websocket", e: egressev.Event{Kind: egressev.WebSocketClosed, Port: 443, Host: "ws.test", Path: "/chat", Dialled: "192.0.2.9:443", Reason: "idle", Duration: time.Second},
			event: "agentbox/websocket_closed", status: "Success", msg: "websocket ws.test/chat via 192.0.2.9:443 closed after 1s: 0 bytes sent, 0 received (idle)",
			dst: audit.Endpoint{IP: "192.0.2.9", Port: 443}},
		{name: "refused without a name", e: egressev.Event{Kind: egressev.Refused, Port: 8443, Reason: "no SNI"},
			event: "agentbox/egress_refused", status: "Failure", msg: "port 8443 refused: no SNI",
			detail: map[string]string{"egress": "deny", "reason": "no SNI"}, dst: audit.Endpoint{Port: 8443}},
		{name: "a token in the host is scrubbed", e: egressev.Event{Kind: egressev.Refused, Port: 443, Host: "ghp_abcdefghijklmnopqrstuvwxyz0123.evil.test", Reason: "no host rule"},
			event: "agentbox/egress_refused", status: "Failure", dst: audit.Endpoint{Port: 443}},
	} {
		r := Gateway(tc.e, scrub)
		if r.Event != tc.event || r.Status != tc.status || (tc.msg != "" && r.Message != tc.msg) {
			t.Errorf("%s: %s %s %q", tc.name, r.Event, r.Status, r.Message)
		}
		for k, v := range tc.detail {
			if r.Detail[k] != v {
				t.Errorf("%s: detail %s = %q, want %q", tc.name, k, r.Detail[k], v)
			}
		}
		for _, k := range tc.noDetail {
			if _, ok := r.Detail[k]; ok {
				t.Errorf("%s: detail %s kept: %q", tc.name, k, r.Detail[k])
			}
		}
		if r.Dst == nil || *r.Dst != tc.dst {
			t.Errorf("%s: dst %+v, want %+v", tc.name, r.Dst, tc.dst)
		}
		if tc.e.Client.IsValid() && (r.Src == nil || r.Src.IP != "10.0.0.5" || r.Src.Port != 40000) {
			t.Errorf("%s: src %+v", tc.name, r.Src)
		}
		if strings.Contains(r.Message+r.Detail["host"], "ghp_abc") {
			t.Errorf("%s: a token in the record: %q %v", tc.name, r.Message, r.Detail)
		}
	}
}

// One record per place and encoding a secret came back in; never its value.
func TestReflected(t *testing.T) {
	e := egressev.Event{Kind: egressev.Request, Host: "echo.test", Method: "GET", Path: "/echo", Status: 200, Rule: "r", Dialled: "192.0.2.1:443",
		Reflected: []egressev.Reflection{{Where: "body", Encoding: "raw", Count: 2}, {Where: "header X-Echo", Encoding: "base64", Count: 1}}}
	recs := Reflected(e, nil)
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	for i, r := range recs {
		want := e.Reflected[i]
		if r.Event != "agentbox/secret_reflected" || r.Detail["where"] != want.Where || r.Detail["encoding"] != want.Encoding ||
			r.Detail["count"] != fmt.Sprint(want.Count) || r.Dst == nil || r.Dst.IP != "192.0.2.1" {
			t.Errorf("record %d: %+v %v", i, r, r.Detail)
		}
	}
	if len(Reflected(egressev.Event{Kind: egressev.Request}, nil)) != 0 {
		t.Error("records for a response that carried nothing back")
	}
}

func TestWithheld(t *testing.T) {
	d := egressev.Decision{Name: "api.test", Type: "A", Rule: "allow[0] host api.test"}
	r := Withheld(d, egressev.Withheld{Addr: netip.MustParseAddr("10.0.0.1"), Reason: "private"}, nil)
	if r.Event != "agentbox/dns_address_withheld" || r.Status != "Failure" || r.Detail["address"] != "10.0.0.1" || r.Detail["reason"] != "private" ||
		r.Message != "A api.test answered 10.0.0.1, not opened: private" {
		t.Fatalf("%+v %v", r, r.Detail)
	}
}

// A connect record gets the egress rules' verdict on its destination, by
// the live plan once there is one; connects to the pod's resolver address
// are the resolver's or the gateway's; other records are left alone.
func TestConnectDecision(t *testing.T) {
	start, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
		{CIDR: "192.0.2.0/24", Ports: []int{443}}, {Host: "api.test", Ports: []int{443, 8443}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var live atomic.Pointer[netpolicy.Plan]
	dns := netip.MustParseAddr("169.254.53.53")
	annotate := ConnectDecision(start, &live, dns)
	connect := func(ip string, port int) *audit.Record {
		r := &audit.Record{Event: "syscall/connect", Dst: &audit.Endpoint{IP: ip, Port: port}}
		annotate(r)
		return r
	}
	for _, tc := range []struct {
		ip       string
		port     int
		egress   string
		rulePart string
	}{
		{"192.0.2.9", 443, "allow", "192.0.2.0/24"},
		{"192.0.2.9", 80, "deny", ""},
		{"198.51.100.1", 443, "deny", ""},
		{"169.254.53.53", 53, "allow", "pod resolver"},
		{"169.254.53.53", 8443, "allow", RuleGateway},
		{"169.254.53.53", 22, "deny", "no gateway port"},
	} {
		r := connect(tc.ip, tc.port)
		if r.Detail["egress"] != tc.egress || !strings.Contains(r.Detail["egress_rule"], tc.rulePart) {
			t.Errorf("%s:%d: %v", tc.ip, tc.port, r.Detail)
		}
	}
	// Tightened live to nothing: the CIDR rule no longer allows.
	live.Store(&netpolicy.Plan{Enforced: true})
	if r := connect("192.0.2.9", 443); r.Detail["egress"] != "deny" {
		t.Errorf("after tightening: %v", r.Detail)
	}
	other := &audit.Record{Event: "syscall/open", Dst: &audit.Endpoint{IP: "192.0.2.9", Port: 443}}
	annotate(other)
	if other.Detail != nil {
		t.Errorf("a record other than a connect was annotated: %v", other.Detail)
	}
}

func TestModelCall(t *testing.T) {
	scrub, err := audit.NewScrubber(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := egressev.Event{Kind: egressev.Request, Proto: "https", SNI: "api.anthropic.com", Host: "api.anthropic.com", Method: "POST", Path: "/v1/messages",
		Status: 200, Rule: "allow[0] host api.anthropic.com ports [443]", Dialled: "10.0.0.9:443", Injected: []string{"X-Api-Key"},
		Model: &egressev.ModelCall{API: modelapi.Anthropic, Answered: true, FirstByte: 41200 * time.Microsecond, Application: "claude-cli/2.1",
			Request: modelapi.Request{Model: "claude-asked", Stream: true, Digest: "ab", Bytes: 10},
			Response: modelapi.Response{Model: "claude-answered", StopReason: "tool_use", Usage: modelapi.Usage{Known: true, Prompt: 12, Completion: 30, Total: 42}, Events: 5,
				ToolCalls: []modelapi.ToolCall{{ID: "toolu_1", Name: "Bash", Input: `{"command":"curl -H 'Authorization: Bearer abcdefghijklmnopqrstuvwxyz' https://x/"}`}}}}}
	r := Gateway(e, scrub)
	m := r.Model
	if r.Event != "agentbox/model_call" || m == nil || m.Name != "claude-answered" || m.Provider != "Anthropic" || m.Requested != "claude-asked" ||
		m.Tokens == nil || *m.Tokens != (audit.Tokens{Prompt: 12, Completion: 30, Total: 42}) || m.FirstByteMS != 41.2 || m.Application != "claude-cli/2.1" ||
		len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != "Bash" || r.Detail["injected"] != "X-Api-Key" {
		t.Fatalf("record %+v, model %+v", r, m)
	}
	// A tool call's input is scrubbed as argv is.
	if strings.Contains(m.ToolCalls[0].Input, "abcdefghijklmnop") {
		t.Errorf("the bearer token is in the record: %s", m.ToolCalls[0].Input)
	}
	if want := "model call to claude-answered: 12 prompt + 30 completion tokens, stop tool_use, tool calls Bash; POST https://api.anthropic.com/v1/messages -> 200"; !strings.HasPrefix(r.Message, want) {
		t.Errorf("message %q, want %q...", r.Message, want)
	}
	// No answer: the model asked for, and why there is nothing else.
	e.Model = &egressev.ModelCall{API: modelapi.OpenAI, Request: modelapi.Request{Model: "gpt-x"}}
	e.Status = 502
	if r := Gateway(e, scrub); r.Model.Name != "gpt-x" || r.Model.Problem != "no response" || r.Model.Tokens != nil || r.Model.Provider != "OpenAI" {
		t.Fatalf("unanswered: %+v", r.Model)
	}
	// A refusal is not a model call, whatever the rule.
	e.Kind = egressev.Refused
	if r := Gateway(e, scrub); r.Event != "agentbox/egress_refused" || r.Model != nil {
		t.Fatalf("refused: %+v", r)
	}
}

// audit.model: calls keeps no tool input and no digest; content keeps the
// end of what was sent, scrubbed.
func TestModelCallKeep(t *testing.T) {
	scrub, err := audit.NewScrubber(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	call := func(keep string) *audit.ModelCall {
		e := egressev.Event{Kind: egressev.Request, Host: "api.openai.com", Method: "POST", Path: "/v1/responses", Status: 200,
			Model: &egressev.ModelCall{API: modelapi.OpenAI, Answered: true, Keep: keep,
				Request:  modelapi.Request{Model: "gpt-x", Digest: "ab", Bytes: 9, Content: `{"input":"use Authorization: Bearer abcdefghijklmnopqrstuvwxyz"}`},
				Response: modelapi.Response{ToolCalls: []modelapi.ToolCall{{ID: "c1", Name: "shell", Input: `{"command":"ls"}`}}}}}
		return Gateway(e, scrub).Model
	}
	if m := call(policy.ModelCalls); m.RequestDigest != "" || m.ToolCalls[0].Input != "" || m.ToolCalls[0].Name != "shell" || m.RequestContent != "" || m.Keep != "calls" {
		t.Errorf("calls: %+v", m)
	}
	if m := call(policy.ModelDigests); m.RequestDigest != "ab" || m.ToolCalls[0].Input == "" || m.RequestContent != "" {
		t.Errorf("digests: %+v", m)
	}
	m := call(policy.ModelContent)
	if m.RequestDigest != "ab" || !strings.Contains(m.RequestContent, `"input":"use Authorization`) || strings.Contains(m.RequestContent, "abcdefghijklmnop") {
		t.Errorf("content: %+v", m)
	}
}

// Each MCP call is a record of its own: the server, the tool, its
// arguments scrubbed and bounded, what came back; the request's own
// record is apart.
func TestMCPCalls(t *testing.T) {
	scrub, err := audit.NewScrubber(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := egressev.Event{Kind: egressev.Request, Port: 443, Proto: "https", Host: "mcp.test", Rule: "r", Method: "POST", Path: "/mcp", Status: 200, Dialled: "192.0.2.7:443",
		MCP: &egressev.MCPEvent{Session: "s-1", Application: "curl/8",
			Each: []egressev.MCPCallDone{
				{Tool: "a", Arguments: `{"token":"ghp_abcdefghijklmnopqrstuvwxyz0123456789","q":"` + strings.Repeat("x", 2000) + `"}`, Answered: true, ResultBytes: 10},
				{Tool: "b", Arguments: `{}`, Answered: true, ResultBytes: 3, IsError: true},
			}}}
	recs := MCPCalls(e, scrub)
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	a, b := recs[0], recs[1]
	if a.Event != "agentbox/mcp_call" || a.MCP.Server != "mcp.test" || a.MCP.Tool != "a" || a.MCP.Session != "s-1" || !a.MCP.Answered || a.MCP.ResultBytes != 10 || a.Dst == nil {
		t.Errorf("a: %+v %+v", a, a.MCP)
	}
	if strings.Contains(a.MCP.Arguments, "ghp_abc") || len(a.MCP.Arguments) > maxMCPArguments+len("…") {
		t.Errorf("a's arguments: %d bytes, %q", len(a.MCP.Arguments), a.MCP.Arguments[:80])
	}
	if !b.MCP.IsError || !strings.Contains(b.Message, "an error (3 bytes)") {
		t.Errorf("b: %s %+v", b.Message, b.MCP)
	}
	if MCPCalls(egressev.Event{Kind: egressev.Request}, scrub) != nil {
		t.Error("records for an event with no MCP")
	}
}
