package modelapi

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":1200,"cache_read_input_tokens":300,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"I'll run the tests."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"Bash","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"command\": \"go t"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"est ./...\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":57}}

event: message_stop
data: {"type":"message_stop"}

`

const anthropicJSON = `{"id":"msg_2","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"toolu_02","name":"Write","input":{"file_path":"/w/a.go","content":"package a"}}],"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5}}`

const responsesStream = `event: response.created
data: {"type":"response.created","response":{"id":"resp_1","object":"response","model":"gpt-5-codex","status":"in_progress","output":[]}}

event: response.output_item.added
data: {"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_A","name":"shell","arguments":""}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"command\":[\"bash\",\"-lc\",\"make test\"]}"}

event: response.output_item.done
data: {"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_A","name":"shell","arguments":"{\"command\":[\"bash\",\"-lc\",\"make test\"]}"}}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_1","object":"response","model":"gpt-5-codex-2025","status":"completed","output":[{"type":"function_call","call_id":"call_A","name":"shell","arguments":"{}"}],"usage":{"input_tokens":900,"output_tokens":40,"total_tokens":940}}}

`

const chatStream = `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_X","type":"function","function":{"name":"run","arguments":""}}]}}]}

data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"cmd\":\"ls\"}"}}]}}]}

data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":70,"completion_tokens":12,"total_tokens":82}}

data: [DONE]

`

const geminiStream = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Running\"}],\"role\":\"model\"}}],\"usageMetadata\":{\"promptTokenCount\":500,\"totalTokenCount\":500},\"modelVersion\":\"gemini-2.5-pro\"}\r\n\r\n" +
	"data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"run_shell_command\",\"args\":{\"command\":\"npm test\"}}}],\"role\":\"model\"},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":500,\"candidatesTokenCount\":20,\"thoughtsTokenCount\":5,\"totalTokenCount\":525},\"modelVersion\":\"gemini-2.5-pro\"}\r\n\r\n"

func TestResponses(t *testing.T) {
	for _, tc := range []struct {
		name, ct, body string
		api            API
		want           Response
	}{
		{"anthropic stream", "text/event-stream; charset=utf-8", anthropicStream, Anthropic, Response{
			Model: "claude-sonnet-4-5", StopReason: "tool_use", Usage: Usage{true, 1500, 57, 1557, true}, Events: 10,
			ToolCalls: []ToolCall{{ID: "toolu_01", Name: "Bash", Input: `{"command": "go test ./..."}`}}}},
		{"anthropic json", "application/json", anthropicJSON, Anthropic, Response{
			Model: "claude-haiku-4-5", StopReason: "tool_use", Usage: Usage{true, 10, 5, 15, true},
			ToolCalls: []ToolCall{{ID: "toolu_02", Name: "Write", Input: `{"file_path":"/w/a.go","content":"package a"}`}}}},
		{"anthropic error", "application/json", `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, Anthropic, Response{
			Error: "rate_limit_error: slow down"}},
		{"openai responses stream", "text/event-stream", responsesStream, OpenAI, Response{
			Model: "gpt-5-codex-2025", StopReason: "completed", Usage: Usage{true, 900, 40, 940, true}, Events: 5,
			ToolCalls: []ToolCall{{ID: "call_A", Name: "shell", Input: `{"command":["bash","-lc","make test"]}`}}}},
		{"openai responses json", "application/json", `{"id":"r","object":"response","model":"gpt-5","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"function_call","call_id":"c9","name":"apply_patch","arguments":"{}"}],"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7}}`, OpenAI, Response{
			Model: "gpt-5", StopReason: "incomplete: max_output_tokens", Usage: Usage{true, 3, 4, 7, true},
			ToolCalls: []ToolCall{{ID: "c9", Name: "apply_patch", Input: `{}`}}}},
		{"openai responses namespaced tool (Codex's MCP tools)", "application/json", `{"object":"response","model":"gpt-5.5","status":"completed","output":[{"type":"function_call","call_id":"c1","namespace":"mcp__issues","name":"get_issue","arguments":"{\"number\":7}"}]}`, OpenAI, Response{
			Model: "gpt-5.5", StopReason: "completed", ToolCalls: []ToolCall{{ID: "c1", Name: "mcp__issues__get_issue", Input: `{"number":7}`}}}},
		{"openai chat stream", "text/event-stream", chatStream, OpenAI, Response{
			Model: "gpt-4o", StopReason: "tool_calls", Usage: Usage{true, 70, 12, 82, true}, Events: 5,
			ToolCalls: []ToolCall{{ID: "call_X", Name: "run", Input: `{"cmd":"ls"}`}}}},
		{"openai chat json", "application/json", `{"object":"chat.completion","model":"llama-3","choices":[{"message":{"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, OpenAI, Response{
			Model: "llama-3", StopReason: "tool_calls", Usage: Usage{true, 1, 2, 3, true}, ToolCalls: []ToolCall{{ID: "t1", Name: "f", Input: `{"a":1}`}}}},
		{"openai error", "application/json", `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}`, OpenAI, Response{
			Error: "You exceeded your current quota"}},
		{"gemini sse", "text/event-stream", geminiStream, Gemini, Response{
			Model: "gemini-2.5-pro", StopReason: "STOP", Usage: Usage{true, 500, 25, 525, true}, Events: 2,
			ToolCalls: []ToolCall{{Name: "run_shell_command", Input: `{"command":"npm test"}`}}}},
		{"gemini array", "application/json", `[{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"modelVersion":"gemini-2.5-flash"},{"candidates":[{"content":{"parts":[]},"finishReason":"MAX_TOKENS"}],"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2,"totalTokenCount":3}}]`, Gemini, Response{
			Model: "gemini-2.5-flash", StopReason: "MAX_TOKENS", Usage: Usage{true, 1, 2, 3, true}}},
		{"not json", "application/json", `<html>bad gateway</html>`, Anthropic, Response{Problem: "a response or event that is not JSON"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Whole, and a byte at a time: a stream's events may be cut
			// anywhere.
			for _, step := range []int{len(tc.body), 1, 7} {
				tap := NewResponseTap(tc.api, tc.ct)
				for b := tc.body; len(b) > 0; {
					n := min(step, len(b))
					if w, err := tap.Write([]byte(b[:n])); w != n || err != nil {
						t.Fatalf("Write: %d, %v", w, err)
					}
					b = b[n:]
				}
				if got := tap.Close(true); !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("step %d:\n got %+v\nwant %+v", step, got, tc.want)
				}
			}
		})
	}
}

func TestResponseBounds(t *testing.T) {
	// A tool input past MaxToolInput is cut (at a rune) and says so.
	long := strings.Repeat("é", MaxToolInput)
	tap := NewResponseTap(Anthropic, "application/json")
	tap.Write([]byte(`{"type":"message","model":"m","content":[{"type":"tool_use","id":"a","name":"n","input":{"x":"` + long + `"}}]}`))
	r := tap.Close(true)
	if len(r.ToolCalls) != 1 || !r.ToolCalls[0].Truncated || len(r.ToolCalls[0].Input) > MaxToolInput || !strings.HasPrefix(r.ToolCalls[0].Input, `{"x":"é`) {
		t.Fatalf("a long input: %+v", r.ToolCalls)
	}
	// More tool calls than MaxToolCalls: the rest are counted as a problem.
	var b strings.Builder
	b.WriteString(`{"type":"message","model":"m","content":[`)
	for i := 0; i < MaxToolCalls+5; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"tool_use","id":"t","name":"n","input":{}}`)
	}
	b.WriteString(`]}`)
	tap = NewResponseTap(Anthropic, "application/json")
	tap.Write([]byte(b.String()))
	if r := tap.Close(true); len(r.ToolCalls) != MaxToolCalls || !strings.Contains(r.Problem, "more than") {
		t.Fatalf("too many calls: %d, %q", len(r.ToolCalls), r.Problem)
	}
	// An event larger than MaxEvent is skipped, and the stream goes on.
	tap = NewResponseTap(Anthropic, "text/event-stream")
	tap.Write([]byte("data: {\"type\":\"ping\",\"x\":\"" + strings.Repeat("a", MaxEvent) + "\"}\n\n"))
	tap.Write([]byte("data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n"))
	if r := tap.Close(true); r.StopReason != "end_turn" || !strings.Contains(r.Problem, "larger than") {
		t.Fatalf("a huge event: %+v", r)
	}
	// A stream cut short says so.
	tap = NewResponseTap(Anthropic, "text/event-stream")
	tap.Write([]byte(anthropicStream[:strings.Index(anthropicStream, "\n\n")+40]))
	if r := tap.Close(false); r.Problem != "the response ended before its end" || r.Model != "claude-sonnet-4-5" {
		t.Fatalf("a cut stream: %+v", r)
	}
}

func TestRequests(t *testing.T) {
	for _, tc := range []struct {
		api        API
		path, body string
		want       Request
	}{
		{Anthropic, "/v1/messages", `{"model":"claude-sonnet-4-5","stream":true,"messages":[]}`, Request{Model: "claude-sonnet-4-5", Stream: true}},
		{OpenAI, "/v1/responses", `{"model":"gpt-5","input":"hi"}`, Request{Model: "gpt-5"}},
		{Gemini, "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", `{"contents":[]}`, Request{Model: "gemini-2.5-pro", Stream: true}},
		{Gemini, "/v1beta/models/gemini-2.5-flash:generateContent", `{}`, Request{Model: "gemini-2.5-flash"}},
		{Anthropic, "/v1/messages", `not json`, Request{}},
	} {
		tap := NewRequestTap(tc.api, tc.path, io.NopCloser(strings.NewReader(tc.body)))
		if _, err := io.Copy(io.Discard, tap); err != nil {
			t.Fatal(err)
		}
		got := tap.Request()
		if got.Bytes != int64(len(tc.body)) || len(got.Digest) != 64 {
			t.Errorf("%s: digest %q of %d bytes", tc.path, got.Digest, got.Bytes)
		}
		got.Digest, got.Bytes = "", 0
		if got != tc.want {
			t.Errorf("%s %s: got %+v, want %+v", tc.api, tc.path, got, tc.want)
		}
	}
	// A body larger than MaxRequest is hashed whole but not read for its model.
	big := `{"model":"m","pad":"` + strings.Repeat("a", MaxRequest) + `"}`
	tap := NewRequestTap(Anthropic, "/v1/messages", io.NopCloser(strings.NewReader(big)))
	io.Copy(io.Discard, tap)
	if r := tap.Request(); r.Model != "" || r.Bytes != int64(len(big)) {
		t.Errorf("a large body: %+v", r)
	}
}

// The text a model streams is not parsed (most of a stream): a text delta
// that is not even JSON leaves no problem, and the events are counted.
func TestTextDeltasSkipped(t *testing.T) {
	tap := NewResponseTap(Anthropic, "text/event-stream")
	tap.Write([]byte("event: content_block_delta\ndata: {not json, text_delta\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n"))
	if r := tap.Close(true); r.Problem != "" || r.Events != 2 || r.StopReason != "end_turn" {
		t.Fatalf("%+v", r)
	}
}

// Content is the conversation's newest messages, without what real
// clients put after them (tool definitions); else the body's end, cut at
// a rune.
func TestRequestContent(t *testing.T) {
	content := func(api API, body string) (string, bool) {
		tap := NewRequestTap(api, "/x", io.NopCloser(strings.NewReader(body)))
		io.Copy(io.Discard, tap)
		return tap.Content()
	}
	msg := func(i int) string {
		return fmt.Sprintf(`{"role":"user","content":"m%d %s"}`, i, strings.Repeat("x", 3000))
	}
	var msgs []string
	for i := 0; i < 10; i++ {
		msgs = append(msgs, msg(i))
	}
	tools := `"tools":[{"name":"Bash","description":"` + strings.Repeat("d", 40000) + `"}]`
	c, cut := content(Anthropic, `{"model":"m","messages":[`+strings.Join(msgs, ",")+`],"system":"s",`+tools+`}`)
	if !cut || len(c) > MaxContent || !strings.HasPrefix(c, `{"messages":[{"role":"user","content":"m5 `) || !strings.HasSuffix(c, `"m9 `+strings.Repeat("x", 3000)+`"}]}`) {
		t.Fatalf("messages: %d bytes, cut %v: %.60q", len(c), cut, c)
	}
	if text, _, ok := LastToolResult(Anthropic, c); ok || text != "" {
		t.Fatalf("no tool result in it: %q", text)
	}
	if c, cut := content(OpenAI, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"o"}],`+tools+`}`); cut || c != `{"input":[{"type":"function_call_output","call_id":"c","output":"o"}]}` {
		t.Fatalf("input: %q %v", c, cut)
	}
	if c, cut := content(Gemini, `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`); cut || c != `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}` {
		t.Fatalf("contents: %q %v", c, cut)
	}
	// No conversation, or a newest message too large: the body's end.
	body := strings.Repeat("é", MaxContent) + `{"last":"message"}`
	if c, cut := content(Anthropic, body); !cut || len(c) > MaxContent || !strings.HasSuffix(c, `{"last":"message"}`) || !strings.HasPrefix(c, "é") {
		t.Fatalf("content %d bytes, cut %v", len(c), cut)
	}
	huge := `{"messages":[{"role":"user","content":"` + strings.Repeat("y", MaxContent) + `"}]}`
	if c, cut := content(Anthropic, huge); !cut || len(c) != MaxContent || !strings.HasSuffix(c, `"}]}`) {
		t.Fatalf("huge: %d %v", len(c), cut)
	}
	if c, cut := content(Anthropic, "{}"); c != "{}" || cut {
		t.Fatalf("small: %q %v", c, cut)
	}
}
