//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/e2e/modelscript"
)

// mcpSettings is how each CLI is given a remote MCP server named
// modelscript.MCPServer at url, its token from $MCP_TOKEN (the sandbox's
// placeholder): as docs/agents/ says, besides the quiet settings.
func mcpSettings(c agentCLI, url string) (settings, run string) {
	prompt := "\nexport PROMPT='" + modelscript.MCPPrompt + "'"
	transport := "http"
	if strings.HasSuffix(url, "/sse") { // the older SSE transport
		transport = "sse"
	}
	switch c.name {
	case "claude":
		// Tool search off: the MCP tools are offered to the model
		// at once, not found by its ToolSearch tool first.
		return c.quiet + prompt + `
export ENABLE_TOOL_SEARCH=false
cat > $HOME/mcp.json <<'JSON'
{"mcpServers": {"` + modelscript.MCPServer + `": {"type": "` + transport + `", "url": "` + url + `", "headers": {"Authorization": "Bearer ${MCP_TOKEN}"}}}}
JSON`, c.run + ` --mcp-config $HOME/mcp.json --strict-mcp-config`
	case "codex":
		// The scripted model does not search for tools: Codex is told
		// its model has no tool search (a catalog of its own with
		// supports_search_tool false), so it offers the MCP tools at
		// once instead of behind tool_search.
		return c.quiet + prompt + `
cat >> $HOME/.codex/config.toml <<'TOML'
[mcp_servers.` + modelscript.MCPServer + `]
url = "` + url + `"
bearer_token_env_var = "MCP_TOKEN"
TOML
codex debug models 2>/dev/null | python3 -c 'import json, sys; c = json.load(sys.stdin); [m.update(supports_search_tool=False) for m in c["models"]]; json.dump(c, sys.stdout)' > $HOME/catalog.json`,
			strings.Replace(c.run, "codex exec", "codex exec -c model_catalog_json=$HOME/catalog.json", 1)
	default:
		return c.quiet + prompt + `
cat > $HOME/.gemini/settings.json <<'JSON'
{"security": {"auth": {"selectedType": "gemini-api-key"}},
 "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false, "maxAttempts": 1},
 "privacy": {"usageStatisticsEnabled": false},
 "mcpServers": {"` + modelscript.MCPServer + `": {"type": "` + transport + `", "url": "` + url + `", "headers": {"Authorization": "Bearer $MCP_TOKEN"}}}}
JSON`, c.run
	}
}

// TestAgentCLIsMCP: Claude Code, Codex and Gemini CLI, each with the
// scripted MCP server configured as a remote MCP server over TLS
// (streamable HTTP; and the older SSE transport, which Codex does not
// take), under a role whose api: mcp rule allows search_issues and
// get_* but not get_secret, get_issue once. The scripted model asks each
// for get_issue, get_secret (denied), search_issues (whose result is a
// prompt injection asking for delete_repo, which the rule does not
// allow), delete_repo, and get_issue again. The CLI never saw the denied
// and hidden tools (tools/list named only the allowed ones), so it refused
// them itself; it showed the gateway's refusal of the call past the
// budget; the server got only the two allowed calls, with the token the
// gateway injected, which never entered the sandbox; the trail links each
// call to the model turn that asked for it. The twin, the same server and
// settings through an inspected rule without api: mcp, shows each check
// failing without the gateway's MCP code: the model was offered every
// tool and the server got every call, the injected delete_repo included.
func TestAgentCLIsMCP(t *testing.T) {
	requireEnv(t)
	requireAgentCLIImage(t)
	expectNoLeaks(t, dev)
	for _, c := range agentCLIs {
		for _, path := range []string{"/mcp", "/sse"} {
			name := c.name
			if path == "/sse" {
				if c.name == "codex" {
					continue // Codex takes streamable HTTP only
				}
				name += "-sse"
			}
			t.Run(name, func(t *testing.T) { agentCLIMCP(t, c, "https://"+gwMCP+path) })
		}
	}
	for _, c := range agentCLIs {
		t.Run(c.name+"-twin", func(t *testing.T) {
			before := mcpServer.count()
			settings, run := mcpSettings(c, "https://"+gwMCPPass+"/mcp")
			c.run = run
			lines, out, p := runAgentCLI(t, c, "e2e-agentcli-mcp-twin", settings)
			p.remove()
			var want []string
			for _, call := range modelscript.MCPCalls {
				want = append(want, call.Tool()+" Bearer "+secretValue)
			}
			got := mcpServer.calls(before)
			if !reflect.DeepEqual(got, want) || !strings.Contains(lines["run"], modelscript.MCPDone) || lines["refusals"] != "" {
				t.Errorf("without the MCP rule, the server received %q, want every call the model asked for %q, none refused; run %q, refused %q\n%s", got, want, lines["run"], lines["refusals"], out)
			}
			for _, r := range readTrail(t, p.id) {
				if r.Event == "agentbox/mcp_call" {
					t.Errorf("without the MCP rule, an MCP record: %s", r.Message)
				}
			}
			t.Logf("%s without the MCP rule: the server got %d calls (%s); CLI refusals %q", c.name, len(got), strings.Join(got, ", "), lines["refusals"])
		})
	}
}

// agentCLIMCP runs c with the scripted MCP server at url under the api:
// mcp rule, and checks what TestAgentCLIsMCP says.
func agentCLIMCP(t *testing.T, c agentCLI, url string) {
	t.Helper()
	before := mcpServer.count()
	settings, run := mcpSettings(c, url)
	c.run = run
	lines, out, p := runAgentCLI(t, c, "e2e-agentcli-mcp", settings)
	if got := lines["run"]; !strings.HasPrefix(got, "rc=0 ") || !strings.Contains(got, modelscript.MCPDone) {
		t.Errorf("run: %q", got)
	}
	budget := "agentbox: the sandbox's MCP budget for tool get_issue on " + gwMCP + " is spent"
	if got := lines["refusals"]; !strings.Contains(got, budget) {
		t.Errorf("the CLI did not show the gateway's refusal %q: %q", budget, got)
	}
	if got := lines["secret-in-sandbox"]; got != "searched" {
		t.Errorf("the key is in the sandbox: %q", got)
	}
	key := "Bearer " + secretValue
	if got, want := mcpServer.calls(before), []string{"get_issue " + key, "search_issues " + key}; !reflect.DeepEqual(got, want) {
		t.Errorf("the MCP server received the calls %q, want %q", got, want)
	}
	t.Logf("%s showed: the budget refusal %q; for the hidden tools %q", c.name, lines["refusals"], lines["hidden"])
	if t.Failed() {
		t.Fatalf("the MCP server received %q\npod output:\n%s", mcpServer.received(before), out)
	}
	p.remove()
	checkMCPTrail(t, c, p.id)
}

// checkMCPTrail: the model was asked for every call (the injected
// delete_repo included, after the search's result reached it); the two
// calls the gateway let through are agentbox/mcp_call records, each
// linked to the tool call of the model turn that asked for it, with the
// same tool and arguments; the call past the budget and the list's
// hidden tools are on the requests' records; the key is nowhere.
func checkMCPTrail(t *testing.T, c agentCLI, sandbox string) {
	t.Helper()
	recs, b := auditRecords(t, sandbox)
	asked := map[string]string{} // "MODEL_CALL TOOL_CALL_ID" -> tool name
	var names []string
	found := map[string]bool{}
	for _, r := range recs {
		switch d := r.Detail; {
		case r.Event == "agentbox/model_call" && r.Model != nil:
			for _, tc := range r.Model.ToolCalls {
				asked[fmt.Sprintf("%s/%d %s", r.Sandbox, r.Seq, tc.ID)] = tc.Name + " " + tc.Input
				names = append(names, tc.Name)
			}
		case r.Event == "agentbox/egress_refused" && d["mcp_refused"] == "get_issue":
			found["budget"] = true
		case r.Event == "agentbox/egress_request" && d["mcp_hidden"] == "get_secret, delete_repo":
			found["hidden"] = true
		}
	}
	for i, want := range modelscript.MCPCalls {
		if i >= len(names) || !strings.HasSuffix(names[i], want.Tool()) {
			t.Errorf("the model asked for %q; want %s at %d", names, want.Tool(), i)
			break
		}
	}
	for _, r := range recs {
		if r.Event != "agentbox/mcp_call" || r.MCP == nil {
			continue
		}
		m := r.MCP
		tc := asked[r.Detail["model_call"]+" "+r.Detail["tool_call_id"]]
		name, input, _ := strings.Cut(tc, " ")
		var a, b any
		json.Unmarshal([]byte(input), &a)
		json.Unmarshal([]byte(m.Arguments), &b)
		if tc == "" || !strings.HasSuffix(name, m.Tool) || !reflect.DeepEqual(a, b) || !m.Answered || m.IsError || m.Server != gwMCP || m.Session == "" {
			t.Errorf("%s: the call %s %s (%+v) is linked to %q (%v)", c.name, m.Tool, m.Arguments, m, tc, r.Detail)
			continue
		}
		found[m.Tool] = true
		t.Logf("%s: MCP call #%d %s %s linked to model call %s, tool call %s %q (session %s, %s)", c.name, r.Seq, m.Tool, m.Arguments, r.Detail["model_call"], r.Detail["tool_call_id"], name, m.Session, m.Application)
	}
	for _, k := range []string{"get_issue", "search_issues", "budget", "hidden"} {
		if !found[k] {
			t.Errorf("%s: trail: no record for %s", c.name, k)
		}
	}
	// agentbox audit report: each call under the tool call of its turn.
	rep, raw := auditReport(t, sandbox)
	var under []string
	for _, tu := range rep.Turns {
		for _, tc := range tu.Tools {
			for _, m := range tc.MCP {
				if strings.HasSuffix(tc.Name, m.Tool) {
					under = append(under, m.Tool)
				}
			}
		}
	}
	if strings.Join(under, " ") != "get_issue search_issues" {
		t.Errorf("%s: the report has %q under their model turns, want get_issue and search_issues:\n%s", c.name, under, clip(raw))
	}
	if t.Failed() {
		t.Logf("trail:\n%s", clip(string(b)))
	}
}
