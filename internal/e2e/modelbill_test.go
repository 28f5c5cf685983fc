//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The billing model server (issue 47): a model named "bill-*" costs what
// a vendor bills, whatever the client does with its answer. Each call's
// prompt is billedPrompt tokens, its answer billedOutput, written in 40
// events 25 ms apart; a stream goes on to its end though the client has
// gone (the vendor generated it). The bill is kept by model name, as the
// vendor's invoice would show it; each request is counted by endpoint.
const (
	billedPrompt = 30
	billedOutput = 400
	billedEmbed  = 8
)

type modelBill struct {
	mu     sync.Mutex
	tokens map[string]int64
	calls  map[string]int // "host path"
}

var bill = &modelBill{tokens: map[string]int64{}, calls: map[string]int{}}

func (b *modelBill) add(model string, n int64, host, path string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens[model] += n
	b.calls[host+" "+path]++
}

// of is what the vendor billed model.
func (b *modelBill) of(model string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens[model]
}

func (b *modelBill) reached(host, path string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[host+" "+path]
}

// serveBilled answers a billed model's call; false (the body left for
// the next handler) when r is not one.
func serveBilled(w http.ResponseWriter, r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	if host != anthropicHost && host != openaiHost {
		return false
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Requests []json.RawMessage `json:"requests"`
	}
	json.Unmarshal(body, &req)
	path := r.URL.Path
	switch {
	case path == "/v1/messages/batches" || path == "/v1/batches":
		// Each request of the batch is generated, and billed.
		bill.add("bill-batch", int64(max(len(req.Requests), 1))*(billedPrompt+billedOutput), host, path)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msgbatch_e2e","type":"message_batch","processing_status":"in_progress"}`)
		return true
	case !strings.HasPrefix(req.Model, "bill-"):
		return false
	case path == "/v1/embeddings":
		bill.add(req.Model, billedEmbed, host, path)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":%q,"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, req.Model, billedEmbed, billedEmbed)
		return true
	}
	bill.add(req.Model, billedPrompt+billedOutput, host, path)
	if !req.Stream {
		// The whole answer is generated before its first byte.
		time.Sleep(time.Second)
		w.Header().Set("Content-Type", "application/json")
		if host == anthropicHost {
			fmt.Fprintf(w, `{"type":"message","model":%q,"content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","usage":{"input_tokens":%d,"output_tokens":%d}}`, req.Model, billedPrompt, billedOutput)
		} else {
			fmt.Fprintf(w, `{"object":"chat.completion","model":%q,"choices":[{"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, req.Model, billedPrompt, billedOutput, billedPrompt+billedOutput)
		}
		return true
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(event, data string) {
		if event != "" {
			io.WriteString(w, "event: "+event+"\n")
		}
		io.WriteString(w, "data: "+data+"\n\n")
		rc.Flush()
	}
	const n = 40
	switch {
	case host == anthropicHost:
		send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"model":%q,"usage":{"input_tokens":%d,"output_tokens":1}}}`, req.Model, billedPrompt))
		for i := 0; i < n; i++ {
			send("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ten tokens of text "}}`)
			time.Sleep(25 * time.Millisecond)
		}
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":%d}}`, billedOutput))
		send("message_stop", `{"type":"message_stop"}`)
	case path == "/v1/responses":
		send("response.created", fmt.Sprintf(`{"type":"response.created","response":{"model":%q,"status":"in_progress"}}`, req.Model))
		for i := 0; i < n; i++ {
			send("response.output_text.delta", `{"type":"response.output_text.delta","delta":"ten tokens of text "}`)
			time.Sleep(25 * time.Millisecond)
		}
		send("response.completed", fmt.Sprintf(`{"type":"response.completed","response":{"model":%q,"status":"completed","usage":{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d}}}`, req.Model, billedPrompt, billedOutput, billedPrompt+billedOutput))
	default:
		chunk := func(delta, finish string) string {
			return fmt.Sprintf(`{"object":"chat.completion.chunk","model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`, req.Model, delta, finish)
		}
		for i := 0; i < n; i++ {
			send("", chunk(`{"content":"ten tokens of text "}`, "null"))
			time.Sleep(25 * time.Millisecond)
		}
		send("", chunk(`{}`, `"stop"`))
		// Usage only when the client asked for it: the API's default.
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			send("", fmt.Sprintf(`{"object":"chat.completion.chunk","model":%q,"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, req.Model, billedPrompt, billedOutput, billedPrompt+billedOutput))
		}
		send("", "[DONE]")
	}
	return true
}
