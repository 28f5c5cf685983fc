package egressgw

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// An MCP server behind an api: mcp rule: a tools/call of an allowed tool
// reaches it; one of a tool the rule does not allow (and a method beyond
// the protocol's own) is answered by the gateway with a JSON-RPC error
// and never reaches it; tools/list answers, as JSON and as server-sent
// events, name only the allowed tools; the session's headers pass as they
// were; each record says what was called, refused and hidden.
// mcpFixture is a gateway whose one rule is api: mcp on a.test with tools
// and limits, terminating TLS with a CA of its own; dial opens a TLS
// connection to it that trusts that CA.
func mcpFixture(t *testing.T, tools policy.ToolsRule, limits policy.LimitsProfile) (*fixture, func() *tls.Conn) {
	t.Helper()
	ca, err := NewCA("sandbox-1", []string{"a.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, true, Config{CA: ca}, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
			{Host: "a.test", Ports: []int{port}, API: policy.APIMCP, Tools: &tools},
		}}, Limits: limits})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	return f, func() *tls.Conn {
		t.Helper()
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(15 * time.Second))
		return tls.Client(c, &tls.Config{ServerName: "a.test", RootCAs: roots})
	}
}

func TestMCPTools(t *testing.T) {
	f, dial := mcpFixture(t, policy.ToolsRule{Allow: []string{"search_issues", "get_*"}, Deny: []string{"get_secret"}},
		policy.LimitsProfile{MCP: policy.MCPBudget{Tools: map[string]int64{"get_issue": 1}}})
	var mu sync.Mutex
	var seen []string // what the server received, by method and tool
	list := `{"tools":[{"name":"search_issues"},{"name":"delete_repo"},{"name":"get_issue"},{"name":"get_secret"}]}`
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case r.URL.Path == "/.well-known/oauth-protected-resource":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"resource":"https://a.test/mcp","authorization_servers":["https://a.test"]}`)
			return true
		case r.URL.Path == "/mcp" && r.Header.Get("Authorization") == "Bearer expired":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="https://a.test/.well-known/oauth-protected-resource"`)
			w.WriteHeader(401)
			io.WriteString(w, `{"error":"invalid_token"}`)
			return true
		case r.URL.Path != "/mcp":
			return false
		}
		if r.Header.Get("Mcp-Session-Id") != "s-1" || r.Header.Get("Mcp-Protocol-Version") != "2025-06-18" {
			http.Error(w, "session headers changed", 400)
			return true
		}
		m := decodeRPC(r)
		mu.Lock()
		seen = append(seen, m.String())
		mu.Unlock()
		w.Header().Set("Mcp-Session-Id", "s-1")
		switch {
		case m.Method == "tools/list" && r.Header.Get("Accept") == "text/event-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n")
			fmt.Fprintf(w, "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%s}\n\n", m.ID, list)
		case m.Method == "tools/list":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, m.ID, list)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"did %s"}]}}`, m.ID, m.Params.Name)
		}
		return true
	}
	raw := func(req string) (int, string, http.Header) {
		t.Helper()
		tc := dial()
		defer tc.Close()
		io.WriteString(tc, req)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	post := func(body, accept string) (int, string) {
		t.Helper()
		status, b, h := raw(fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: a.test\r\nMcp-Session-Id: s-1\r\nMcp-Protocol-Version: 2025-06-18\r\nAccept: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", accept, len(body), body))
		if status == 200 && h.Get("Mcp-Session-Id") != "s-1" && !strings.Contains(b, "agentbox:") {
			t.Errorf("the session header did not come back: %v", h)
		}
		return status, b
	}
	call := func(id int, tool string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{"q":"x"}}}`, id, tool)
	}
	for _, tc := range []struct {
		name, body, accept string
		status             int
		want, notWant      []string
		detail             map[string]string
		refused            bool
	}{
		{name: "an allowed tool", body: call(1, "search_issues"), status: 200, want: []string{"did search_issues"}, detail: map[string]string{"mcp_calls": "search_issues"}},
		{name: "a tool the rule does not allow", body: call(2, "delete_repo"), status: 200, refused: true,
			want: []string{`"code":-32001`, `agentbox: tool delete_repo is not allowed by allow[0] host a.test`}, detail: map[string]string{"mcp_refused": "delete_repo"}},
		{name: "deny wins", body: call(3, "get_secret"), status: 200, refused: true, want: []string{"tool get_secret is not allowed"}},
		{name: "another method", body: `{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}`, status: 200, refused: true, want: []string{"method resources/read is not allowed"}},
		{name: "a member twice", body: `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"search_issues","name":"delete_repo"}}`, status: 400, refused: true, want: []string{"twice"}},
		{name: "tools/list as JSON", body: `{"jsonrpc":"2.0","id":6,"method":"tools/list"}`, accept: "application/json", status: 200,
			want: []string{"search_issues", "get_issue"}, notWant: []string{"delete_repo", "get_secret"}, detail: map[string]string{"mcp_hidden": "delete_repo, get_secret"}},
		{name: "tools/list as events", body: `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`, accept: "text/event-stream", status: 200,
			want: []string{"notifications/progress", "id: 1\n", "search_issues"}, notWant: []string{"delete_repo"}, detail: map[string]string{"mcp_hidden": "delete_repo, get_secret"}},
		{name: "get_issue, once", body: call(10, "get_issue"), status: 200, want: []string{"did get_issue"}, detail: map[string]string{"mcp_calls": "get_issue"}},
		{name: "get_issue past its budget", body: call(11, "get_issue"), status: 200, refused: true,
			want: []string{"the sandbox's MCP budget for tool get_issue on a.test is spent: 1 of 1 calls (limits.mcp.tools.get_issue)"}, detail: map[string]string{"mcp_refused": "get_issue", "mcp_calls": ""}},
		{name: "a batch with one refused goes nowhere", body: "[" + call(8, "search_issues") + "," + call(9, "delete_repo") + "]", status: 200, refused: true,
			want: []string{`"id":8`, "not sent: another message of its batch was refused", `"id":9`, "tool delete_repo is not allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			accept := tc.accept
			if accept == "" {
				accept = "application/json, text/event-stream"
			}
			mu.Lock()
			before := len(seen)
			mu.Unlock()
			status, body := post(tc.body, accept)
			if status != tc.status {
				t.Fatalf("status %d: %s", status, body)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("the agent got %q, want %q", body, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(body, w) {
					t.Errorf("the agent got %q, with %q", body, w)
				}
			}
			e := f.event(t)
			if (e.Kind == Refused) != tc.refused {
				t.Errorf("event kind %v (%s)", e.Kind, e.Reason)
			}
			if tc.name == "an allowed tool" {
				if each := e.MCP.Each; len(each) != 1 || each[0].Tool != "search_issues" || each[0].Arguments != `{"q":"x"}` || !each[0].Answered || each[0].IsError || each[0].ResultBytes == 0 || e.MCP.Session != "s-1" {
					t.Errorf("the call as recorded: %+v", e.MCP)
				}
			}
			mu.Lock()
			reached := len(seen) > before
			mu.Unlock()
			if reached == tc.refused {
				t.Errorf("reached the server: %v, refused %v (%v)", reached, tc.refused, seen)
			}
			for k, v := range tc.detail {
				var got []string
				if e.MCP != nil {
					var called []string
					for _, c := range e.MCP.Each {
						called = append(called, c.Tool)
					}
					got = map[string][]string{"mcp_calls": called, "mcp_refused": e.MCP.Refused, "mcp_hidden": e.MCP.Hidden}[k]
				}
				if strings.Join(got, ", ") != v {
					t.Errorf("%s %q, want %q", k, got, v)
				}
			}
		})
	}
	// What is not an answer to JSON-RPC passes as it is: OAuth's
	// discovery (a client told 401 looks there) and an HTTP error.
	if status, body, _ := raw("GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost: a.test\r\n\r\n"); status != 200 || !strings.Contains(body, `"authorization_servers"`) {
		t.Errorf("OAuth metadata: %d %q", status, body)
	}
	f.event(t)
	req := `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`
	if status, body, _ := raw(fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: a.test\r\nAuthorization: Bearer expired\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(req), req)); status != 401 || body != `{"error":"invalid_token"}` {
		t.Errorf("a 401: %d %q", status, body)
	}
	f.event(t)
	for _, s := range seen {
		if strings.Contains(s, "delete_repo") || strings.Contains(s, "get_secret") || strings.Contains(s, "resources/") {
			t.Fatalf("the server received %q", s)
		}
	}
}

// rpc is a JSON-RPC request as the stand-in MCP servers read it.
type rpc struct {
	ID     json.RawMessage
	Method string
	Params struct{ Name string }
}

// decodeRPC reads r's body as one JSON-RPC request.
func decodeRPC(r *http.Request) rpc {
	var m rpc
	json.NewDecoder(r.Body).Decode(&m)
	return m
}

// String is the method and the tool it names, as the servers note them.
func (m rpc) String() string { return strings.TrimSpace(m.Method + " " + m.Params.Name) }
