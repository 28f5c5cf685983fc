package modelapi

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestEndpointOf(t *testing.T) {
	for _, tc := range []struct {
		api          API
		method, path string
		want         Endpoint
	}{
		{Anthropic, "POST", "/v1/messages", Endpoint{"messages", Generates}},
		{Anthropic, "POST", "/v1/messages/count_tokens", Endpoint{"count_tokens", Free}},
		{Anthropic, "GET", "/v1/models", Endpoint{"models", Free}},
		{Anthropic, "GET", "/v1/models/claude-sonnet-4-6", Endpoint{"models", Free}},
		{Anthropic, "POST", "/v1/messages/batches", Endpoint{"POST /v1/messages/batches", Unaccounted}},
		{Anthropic, "GET", "/v1/messages/batches/b1/results", Endpoint{"GET /v1/messages/batches/b1/results", Unaccounted}},
		{Anthropic, "POST", "/v1/complete", Endpoint{"POST /v1/complete", Unaccounted}},
		{Anthropic, "GET", "/api/claude_code/settings", Endpoint{"GET /api/claude_code/settings", Unaccounted}},
		{Anthropic, "GET", "/v1/messages", Endpoint{"GET /v1/messages", Unaccounted}},
		{OpenAI, "POST", "/v1/chat/completions", Endpoint{"chat.completions", Generates}},
		{OpenAI, "POST", "/openai/deployments/gpt/chat/completions", Endpoint{"chat.completions", Generates}},
		{OpenAI, "POST", "/v1/completions", Endpoint{"completions", Generates}},
		{OpenAI, "POST", "/v1/responses", Endpoint{"responses", Generates}},
		{OpenAI, "POST", "/backend-api/codex/responses", Endpoint{"responses", Generates}},
		{OpenAI, "POST", "/v1/embeddings", Endpoint{"embeddings", Embeds}},
		{OpenAI, "POST", "/v1/responses/input_tokens", Endpoint{"responses.input_tokens", Free}},
		{OpenAI, "GET", "/v1/responses/resp_1", Endpoint{"responses.retrieve", Free}},
		{OpenAI, "POST", "/v1/responses/resp_1/cancel", Endpoint{"responses.cancel", Free}},
		{OpenAI, "POST", "/v1/batches", Endpoint{"POST /v1/batches", Unaccounted}},
		{OpenAI, "POST", "/v1/files", Endpoint{"POST /v1/files", Unaccounted}},
		{OpenAI, "POST", "/v1/audio/speech", Endpoint{"POST /v1/audio/speech", Unaccounted}},
		{OpenAI, "POST", "/v1/images/generations", Endpoint{"POST /v1/images/generations", Unaccounted}},
		{Gemini, "POST", "/v1beta/models/gemini-2.5-pro:generateContent", Endpoint{"generateContent", Generates}},
		{Gemini, "POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", Endpoint{"streamGenerateContent", Generates}},
		{Gemini, "POST", "/v1beta/models/text-embedding-004:embedContent", Endpoint{"embedContent", Embeds}},
		{Gemini, "POST", "/v1beta/models/gemini-2.5-pro:countTokens", Endpoint{"countTokens", Free}},
		{Gemini, "POST", "/v1beta/models/gemini-2.5-pro:batchGenerateContent", Endpoint{"POST /v1beta/models/gemini-2.5-pro:batchGenerateContent", Unaccounted}},
		{Gemini, "GET", "/v1beta/models/gemini-2.5-pro:generateContent", Endpoint{"GET /v1beta/models/gemini-2.5-pro:generateContent", Unaccounted}},
		{Gemini, "POST", "/v1beta/cachedContents", Endpoint{"POST /v1beta/cachedContents", Unaccounted}},
		// A path the vendor could route elsewhere than it reads.
		{Anthropic, "POST", "/v1/messages/batches/../../messages", Endpoint{"POST /v1/messages/batches/../../messages", Unaccounted}},
		{Anthropic, "POST", "/v1//messages", Endpoint{"POST /v1//messages", Unaccounted}},
		{Anthropic, "POST", "/v1/messages;x/batches", Endpoint{"POST /v1/messages;x/batches", Unaccounted}},
		{OpenAI, "POST", "/v1/batches/./x/responses", Endpoint{"POST /v1/batches/./x/responses", Unaccounted}},
	} {
		if got := EndpointOf(tc.api, tc.method, tc.path); got != tc.want {
			t.Errorf("%s %s %s: %+v, want %+v", tc.api, tc.method, tc.path, got, tc.want)
		}
	}
}

func TestReserve(t *testing.T) {
	msgs := EndpointOf(Anthropic, "POST", "/v1/messages")
	chat := EndpointOf(OpenAI, "POST", "/v1/chat/completions")
	resp := EndpointOf(OpenAI, "POST", "/v1/responses")
	comp := EndpointOf(OpenAI, "POST", "/v1/completions")
	emb := EndpointOf(OpenAI, "POST", "/v1/embeddings")
	gem := EndpointOf(Gemini, "POST", "/v1beta/models/g:streamGenerateContent")
	for _, tc := range []struct {
		name    string
		api     API
		e       Endpoint
		body    string
		output  int64
		capSet  string // the cap set in the new body, as JSON
		wantErr string
	}{
		{"messages", Anthropic, msgs, `{"model":"c","max_tokens":400,"messages":[]}`, 400, "", ""},
		{"messages, lax number", Anthropic, msgs, `{"max_tokens":"400.0"}`, 400, "", ""},
		{"messages, no cap", Anthropic, msgs, `{"model":"c","messages":[]}`, 1000, `"max_tokens":1000`, ""},
		{"messages, two caps", Anthropic, msgs, `{"max_tokens":1,"max_tokens":100000}`, 0, "", "max_tokens: named twice"},
		{"messages, negative", Anthropic, msgs, `{"max_tokens":-5}`, 0, "", "max_tokens: -5 is not a whole number"},
		{"messages, fraction", Anthropic, msgs, `{"max_tokens":1.5}`, 0, "", "max_tokens: 1.5 is not a whole number"},
		{"not an object", Anthropic, msgs, `[1]`, 0, "", "not a JSON object"},
		{"two values", Anthropic, msgs, `{"max_tokens":1}{"max_tokens":9}`, 0, "", "not one JSON value"},
		{"chat n", OpenAI, chat, `{"max_completion_tokens":100,"n":3}`, 300, "", ""},
		{"chat legacy cap", OpenAI, chat, `{"max_tokens":100}`, 100, "", ""},
		{"chat both caps", OpenAI, chat, `{"max_tokens":100,"max_completion_tokens":50}`, 0, "", "the request names two output caps"},
		{"chat null cap", OpenAI, chat, `{"max_tokens":null}`, 1000, `"max_completion_tokens":1000`, ""},
		{"responses", OpenAI, resp, `{"max_output_tokens":64}`, 64, "", ""},
		{"responses, no cap", OpenAI, resp, `{"input":"hi"}`, 1000, `"max_output_tokens":1000`, ""},
		{"responses background", OpenAI, resp, `{"background":true,"max_output_tokens":64}`, 0, "", "background: a background response"},
		{"completions default", OpenAI, comp, `{"prompt":"x","best_of":4,"n":2}`, 64, "", ""},
		{"embeddings", OpenAI, emb, `{"input":"hi"}`, 0, "", ""},
		{"gemini", Gemini, gem, `{"generationConfig":{"maxOutputTokens":200,"candidateCount":2}}`, 400, "", ""},
		{"gemini snake", Gemini, gem, `{"generation_config":{"max_output_tokens":"200"}}`, 200, "", ""},
		{"gemini no config", Gemini, gem, `{"contents":[]}`, 1000, `"generationConfig":{"maxOutputTokens":1000}`, ""},
		{"gemini config no cap", Gemini, gem, `{"generationConfig":{"temperature":0.5}}`, 1000, `"maxOutputTokens":1000`, ""},
		{"gemini both spellings", Gemini, gem, `{"generationConfig":{},"generation_config":{}}`, 0, "", "the request names both"},
		{"gemini two caps", Gemini, gem, `{"generationConfig":{"maxOutputTokens":1,"max_output_tokens":9}}`, 0, "", "two output caps"},
	} {
		r, out, err := Reserve(tc.api, tc.e, []byte(tc.body), 1000)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if r.Input != int64(len(tc.body)) || r.Output != tc.output || r.CapSet != (tc.capSet != "") {
			t.Errorf("%s: %+v, want input %d output %d", tc.name, r, len(tc.body), tc.output)
		}
		if tc.capSet == "" && out != nil || tc.capSet != "" && (!strings.Contains(string(out), tc.capSet) || !json.Valid(out)) {
			t.Errorf("%s: new body %s, want one with %s", tc.name, out, tc.capSet)
		}
		// What else the body said is kept.
		if out != nil {
			var before, after map[string]json.RawMessage
			json.Unmarshal([]byte(tc.body), &before)
			json.Unmarshal(out, &after)
			for k := range before {
				if _, ok := after[k]; !ok {
					t.Errorf("%s: %s lost", tc.name, k)
				}
			}
		}
	}
}

func TestCharge(t *testing.T) {
	r := Reservation{Input: 100, Output: 400}
	final := Response{Usage: Usage{Known: true, Prompt: 30, Completion: 400, Total: 430, Final: true}}
	running := Response{Usage: Usage{Known: true, Prompt: 30, Completion: 37, Total: 67}}
	for _, tc := range []struct {
		name   string
		b      Billing
		status int
		res    Response
		want   int64
	}{
		{"final usage", Generates, 200, final, 430},
		{"final usage, more than reserved", Generates, 200, Response{Usage: Usage{Known: true, Total: 900, Final: true}}, 900},
		{"cut short", Generates, 200, running, 500},
		{"no usage", Generates, 200, Response{}, 500},
		{"no response", Generates, 0, Response{}, 500},
		{"vendor error", Generates, 400, Response{Error: "bad"}, 0},
		{"vendor 429", Generates, 429, Response{}, 0},
		{"embeddings", Embeds, 200, Response{Usage: Usage{Known: true, Prompt: 8, Total: 8}}, 8},
		{"embeddings without usage", Embeds, 200, Response{}, 500},
		{"free", Free, 200, Response{}, 0},
	} {
		if got := Charge(tc.b, r, tc.status, tc.res); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A stream cut before its end has no final usage: Anthropic's before its
// message_delta, Responses' before response.completed, Chat Completions'
// without include_usage, Gemini's before the chunk that finishes.
func TestUsageFinalOnlyAtTheEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		body string
	}{
		{"anthropic", Anthropic, anthropicStream},
		{"responses", OpenAI, responsesStream},
		{"chat", OpenAI, chatStream},
		{"gemini", Gemini, geminiStream},
	} {
		whole := NewResponseTap(tc.api, "text/event-stream")
		whole.Write([]byte(tc.body))
		if u := whole.Close(true).Usage; !u.Final {
			t.Errorf("%s whole: %+v", tc.name, u)
		}
		// Every cut before the last event.
		end := strings.LastIndex(strings.TrimRight(tc.body, "\r\n"), "\n\n")
		if end < 0 {
			end = strings.LastIndex(strings.TrimRight(tc.body, "\r\n"), "\r\n\r\n")
		}
		for cut := 0; cut < end; cut += 7 {
			tap := NewResponseTap(tc.api, "text/event-stream")
			tap.Write([]byte(tc.body[:cut]))
			if u := tap.Close(false).Usage; u.Final {
				t.Errorf("%s cut at %d: final usage %+v", tc.name, cut, u)
				break
			}
		}
	}
	// A chat stream with no usage chunk (include_usage unset).
	tap := NewResponseTap(OpenAI, "text/event-stream")
	tap.Write([]byte("data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	if u := tap.Close(true).Usage; u.Known || u.Final {
		t.Errorf("chat without usage: %+v", u)
	}
}
