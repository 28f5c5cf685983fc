//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// gwMCP is the scripted MCP server's name on the suite's web host;
// gwMCPPass the same server under another name, passed through (the
// benchmark's reference).
const (
	gwMCP     = "mcp.gw.e2e.test"
	gwMCPPass = "mcp-pass.gw.e2e.test"
)

// TestMCPGateway: from inside gVisor, curl (glibc) speaks MCP's streamable
// HTTP to a remote server under an api: mcp rule. tools/list, as JSON and
// as server-sent events, names only the allowed tools; a tools/call of an
// allowed tool reaches the server with the key the gateway injects (the
// sandbox holds a placeholder); a tool the list hid, a denied tool, another
// method and a message with its tool named twice are answered by the
// gateway with a JSON-RPC error and never reach the server. The trail
// records each.
func TestMCPGateway(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	before := mcpServer.count()
	p := newPodIn(t, "mcp", "e2e-mcp", map[string]string{"agentbox.dev/role": "e2e-mcp"})
	rpc := func(label, accept, body string) string {
		return gwStep(label, fmt.Sprintf(`curl -sS -X POST -H 'Content-Type: application/json' -H 'Accept: %s' -H 'Mcp-Session-Id: s-1' -H 'Mcp-Protocol-Version: 2025-06-18' -H "Authorization: Bearer $MCP_TOKEN" --data '%s' https://%s/mcp`, accept, body, gwMCP))
	}
	call := func(id int, tool string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":{"q":"x"}}}`, id, tool)
	}
	both := "application/json, text/event-stream"
	script := strings.Join([]string{
		gwStep("token", `case "$MCP_TOKEN" in agentbox-placeholder-*) echo placeholder;; *) echo "not a placeholder";; esac`),
		rpc("list-json", "application/json", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`),
		rpc("list-events", "text/event-stream", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`),
		rpc("call-allowed", both, call(3, "get_issue")),
		rpc("call-echo", both, call(8, "search_issues")),
		rpc("call-over-budget", both, call(9, "get_issue")),
		rpc("call-hidden", both, call(4, "delete_repo")),
		rpc("call-denied", both, call(5, "get_secret")),
		rpc("resources", both, `{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}`),
		rpc("name-twice", both, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search_issues","name":"delete_repo"}}`),
		"echo probes-done", "sleep 600",
	}, "; ")
	id := p.containerWith(t, "c", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", script},
	})
	logs := waitLogs(t, id, "probes-done")
	lines := stepLines(logs.stdout)
	expect := func(step, want string) { t.Helper(); expectStep(t, lines, step, want, false) }
	expect("token", "placeholder")
	for _, step := range []string{"list-json", "list-events"} {
		expect(step, `"name":"search_issues"`)
		expect(step, `"name":"get_issue"`)
		if strings.Contains(lines[step], "delete_repo") || strings.Contains(lines[step], "get_secret") {
			t.Errorf("%s: the agent saw a tool the rule does not allow: %s", step, lines[step])
		}
	}
	expect("list-events", "event: message data: {")
	expect("call-allowed", "did get_issue")
	// The server echoed the key into the result: the agent reads its
	// placeholder there.
	expect("call-echo", "searched with Bearer agentbox-placeholder-")
	expect("call-over-budget", "agentbox: the sandbox's MCP budget for tool get_issue on "+gwMCP+" is spent: 1 of 1 calls (limits.mcp.tools.get_issue)")
	expect("call-hidden", `"code":-32001`)
	expect("call-hidden", "agentbox: tool delete_repo is not allowed by allow[0] host "+gwMCP)
	expect("call-denied", "agentbox: tool get_secret is not allowed")
	expect("resources", "agentbox: method resources/read is not allowed")
	expect("name-twice", `member "name" twice`)
	if t.Failed() {
		t.Fatalf("pod output:\n%s\nstderr:\n%s", logs.stdout, logs.stderr)
	}
	// What the server received: the two lists and the allowed call, each
	// with the injected key; nothing else.
	got := mcpServer.received(before)
	key := "Bearer " + secretValue
	want := []string{"tools/list  " + key, "tools/list  " + key, "tools/call get_issue " + key, "tools/call search_issues " + key}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the MCP server received %q, want %q", got, want)
	}
	p.remove()
	found := map[string]bool{}
	for _, r := range readTrail(t, p.id) {
		d := r.Detail
		switch {
		case r.Event == "agentbox/egress_request" && d["mcp_calls"] == "get_issue" && d["injected"] == "Authorization":
			found["call"] = true
		case r.Event == "agentbox/egress_request" && d["mcp_hidden"] == "get_secret, delete_repo":
			found["hidden"] = true
		case r.Event == "agentbox/egress_refused" && d["mcp_refused"] == "delete_repo":
			found["refused"] = true
		case r.Event == "agentbox/mcp_call" && r.MCP != nil && r.MCP.Tool == "get_issue":
			// One record per call, with what came back, joined to the
			// process that made it.
			if m := r.MCP; m.Server != gwMCP || m.Arguments != `{"q":"x"}` || m.Session != "s-1" || !m.Answered || m.IsError || m.ResultBytes == 0 ||
				!strings.HasPrefix(m.Application, "curl/") || r.Process == nil || r.Process.Name != "curl" {
				t.Errorf("the call's record: %+v, process %+v", m, r.Process)
			}
			found["mcp_call"] = true
		case r.Event == "agentbox/mcp_call" && r.MCP != nil && r.MCP.Tool == "search_issues":
			if strings.Contains(r.MCP.Arguments+r.Message, secretValue) {
				t.Errorf("the call's record holds the key: %+v", r.MCP)
			}
			found["mcp_call_echo"] = true
		}
		if strings.Contains(fmt.Sprint(r), secretValue) {
			t.Errorf("a record holds the key: %s", r.Event)
		}
	}
	for _, k := range []string{"call", "hidden", "refused", "mcp_call", "mcp_call_echo"} {
		if !found[k] {
			t.Errorf("trail: no record for %s", k)
		}
	}
}
