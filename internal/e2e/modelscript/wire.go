// Package modelscript is the e2e suite's scripted model server: it speaks
// enough of Anthropic's Messages, OpenAI's Responses and Chat Completions
// and Gemini's generateContent, streaming included, to drive an agent's
// tool-call loop, as a stand-in for the vendors. The wire encoders are
// here; task.go is the scripted coding task that real agent CLIs are
// driven through.
package modelscript

import (
	"encoding/json"
	"io"
	"net/http"
)

// Turn is one model answer: text, or one tool call.
type Turn struct {
	Text string
	Tool *ToolCall
	// Usage: the prompt and completion tokens the answer reports.
	In, Out int
}

// ToolCall is a tool call the model asks for.
type ToolCall struct {
	ID, Name string
	// Input is the call's JSON arguments; Custom, a free-text input
	// (an OpenAI custom tool, as Codex's apply_patch is).
	Input  map[string]any
	Custom string
	// Namespace is the namespace of the tool called (Responses).
	Namespace string
}

func (t Turn) usage() (in, out int) {
	in, out = t.In, t.Out
	if in == 0 {
		in = 120
	}
	if out == 0 {
		out = 24
	}
	return in, out
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	f, _ := w.(http.Flusher)
	for _, e := range events {
		io.WriteString(w, e)
		if f != nil {
			f.Flush()
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// named is an SSE event with an event: line (Messages, Responses).
func named(typ string, v map[string]any) string {
	v["type"] = typ
	b, _ := json.Marshal(v)
	return "event: " + typ + "\ndata: " + string(b) + "\n\n"
}

func data(v any) string {
	b, _ := json.Marshal(v)
	return "data: " + string(b) + "\n\n"
}

// Messages answers an Anthropic Messages request. A streamed tool call's
// input arrives in two input_json_delta halves, as Anthropic splits it.
func Messages(w http.ResponseWriter, stream bool, model string, t Turn) {
	in, out := t.usage()
	block := map[string]any{"type": "text", "text": t.Text}
	stop := "end_turn"
	var input []byte
	if t.Tool != nil {
		input, _ = json.Marshal(t.Tool.Input)
		block = map[string]any{"type": "tool_use", "id": t.Tool.ID, "name": t.Tool.Name, "input": json.RawMessage(input)}
		stop = "tool_use"
	}
	usage := map[string]int{"input_tokens": in, "output_tokens": out}
	if !stream {
		writeJSON(w, 200, map[string]any{"id": "msg_e2e", "type": "message", "role": "assistant", "model": model,
			"content": []any{block}, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
		return
	}
	events := []string{named("message_start", map[string]any{"message": map[string]any{"id": "msg_e2e", "type": "message",
		"role": "assistant", "model": model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": in, "output_tokens": 1}}})}
	if t.Tool == nil {
		events = append(events, named("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}}),
			named("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": t.Text}}))
	} else {
		half := len(input) / 2
		events = append(events, named("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "tool_use",
			"id": t.Tool.ID, "name": t.Tool.Name, "input": map[string]any{}}}),
			named("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(input[:half])}}),
			named("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(input[half:])}}))
	}
	events = append(events, named("content_block_stop", map[string]any{"index": 0}),
		named("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": out}}),
		named("message_stop", map[string]any{}))
	sse(w, events...)
}

// Responses answers an OpenAI Responses request.
func Responses(w http.ResponseWriter, stream bool, model string, t Turn) {
	in, out := t.usage()
	item := map[string]any{"type": "message", "id": "msg_e2e", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": t.Text, "annotations": []any{}}}}
	switch {
	case t.Tool != nil && t.Tool.Input == nil:
		item = map[string]any{"type": "custom_tool_call", "id": "ctc_" + t.Tool.ID, "call_id": t.Tool.ID, "name": t.Tool.Name,
			"input": t.Tool.Custom, "status": "completed"}
	case t.Tool != nil:
		args, _ := json.Marshal(t.Tool.Input)
		item = map[string]any{"type": "function_call", "id": "fc_" + t.Tool.ID, "call_id": t.Tool.ID, "name": t.Tool.Name,
			"arguments": string(args), "status": "completed"}
		if t.Tool.Namespace != "" {
			item["namespace"] = t.Tool.Namespace
		}
	}
	resp := map[string]any{"id": "resp_e2e", "object": "response", "model": model, "status": "completed", "output": []any{item},
		"usage": map[string]any{"input_tokens": in, "output_tokens": out, "total_tokens": in + out,
			"input_tokens_details": map[string]int{"cached_tokens": 0}, "output_tokens_details": map[string]int{"reasoning_tokens": 0}}}
	if !stream {
		writeJSON(w, 200, resp)
		return
	}
	sse(w, named("response.created", map[string]any{"sequence_number": 0, "response": map[string]any{"id": "resp_e2e", "object": "response",
		"model": model, "status": "in_progress", "output": []any{}}}),
		named("response.output_item.added", map[string]any{"sequence_number": 1, "output_index": 0, "item": item}),
		named("response.output_item.done", map[string]any{"sequence_number": 2, "output_index": 0, "item": item}),
		named("response.completed", map[string]any{"sequence_number": 3, "response": resp}))
}

// ChatCompletions streams an OpenAI Chat Completions answer, its usage in
// a last chunk (stream_options.include_usage).
func ChatCompletions(w http.ResponseWriter, model string, t Turn) {
	in, out := t.usage()
	delta, finish := map[string]any{"role": "assistant", "content": t.Text}, "stop"
	if t.Tool != nil {
		args, _ := json.Marshal(t.Tool.Input)
		delta = map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"index": 0, "id": t.Tool.ID, "type": "function",
			"function": map[string]string{"name": t.Tool.Name, "arguments": string(args)}}}}
		finish = "tool_calls"
	}
	chunk := func(choices []any, usage any) string {
		v := map[string]any{"id": "c_e2e", "object": "chat.completion.chunk", "model": model, "choices": choices}
		if usage != nil {
			v["usage"] = usage
		}
		return data(v)
	}
	sse(w, chunk([]any{map[string]any{"index": 0, "delta": delta, "finish_reason": nil}}, nil),
		chunk([]any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}, nil),
		chunk([]any{}, map[string]int{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out}),
		"data: [DONE]\n\n")
}

// Gemini answers a generateContent (stream false) or
// streamGenerateContent?alt=sse request: a streamed answer comes as a
// text chunk, then the part with the finish reason and the usage.
func Gemini(w http.ResponseWriter, stream bool, model string, t Turn) {
	in, out := t.usage()
	part := map[string]any{"text": t.Text}
	if t.Tool != nil {
		part = map[string]any{"functionCall": map[string]any{"name": t.Tool.Name, "args": t.Tool.Input}}
	}
	resp := func(parts []any, finish string, usage map[string]int) map[string]any {
		c := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
		if finish != "" {
			c["finishReason"] = finish
		}
		return map[string]any{"candidates": []any{c}, "usageMetadata": usage, "modelVersion": model, "responseId": "r_e2e"}
	}
	final := resp([]any{part}, "STOP", map[string]int{"promptTokenCount": in, "candidatesTokenCount": out, "totalTokenCount": in + out})
	if !stream {
		writeJSON(w, 200, final)
		return
	}
	first := resp([]any{map[string]string{"text": "Working on it. "}}, "", map[string]int{"promptTokenCount": in, "totalTokenCount": in})
	b1, _ := json.Marshal(first)
	b2, _ := json.Marshal(final)
	sse(w, "data: "+string(b1)+"\r\n\r\n", "data: "+string(b2)+"\r\n\r\n")
}
