// Package modelapi reads model calls as the egress gateway carries them:
// the model a request names, and from its response (JSON, or a stream of
// server-sent events read as it passes) the model that answered, the
// tokens it counted, why it stopped and the tool calls it asked for.
// Three wire formats: Anthropic's Messages API, OpenAI's (Responses and
// Chat Completions, and any server that speaks them) and Google's Gemini
// API. Pure: the gateway feeds bytes, nothing here touches a connection,
// and nothing here can slow or change what the agent receives.
package modelapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

// API names the wire format a model host speaks.
type API string

const (
	Anthropic API = "anthropic"
	OpenAI    API = "openai"
	Gemini    API = "gemini"
)

// APIs are the formats a host rule may name.
var APIs = []API{Anthropic, OpenAI, Gemini}

// Valid says whether a is one of APIs.
func (a API) Valid() bool {
	for _, k := range APIs {
		if a == k {
			return true
		}
	}
	return false
}

// Provider is the OCSF ai_provider of an API's vendor.
func (a API) Provider() string {
	switch a {
	case Anthropic:
		return "Anthropic"
	case OpenAI:
		return "OpenAI"
	case Gemini:
		return "Google"
	}
	return "unknown"
}

// Bounds on what is kept of a call: a request body is read for its model
// up to MaxRequest bytes (and hashed whole); one streamed event, or a
// whole JSON response, is parsed up to MaxEvent bytes; a tool call's
// input is kept up to MaxToolInput bytes, and up to MaxToolCalls calls.
const (
	MaxRequest   = 8 << 20
	MaxEvent     = 8 << 20
	MaxToolInput = 2048
	MaxToolCalls = 64
)

// Request is what a model call asked for.
type Request struct {
	// Model is the model the request names ("" when it names none, or
	// its body was not JSON or larger than MaxRequest).
	Model string
	// Stream: the request asked for a stream of events.
	Stream bool
	// Digest is the SHA-256 of the whole body, hex ("" for no body); Bytes
	// its length.
	Digest string
	Bytes  int64
	// Content is the conversation's newest messages, when the role asks
	// for them (audit.model: content); ContentCut says it is not the
	// whole body.
	Content    string
	ContentCut bool
}

// RequestTap reads a request body through to the upstream, hashing it
// and keeping its start for Request.
type RequestTap struct {
	// mu: the transport may read the body on its own goroutine, even
	// after the response came.
	mu   sync.Mutex
	api  API
	path string
	src  io.ReadCloser
	h    hash.Hash
	n    int64
	kept []byte
}

// NewRequestTap taps body (nil: none) of a request to path.
func NewRequestTap(api API, path string, body io.ReadCloser) *RequestTap {
	return &RequestTap{api: api, path: path, src: body, h: sha256.New()}
}

// Read passes the body through.
func (t *RequestTap) Read(p []byte) (int, error) {
	n, err := t.src.Read(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.h.Write(p[:n])
	t.n += int64(n)
	if room := MaxRequest + 1 - len(t.kept); room > 0 {
		t.kept = append(t.kept, p[:min(n, room)]...)
	}
	return n, err
}

// Close closes the body.
func (t *RequestTap) Close() error { return t.src.Close() }

// Request is what the tapped body (as far as it was read) asked for.
func (t *RequestTap) Request() Request {
	var r Request
	if t != nil {
		t.mu.Lock()
		defer t.mu.Unlock()
	}
	if t != nil && t.n > 0 {
		r.Digest, r.Bytes = hex.EncodeToString(t.h.Sum(nil)), t.n
	}
	var path string
	if t != nil {
		path = t.path
	}
	switch {
	case t == nil:
	case t.api == Gemini:
		// POST /v1beta/models/MODEL:generateContent (or
		// :streamGenerateContent); the body names no model.
		if i := strings.LastIndex(path, "/models/"); i >= 0 {
			m, method, _ := strings.Cut(path[i+len("/models/"):], ":")
			method, _, _ = strings.Cut(method, "?")
			r.Model, r.Stream = m, method == "streamGenerateContent"
		}
	case len(t.kept) <= MaxRequest && int64(len(t.kept)) == t.n:
		var body struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if json.Unmarshal(t.kept, &body) == nil {
			r.Model, r.Stream = body.Model, body.Stream
		}
	}
	r.Model = clip(r.Model, 200)
	return r
}

// MaxContent bounds what is kept of a request's body when a role asks
// for its content: its conversation's newest messages.
const MaxContent = 16 << 10

// conversationKeys are where each API's request holds its conversation.
var conversationKeys = map[API][]string{Anthropic: {"messages"}, OpenAI: {"input", "messages"}, Gemini: {"contents"}}

// Content is the newest part of the request's conversation, at most
// MaxContent bytes: a JSON object holding, under the request's own key
// (messages, input, contents), its last messages, as many as fit. The
// rest of a request (instructions, tool definitions) comes first in
// real clients' bodies and is left out. cut says older messages were
// left out too, or that the body was no conversation this reads: then
// Content is the body's end ("" when it was larger than MaxRequest).
func (t *RequestTap) Content() (string, bool) {
	if t == nil {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if int64(len(t.kept)) != t.n {
		return "", true
	}
	if c, cut, ok := newestMessages(t.api, t.kept); ok {
		return c, cut
	}
	b := t.kept
	cut := len(b) > MaxContent
	if cut {
		b = b[len(b)-MaxContent:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), cut
}

// conversation is a request body's conversation array and the key it is
// under; ok is false when the body holds none.
func conversation(api API, body []byte) (key string, items []json.RawMessage, ok bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return "", nil, false
	}
	for _, key := range conversationKeys[api] {
		if json.Unmarshal(top[key], &items) == nil && len(items) > 0 {
			return key, items, true
		}
	}
	return "", nil, false
}

// newestMessages is {"KEY": [the last messages that fit]} of a request
// body; ok is false when the body holds no conversation array, or its
// newest message alone is larger than MaxContent.
func newestMessages(api API, body []byte) (string, bool, bool) {
	key, items, ok := conversation(api, body)
	if !ok {
		return "", false, false
	}
	// {"KEY":[ ... ]} and a comma between items.
	size, first := len(key)+6, len(items)
	for first > 0 && size+len(items[first-1])+1 <= MaxContent {
		first--
		size += len(items[first]) + 1
	}
	if first == len(items) {
		return "", false, false
	}
	out, err := json.Marshal(map[string][]json.RawMessage{key: items[first:]})
	if err != nil {
		return "", false, false
	}
	return strings.ToValidUTF8(string(out), "\uFFFD"), first > 0, true
}

// ToolCall is a tool the model asked the agent to run.
type ToolCall struct {
	// ID is the call's id, as the model named it (the id the agent's
	// tool result answers).
	ID   string
	Name string
	// Input is the call's input as JSON text, cut to MaxToolInput bytes
	// (Truncated then says so).
	Input     string
	Truncated bool
}

// Usage is what the response counted.
type Usage struct {
	// Known: the response carried a usage (the counts are then its).
	Known                     bool
	Prompt, Completion, Total int64
	// Final: the counts are the call's last, the ones the vendor bills
	// (a stream's end, or a whole response); not a stream's running
	// count.
	Final bool
}

// Response is what a model call's response said.
type Response struct {
	// Model is the model that answered, as the response names it.
	Model      string
	StopReason string
	Usage      Usage
	ToolCalls  []ToolCall
	// Events counts a stream's events.
	Events int
	// Error is the API's own error message, when the response is one.
	Error string
	// Problem says what could not be read (a stream cut short, an event
	// too large): the counts may then be partial.
	Problem string
}

// ResponseTap reads a response as it passes to the agent. Write never
// fails and never blocks on anything but its own parsing.
type ResponseTap struct {
	api   API
	sse   bool
	pend  []byte // a stream's event not ended yet, or a JSON body
	over  bool   // pend passed MaxEvent: skip to the event's end
	res   Response
	calls map[string]int // a stream's tool calls by index or id
}

// NewResponseTap taps a response of contentType.
func NewResponseTap(api API, contentType string) *ResponseTap {
	ct := strings.ToLower(contentType)
	return &ResponseTap{api: api, sse: strings.HasPrefix(strings.TrimSpace(ct), "text/event-stream"), calls: map[string]int{}}
}

// Write reads p, a piece of the body as the agent receives it.
func (t *ResponseTap) Write(p []byte) (int, error) {
	n := len(p)
	if !t.sse {
		if !t.over {
			if len(t.pend)+len(p) > MaxEvent {
				t.over, t.pend = true, nil
				t.res.Problem = fmt.Sprintf("the response is larger than %d bytes: not read", MaxEvent)
			} else {
				t.pend = append(t.pend, p...)
			}
		}
		return n, nil
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		line := p
		if i >= 0 {
			line = p[:i+1]
		}
		p = p[len(line):]
		if !t.over {
			if len(t.pend)+len(line) > MaxEvent {
				t.over, t.pend = true, nil
				t.res.Problem = fmt.Sprintf("an event larger than %d bytes was not read", MaxEvent)
			} else {
				t.pend = append(t.pend, line...)
			}
		}
		if i < 0 {
			break
		}
		// A blank line ends an event.
		if l := bytes.TrimRight(line, "\r\n"); len(l) == 0 {
			if !t.over {
				t.event(t.pend)
			}
			t.pend, t.over = t.pend[:0], false
		}
	}
	return n, nil
}

// Close ends the response (complete: it was read to its end) and says
// what it held.
func (t *ResponseTap) Close(complete bool) Response {
	switch {
	case !complete:
		// What is pending was cut: not read.
	case t.sse && len(bytes.TrimSpace(t.pend)) > 0 && !t.over:
		t.event(t.pend) // a last event with no blank line after it
	case !t.sse && !t.over && len(bytes.TrimSpace(t.pend)) > 0:
		t.json(bytes.TrimSpace(t.pend))
	}
	if !complete && t.res.Problem == "" {
		t.res.Problem = "the response ended before its end"
	}
	t.res.Model = clip(t.res.Model, 200)
	t.res.StopReason = clip(t.res.StopReason, 100)
	t.res.Error = clip(t.res.Error, 500)
	return t.res
}

// event reads one server-sent event.
func (t *ResponseTap) event(raw []byte) {
	var data, name []byte
	for _, l := range bytes.Split(raw, []byte("\n")) {
		l = bytes.TrimRight(l, "\r")
		if v, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
		} else if v, ok := bytes.CutPrefix(l, []byte("event:")); ok {
			name = bytes.TrimSpace(v)
		}
	}
	if len(data) == 0 {
		return
	}
	t.res.Events++
	if bytes.Equal(data, []byte("[DONE]")) || skipped(name, data) {
		return
	}
	t.json(data)
}

// skipped says whether a named event holds nothing a call's record keeps:
// the text the model writes, streamed a few tokens an event, is most of a
// stream and is not parsed (a tool call's input deltas are).
func skipped(name, data []byte) bool {
	switch string(name) {
	case "content_block_delta":
		return !bytes.Contains(data, []byte("input_json_delta"))
	case "ping", "content_block_stop", "message_stop",
		"response.output_text.delta", "response.reasoning_summary_text.delta", "response.reasoning_text.delta",
		"response.function_call_arguments.delta", "response.custom_tool_call_input.delta", "response.content_part.added",
		"response.content_part.done", "response.output_text.done", "response.output_item.added":
		return true
	}
	return false
}

// json reads one JSON value: a whole response, or one event's data (a
// Gemini stream without SSE is an array of responses).
func (t *ResponseTap) json(data []byte) {
	if t.api == Gemini && len(data) > 0 && data[0] == '[' {
		var all []json.RawMessage
		if json.Unmarshal(data, &all) != nil {
			t.problem("the response is not JSON")
			return
		}
		for _, one := range all {
			t.gemini(one)
		}
		return
	}
	switch t.api {
	case Anthropic:
		t.anthropic(data)
	case OpenAI:
		t.openai(data)
	case Gemini:
		t.gemini(data)
	}
}

func (t *ResponseTap) problem(s string) {
	if t.res.Problem == "" {
		t.res.Problem = s
	}
}

// tool adds (or, by key, finds) a tool call; -1 past MaxToolCalls.
func (t *ResponseTap) tool(key, id, name string) int {
	if key != "" {
		if i, ok := t.calls[key]; ok {
			if id != "" && t.res.ToolCalls[i].ID == "" {
				t.res.ToolCalls[i].ID = clip(id, 200)
			}
			if name != "" && t.res.ToolCalls[i].Name == "" {
				t.res.ToolCalls[i].Name = clip(name, 200)
			}
			return i
		}
	}
	if len(t.res.ToolCalls) >= MaxToolCalls {
		t.problem(fmt.Sprintf("more than %d tool calls: the rest are not recorded", MaxToolCalls))
		return -1
	}
	t.res.ToolCalls = append(t.res.ToolCalls, ToolCall{ID: clip(id, 200), Name: clip(name, 200)})
	i := len(t.res.ToolCalls) - 1
	if key != "" {
		t.calls[key] = i
	}
	return i
}

// input appends s to tool call i's input, within MaxToolInput.
func (t *ResponseTap) input(i int, s string) {
	if i < 0 || s == "" {
		return
	}
	c := &t.res.ToolCalls[i]
	if room := MaxToolInput - len(c.Input); room < len(s) {
		c.Input += clipBytes(s, max(room, 0))
		c.Truncated = true
		return
	}
	c.Input += s
}

// setInput sets a whole JSON input (a value, not text).
func (t *ResponseTap) setInput(i int, raw json.RawMessage) {
	if i < 0 || len(raw) == 0 || string(raw) == "null" {
		return
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		b.Reset()
		b.Write(raw)
	}
	t.res.ToolCalls[i].Input = ""
	t.input(i, b.String())
}

// clip cuts s to n bytes at a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return clipBytes(s, n)
}

func clipBytes(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
