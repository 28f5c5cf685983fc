package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		n          int
		batch      bool
		err        string
	}{
		{name: "a request", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, n: 1},
		{name: "a notification", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`, n: 1},
		{name: "a response", body: `{"jsonrpc":"2.0","id":"a","result":{}}`, n: 1},
		{name: "a batch", body: `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}]`, n: 2, batch: true},
		{name: "an empty batch", body: `[]`, err: "an empty batch"},
		{name: "a member twice (parsers differ on which wins)", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","name":"delete_repo"}}`, err: `member "name" twice`},
		{name: "the method twice", body: `{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}`, err: `member "method" twice`},
		{name: "a member JSON-RPC lacks", body: `{"jsonrpc":"2.0","id":1,"method":"ping","extra":1}`, err: `member "extra" is not one of`},
		{name: "a member spelled in another case (Go's decoder would take it)", body: `{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call"}`, err: `member "Method" is not one of`},
		{name: "not 2.0", body: `{"jsonrpc":"1.0","id":1,"method":"ping"}`, err: "not 2.0"},
		{name: "an object id", body: `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, err: "not a string or a number"},
		{name: "a method with a result", body: `{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`, err: "with a result"},
		{name: "a response with neither", body: `{"jsonrpc":"2.0","id":1}`, err: "a result or an error"},
		{name: "data after it", body: `{"jsonrpc":"2.0","id":1,"method":"ping"} {"jsonrpc":"2.0","id":2,"method":"ping"}`, err: "data after"},
		{name: "not JSON", body: `{"jsonrpc":`, err: "not JSON"},
		{name: "too deep", body: strings.Repeat("[", 100) + strings.Repeat("]", 100), err: "deeper than 64"},
		{name: "too large", body: `"` + strings.Repeat("a", MaxMessage) + `"`, err: "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, batch, err := Parse([]byte(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(msgs) != tc.n || batch != tc.batch {
				t.Fatalf("got %d %v %v", len(msgs), batch, err)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	tools := Tools{Allow: []string{"search_issues", "get_*"}, Deny: []string{"get_secret*"}}
	call := func(id int, name string) string {
		return `{"jsonrpc":"2.0","id":` + string(rune('0'+id)) + `,"method":"tools/call","params":{"name":"` + name + `","arguments":{"q":"x"}}}`
	}
	for _, tc := range []struct {
		name, body string
		calls      []string
		refused    []string // reasons' substrings
	}{
		{name: "an allowed tool", body: call(1, "search_issues"), calls: []string{"search_issues"}},
		{name: "a pattern", body: call(1, "get_issue"), calls: []string{"get_issue"}},
		{name: "deny wins", body: call(1, "get_secret_key"), refused: []string{"tool get_secret_key is not allowed by role r"}},
		{name: "a tool not named", body: call(1, "delete_repo"), refused: []string{"tool delete_repo is not allowed"}},
		{name: "the protocol's own", body: `[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"tools/list"},{"jsonrpc":"2.0","id":3,"method":"ping"}]`},
		{name: "other methods", body: `[{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///etc/passwd"}},{"jsonrpc":"2.0","id":2,"method":"prompts/get"}]`,
			refused: []string{"method resources/read is not allowed", "method prompts/get is not allowed"}},
		{name: "the client answering the server", body: `{"jsonrpc":"2.0","id":7,"result":{"roots":[]}}`},
		{name: "no name", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}`, refused: []string{"names no tool"}},
		{name: "the tool's name in another case too", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_repo","NAME":"search_issues"}}`, refused: []string{"not {name, arguments}"}},
		{name: "a name that is not a string", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":["search_issues"]}}`, refused: []string{"names no tool"}},
		{name: "a member tools/call lacks", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_issues","tool":"delete_repo"}}`, refused: []string{"not {name, arguments}"}},
		{name: "arguments not an object", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_issues","arguments":[1]}}`, refused: []string{"not an object"}},
		{name: "a batch, one refused", body: "[" + call(1, "search_issues") + "," + call(2, "delete_repo") + "]", calls: []string{"search_issues"}, refused: []string{"delete_repo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, _, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			calls, refused := Decide("role r (allow[0] host mcp.test)", tools, msgs)
			var got []string
			for _, c := range calls {
				got = append(got, c.Tool)
			}
			if strings.Join(got, ",") != strings.Join(tc.calls, ",") {
				t.Errorf("calls %q, want %q", got, tc.calls)
			}
			if len(refused) != len(tc.refused) {
				t.Fatalf("refused %+v, want %q", refused, tc.refused)
			}
			for i, r := range refused {
				if !strings.Contains(r.Reason, tc.refused[i]) {
					t.Errorf("refusal %q, want %q", r.Reason, tc.refused[i])
				}
				e := ErrorFor(r)
				var resp struct {
					ID    json.RawMessage
					Error struct {
						Code    int
						Message string
					}
				}
				if json.Unmarshal(e, &resp) != nil || resp.Error.Code != RefusedCode || !strings.HasPrefix(resp.Error.Message, "agentbox: ") || string(resp.ID) != string(r.ID) {
					t.Errorf("error response %s", e)
				}
			}
		})
	}
}

func TestFilterBody(t *testing.T) {
	tools := Tools{Allow: []string{"search_issues", "get_issue"}}
	list := `{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"search_issues","inputSchema":{}},{"name":"delete_repo","description":"deletes"},{"name":"get_issue"}],"nextCursor":"c"}}`
	out, removed, err := FilterBody(tools, []byte(list))
	if err != nil || strings.Join(removed, ",") != "delete_repo" || strings.Contains(string(out), "delete_repo") || !strings.Contains(string(out), `"nextCursor":"c"`) || !strings.Contains(string(out), "get_issue") {
		t.Fatalf("filtered: %s %v %v", out, removed, err)
	}
	other := `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"tools"}]}}`
	if out, removed, err := FilterBody(tools, []byte(other)); err != nil || removed != nil || string(out) != other {
		t.Fatalf("another result: %s %v %v", out, removed, err)
	}
	if _, _, err := FilterBody(tools, []byte(`{"jsonrpc":"2.0","id":2,"result":{"tools":[{"description":"no name"}]}}`)); err == nil {
		t.Fatal("a nameless tool passed")
	}
}

func TestSSE(t *testing.T) {
	tools := Tools{Allow: []string{"search_issues"}}
	filter := func(event string, data []byte) ([]byte, error) {
		if event == "endpoint" {
			return data, nil
		}
		out, _, err := FilterBody(tools, data)
		return out, err
	}
	stream := "event: endpoint\ndata: /messages?session=1\n\n" +
		": a comment\nid: 7\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"search_issues\"},{\"name\":\"delete_repo\"}]}}\r\n\r\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\n" + "data: \"params\":{}}\n\n"
	b, err := io.ReadAll(NewSSE(strings.NewReader(stream), filter))
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if !strings.HasPrefix(out, "event: endpoint\ndata: /messages?session=1\n\n: a comment\nid: 7\ndata: {") || strings.Contains(out, "delete_repo") || !strings.Contains(out, "search_issues") ||
		!strings.HasSuffix(out, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\ndata: \"params\":{}}\n\n") {
		t.Fatalf("out:\n%s", out)
	}
	// Unchanged events pass byte for byte.
	same := "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r\n\r\nretry: 10\n\n"
	if b, err := io.ReadAll(NewSSE(strings.NewReader(same), filter)); err != nil || string(b) != same {
		t.Fatalf("unchanged: %q %v", b, err)
	}
	// Refused: what is not JSON-RPC, and an event over the bound.
	if _, err := io.ReadAll(NewSSE(strings.NewReader("data: {\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"result\":{}}\n\n"), filter)); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a member twice: %v", err)
	}
	big := "data: " + strings.Repeat("a", MaxMessage) + "\n\n"
	if _, err := io.ReadAll(NewSSE(strings.NewReader(big), filter)); !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	// An event cut short at the end is still read through fn.
	if b, err := io.ReadAll(NewSSE(strings.NewReader("data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"delete_repo\"}]}}"), filter)); err != nil || bytes.Contains(b, []byte("delete_repo")) {
		t.Fatalf("cut short: %q %v", b, err)
	}
}

// The server's own requests in its messages are read: their methods, and
// not its notifications or answers.
func TestFilterAnswersSeen(t *testing.T) {
	body := `[{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{"messages":[]}},` +
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{}},` +
		`{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}},` +
		`{"jsonrpc":"2.0","id":"s2","method":"elicitation/create","params":{}}]`
	out, hidden, seen, err := FilterAnswers(Tools{Allow: []string{"*"}}, []byte(body))
	if err != nil || string(out) != body || hidden != nil {
		t.Fatalf("%s %v %v", out, hidden, err)
	}
	if strings.Join(seen.Asked, ",") != "sampling/createMessage,elicitation/create" || len(seen.Answers) != 1 || !seen.Answers[0].IsError {
		t.Errorf("seen %+v", seen)
	}
}
