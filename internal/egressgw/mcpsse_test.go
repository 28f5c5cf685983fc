package egressgw

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/mcp"
	"agentbox.dev/agentbox/internal/policy"
)

// MCP's older SSE transport through an api: mcp rule: the client GETs the
// stream, POSTs to the endpoint it names, and reads every answer on the
// stream. tools/list's answer there names only the allowed tools; an
// allowed call reaches the server and its record waits for the answer
// that came on the stream; a refused call never reaches the server, its
// POST gets 202 as the server's would, and its JSON-RPC error comes on the
// stream, where the client waits for it.
func TestMCPOldSSE(t *testing.T) {
	f, dial := mcpFixture(t, policy.ToolsRule{Allow: []string{"search_issues", "get_*"}}, policy.LimitsProfile{})
	var mu sync.Mutex
	var seen []string
	answers := make(chan string, 10)
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: endpoint\ndata: /messages?sessionId=abc\n\n")
			w.(http.Flusher).Flush()
			for {
				select {
				case a := <-answers:
					if a == "" {
						return true // the server ends the stream
					}
					fmt.Fprintf(w, "event: message\ndata: %s\n\n", a)
					w.(http.Flusher).Flush()
				case <-r.Context().Done():
					return true
				}
			}
		case r.Method == http.MethodPost && r.URL.Path == "/messages" && r.URL.Query().Get("sessionId") == "abc":
			m := decodeRPC(r)
			mu.Lock()
			seen = append(seen, m.String())
			mu.Unlock()
			result := fmt.Sprintf(`{"content":[{"type":"text","text":"did %s"}]}`, m.Params.Name)
			if m.Method == "tools/list" {
				result = `{"tools":[{"name":"search_issues"},{"name":"delete_repo"},{"name":"get_issue"},{"name":"get_broken"}]}`
			}
			if m.Params.Name == "get_broken" {
				http.Error(w, "broken", http.StatusInternalServerError) // no answer will come
				return true
			}
			w.WriteHeader(http.StatusAccepted)
			if m.Params.Name == "search_issues" {
				return true // never answered
			}
			answers <- fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, m.ID, result)
			return true
		}
		return false
	}
	// The stream.
	sc := dial()
	defer sc.Close()
	io.WriteString(sc, "GET /sse HTTP/1.1\r\nHost: a.test\r\nAccept: text/event-stream\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(sc), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("the stream: %v %v", res, err)
	}
	stream := bufio.NewReader(res.Body)
	event := func() string {
		t.Helper()
		var ev strings.Builder
		for {
			l, err := stream.ReadString('\n')
			if err != nil {
				t.Fatalf("the stream ended: %v (%q)", err, ev.String())
			}
			if l == "\n" {
				return ev.String()
			}
			ev.WriteString(l)
		}
	}
	if got := event(); got != "event: endpoint\ndata: /messages?sessionId=abc\n" {
		t.Fatalf("the endpoint event: %q", got)
	}
	post := func(body string) int {
		t.Helper()
		c := dial()
		defer c.Close()
		fmt.Fprintf(c, "POST /messages?sessionId=abc HTTP/1.1\r\nHost: a.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		return res.StatusCode
	}
	reached := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}

	if status := post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); status != 202 {
		t.Errorf("tools/list: %d", status)
	}
	if got := event(); !strings.Contains(got, "search_issues") || !strings.Contains(got, "get_issue") || strings.Contains(got, "delete_repo") {
		t.Errorf("tools/list on the stream: %q", got)
	}
	f.event(t)

	if status := post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_issue","arguments":{"n":7}}}`); status != 202 {
		t.Errorf("an allowed call: %d", status)
	}
	if got := event(); !strings.Contains(got, `"id":2`) || !strings.Contains(got, "did get_issue") {
		t.Errorf("an allowed call's answer: %q", got)
	}
	e := f.event(t)
	if each := e.MCP.Each; e.Kind != Request || len(each) != 1 || each[0].Tool != "get_issue" || !each[0].Answered || each[0].ResultBytes == 0 || e.MCP.Session != "sessionId=abc" {
		t.Errorf("the allowed call's record: %v %s %+v", e.Kind, e.Reason, e.MCP)
	}

	if status := post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_repo"}}`); status != 202 {
		t.Errorf("a refused call: %d", status)
	}
	if got := event(); !strings.Contains(got, `"id":3`) || !strings.Contains(got, `"code":-32001`) || !strings.Contains(got, "tool delete_repo is not allowed") {
		t.Errorf("a refused call's answer on the stream: %q", got)
	}
	if e := f.event(t); e.Kind != Refused || !strings.Contains(e.Reason, "answered on its SSE stream") || strings.Join(e.MCP.Refused, ",") != "delete_repo" {
		t.Errorf("the refused call's record: %v %q %+v", e.Kind, e.Reason, e.MCP)
	}
	if got := strings.Join(reached(), "|"); got != "tools/list|tools/call get_issue" {
		t.Errorf("the server received %q", got)
	}

	// A call's POST the server does not take (500): no answer will come
	// on the stream, and its record is made at once.
	if status := post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get_broken"}}`); status != 500 {
		t.Errorf("a call the server fails: %d", status)
	}
	select {
	case e := <-f.events:
		if each := e.MCP.Each; e.Status != 500 || len(each) != 1 || each[0].Tool != "get_broken" || each[0].Answered {
			t.Errorf("the failed call's record: %d %+v", e.Status, e.MCP)
		}
	case <-time.After(5 * time.Second):
		t.Error("the failed call's record waits for an answer that will not come")
	}

	// The server ends the stream: a call whose answer had not come is
	// recorded then.
	if status := post(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"search_issues"}}`); status != 202 {
		t.Errorf("a call: %d", status)
	}
	select {
	case e := <-f.events:
		t.Errorf("the unanswered call was recorded before its stream ended: %+v", e)
	case <-time.After(100 * time.Millisecond):
	}
	// The server's own request to the client passes, and is recorded.
	answers <- `{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{"messages":[]}}`
	if got := event(); !strings.Contains(got, "sampling/createMessage") {
		t.Errorf("the server's request: %q", got)
	}
	answers <- ""
	var posted, streamed bool
	for range 2 {
		switch e := f.event(t); e.Method {
		case "POST":
			posted = len(e.MCP.Each) == 1 && !e.MCP.Each[0].Answered
		case "GET":
			streamed = strings.Join(e.MCP.Asked, ",") == "sampling/createMessage" && strings.Join(e.MCP.Hidden, ",") == "delete_repo"
		}
	}
	if !posted || !streamed {
		t.Errorf("at the stream's end: the unanswered call recorded %v, the stream's record %v", posted, streamed)
	}
}

// An endpoint event is kept only for the stream's own host, resolved
// against the stream's URL, and at most maxStreams of them.
func TestSSEEndpoints(t *testing.T) {
	base, _ := url.Parse("https://a.test/mcp/sse?x=1")
	for _, tc := range []struct {
		data, want string // want "": not kept
	}{
		{"/messages?sessionId=abc", "a.test /messages?sessionId=abc"},
		{"messages?sessionId=abc", "a.test /mcp/messages?sessionId=abc"},
		{"https://a.test/m?s=1", "a.test /m?s=1"},
		{"https://A.TEST:443/m?s=1", "a.test /m?s=1"},
		{"https://b.test/m?s=1", ""},
		{"//b.test/m", ""},
		{"%zz", ""},
	} {
		var ss sseStreams
		s := newSSEStream()
		ok := ss.register("a.test", base, []byte(tc.data), s)
		if got := s.key; ok != (tc.want != "") || got != tc.want {
			t.Errorf("%q: kept %v as %q, want %q", tc.data, ok, got, tc.want)
		}
		if ok {
			u, _ := url.Parse(strings.TrimPrefix(tc.want, "a.test "))
			if ss.lookup("a.test", u) != s || ss.lookup("b.test", u) != nil {
				t.Errorf("%q: lookup", tc.data)
			}
			ss.remove(s)
			if ss.lookup("a.test", u) != nil {
				t.Errorf("%q: kept after its stream ended", tc.data)
			}
		}
	}
	var ss sseStreams
	for i := range maxStreams + 1 {
		ok := ss.register("a.test", base, []byte(fmt.Sprintf("/m?s=%d", i)), newSSEStream())
		if ok != (i < maxStreams) {
			t.Errorf("stream %d: kept %v", i, ok)
		}
	}
}

// A POST's record carries what its stream answered, whether the answer
// came after the POST's response (the record waits) or before the record
// was made: the server may send it on the stream before its 202 reaches
// the gateway.
func TestSSERecordAnswered(t *testing.T) {
	answer := []mcp.Answer{{ID: json.RawMessage("2"), Bytes: 10}}
	for _, early := range []bool{true, false} {
		s := newSSEStream()
		tap := &mcpTap{calls: []MCPCallDone{{Tool: "get_issue"}}, byID: map[string]int{"2": 0}}
		s.expect(tap)
		if early {
			s.answered(answer)
		}
		var got []MCPCallDone
		recorded := 0
		s.recordAnswered(tap, func(c []MCPCallDone) { got = c; recorded++ })
		if !early {
			if recorded != 0 {
				t.Fatalf("recorded before its answer came: %+v", got)
			}
			s.answered(answer)
		}
		if recorded != 1 || len(got) != 1 || !got[0].Answered || got[0].ResultBytes != 10 {
			t.Errorf("answer before the record %v: recorded %d times, %+v", early, recorded, got)
		}
	}
}
