package modelapi

import (
	"encoding/json"
	"strconv"
)

// anthropic reads a Messages API response, or one event of its stream.
func (t *ResponseTap) anthropic(data []byte) {
	type usage struct {
		Input         *int64 `json:"input_tokens"`
		Output        *int64 `json:"output_tokens"`
		CacheCreation int64  `json:"cache_creation_input_tokens"`
		CacheRead     int64  `json:"cache_read_input_tokens"`
	}
	type block struct {
		Type  string          `json:"type"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	var m struct {
		Type    string `json:"type"`
		Model   string `json:"model"`
		Message *struct {
			Model string `json:"model"`
			Usage *usage `json:"usage"`
		} `json:"message"`
		Content      []block `json:"content"`
		StopReason   string  `json:"stop_reason"`
		Usage        *usage  `json:"usage"`
		Index        *int    `json:"index"`
		ContentBlock *block  `json:"content_block"`
		Delta        *struct {
			Type        string `json:"type"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &m) != nil {
		t.problem("a response or event that is not JSON")
		return
	}
	take := func(u *usage) {
		if u == nil {
			return
		}
		if u.Input != nil {
			t.res.Usage.Known = true
			t.res.Usage.Prompt = *u.Input + u.CacheCreation + u.CacheRead
		}
		if u.Output != nil {
			t.res.Usage.Known = true
			t.res.Usage.Completion = *u.Output // cumulative in a stream
		}
		t.res.Usage.Total = t.res.Usage.Prompt + t.res.Usage.Completion
	}
	if m.Error != nil {
		t.res.Error = m.Error.Type + ": " + m.Error.Message
	}
	switch m.Type {
	case "message_start":
		if m.Message != nil {
			t.res.Model = m.Message.Model
			take(m.Message.Usage)
		}
	case "content_block_start":
		if b := m.ContentBlock; b != nil && m.Index != nil && isTool(b.Type) {
			i := t.tool(strconv.Itoa(*m.Index), b.ID, b.Name)
			if string(b.Input) != "{}" {
				t.setInput(i, b.Input)
			}
		}
	case "content_block_delta":
		if m.Delta != nil && m.Delta.Type == "input_json_delta" && m.Index != nil {
			if i, ok := t.calls[strconv.Itoa(*m.Index)]; ok {
				t.input(i, m.Delta.PartialJSON)
			}
		}
	case "message_delta":
		if m.Delta != nil && m.Delta.StopReason != "" {
			t.res.StopReason = m.Delta.StopReason
		}
		take(m.Usage)
		t.res.Usage.Final = m.Usage != nil && m.Usage.Output != nil
	case "message":
		// Not streamed: the whole message.
		t.res.Model, t.res.StopReason = m.Model, m.StopReason
		take(m.Usage)
		t.res.Usage.Final = t.res.Usage.Known
		for _, b := range m.Content {
			if isTool(b.Type) {
				t.setInput(t.tool("", b.ID, b.Name), b.Input)
			}
		}
	}
}

// isTool says whether an Anthropic content block is a tool call.
func isTool(typ string) bool { return typ == "tool_use" || typ == "server_tool_use" }

// openai reads a Responses or Chat Completions response, or one event of
// either's stream.
func (t *ResponseTap) openai(data []byte) {
	type item struct {
		Type      string          `json:"type"`
		ID        string          `json:"id"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Namespace string          `json:"namespace"`
		Arguments string          `json:"arguments"`
		Input     string          `json:"input"`
		Action    json.RawMessage `json:"action"`
	}
	type response struct {
		Model  string `json:"model"`
		Status string `json:"status"`
		Output []item `json:"output"`
		Usage  *struct {
			Input  int64 `json:"input_tokens"`
			Output int64 `json:"output_tokens"`
			Total  int64 `json:"total_tokens"`
		} `json:"usage"`
		Incomplete *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	type toolCall struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	var m struct {
		// Chat Completions (whole or a chunk).
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message *struct {
				ToolCalls []toolCall `json:"tool_calls"`
			} `json:"message"`
			Delta *struct {
				ToolCalls []toolCall `json:"tool_calls"`
			} `json:"delta"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			Prompt     *int64 `json:"prompt_tokens"`
			Completion *int64 `json:"completion_tokens"`
			Total      *int64 `json:"total_tokens"`
			Input      *int64 `json:"input_tokens"`
			Output     *int64 `json:"output_tokens"`
		} `json:"usage"`
		// Responses: a stream's event, or the whole response.
		Type     string          `json:"type"`
		Response *response       `json:"response"`
		Item     *item           `json:"item"`
		Status   string          `json:"status"`
		Output   json.RawMessage `json:"output"`
		Error    json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &m) != nil {
		t.problem("a response or event that is not JSON")
		return
	}
	responseDone := func(r *response) {
		if r.Model != "" {
			t.res.Model = r.Model
		}
		t.res.StopReason = r.Status
		if r.Incomplete != nil && r.Incomplete.Reason != "" {
			t.res.StopReason = r.Status + ": " + r.Incomplete.Reason
		}
		if u := r.Usage; u != nil {
			t.res.Usage = Usage{Known: true, Prompt: u.Input, Completion: u.Output, Total: u.Total, Final: true}
		}
		if r.Error != nil && r.Error.Message != "" {
			t.res.Error = r.Error.Message
		}
	}
	addItem := func(it item) {
		switch it.Type {
		case "function_call":
			// A namespaced tool's call (Codex's MCP tools: namespace
			// mcp__SERVER) is named NAMESPACE__NAME, as Claude Code
			// names them.
			name := it.Name
			if it.Namespace != "" {
				name = it.Namespace + "__" + it.Name
			}
			t.input(t.tool(it.CallID, it.CallID, name), it.Arguments)
		case "custom_tool_call":
			t.input(t.tool(it.CallID, it.CallID, it.Name), it.Input)
		case "local_shell_call":
			t.setInput(t.tool(it.CallID, it.CallID, "local_shell"), it.Action)
		}
	}
	switch {
	case m.Object == "list" && m.Usage != nil && m.Usage.Prompt != nil:
		// Embeddings: the input's tokens.
		t.res.Model = m.Model
		t.res.Usage = Usage{Known: true, Prompt: *m.Usage.Prompt, Total: *m.Usage.Prompt, Final: true}
		if m.Usage.Total != nil {
			t.res.Usage.Total = *m.Usage.Total
		}
	case len(m.Choices) > 0 || m.Object == "chat.completion" || m.Object == "chat.completion.chunk" || m.Object == "text_completion":
		if m.Model != "" {
			t.res.Model = m.Model
		}
		for _, c := range m.Choices {
			if c.FinishReason != "" {
				t.res.StopReason = c.FinishReason
			}
			if c.Message != nil {
				for _, tc := range c.Message.ToolCalls {
					t.input(t.tool("", tc.ID, tc.Function.Name), tc.Function.Arguments)
				}
			}
			if c.Delta != nil {
				for n, tc := range c.Delta.ToolCalls {
					key := "chat:" + strconv.Itoa(n)
					if tc.Index != nil {
						key = "chat:" + strconv.Itoa(*tc.Index)
					}
					t.input(t.tool(key, tc.ID, tc.Function.Name), tc.Function.Arguments)
				}
			}
		}
		if u := m.Usage; u != nil && u.Prompt != nil {
			t.res.Usage = Usage{Known: true, Prompt: *u.Prompt}
			if u.Completion != nil {
				t.res.Usage.Completion = *u.Completion
			}
			t.res.Usage.Total = t.res.Usage.Prompt + t.res.Usage.Completion
			if u.Total != nil {
				t.res.Usage.Total = *u.Total
			}
			// A whole response's, a stream's last chunk's (no choices:
			// OpenAI's), or one after the answer finished; not a
			// server's running count (vLLM's continuous usage).
			t.res.Usage.Final = m.Object != "chat.completion.chunk" || len(m.Choices) == 0 || t.res.StopReason != ""
		}
	case m.Type == "response.created" || m.Type == "response.in_progress":
		if m.Response != nil && m.Response.Model != "" {
			t.res.Model = m.Response.Model
		}
	case m.Type == "response.output_item.done":
		if m.Item != nil {
			addItem(*m.Item)
		}
	case m.Type == "response.completed" || m.Type == "response.incomplete" || m.Type == "response.failed":
		if m.Response != nil {
			responseDone(m.Response)
		}
	case m.Type == "error":
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(data, &e)
		t.res.Error = e.Message
	case m.Object == "response" || (m.Type == "" && len(m.Output) > 0):
		var r response
		if json.Unmarshal(data, &r) == nil {
			responseDone(&r)
			for _, it := range r.Output {
				addItem(it)
			}
		}
	case len(m.Error) > 0 && string(m.Error) != "null":
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(m.Error, &e)
		t.res.Error = e.Message
	}
}

// gemini reads one GenerateContentResponse: a whole response, or one of
// a stream's.
func (t *ResponseTap) gemini(data []byte) {
	var m struct {
		Candidates []struct {
			Content struct {
				Parts []struct {
					FunctionCall *struct {
						ID   string          `json:"id"`
						Name string          `json:"name"`
						Args json.RawMessage `json:"args"`
					} `json:"functionCall"`
				} `json:"parts"`
			} `json:"content"`
			FinishReason string `json:"finishReason"`
		} `json:"candidates"`
		Usage *struct {
			Prompt     int64 `json:"promptTokenCount"`
			Candidates int64 `json:"candidatesTokenCount"`
			Thoughts   int64 `json:"thoughtsTokenCount"`
			Total      int64 `json:"totalTokenCount"`
		} `json:"usageMetadata"`
		ModelVersion string `json:"modelVersion"`
		Error        *struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &m) != nil {
		t.problem("a response or event that is not JSON")
		return
	}
	if m.ModelVersion != "" {
		t.res.Model = m.ModelVersion
	}
	if m.Error != nil {
		t.res.Error = m.Error.Status + ": " + m.Error.Message
	}
	for _, c := range m.Candidates {
		if c.FinishReason != "" {
			t.res.StopReason = c.FinishReason
		}
		for _, p := range c.Content.Parts {
			if f := p.FunctionCall; f != nil {
				t.setInput(t.tool("", f.ID, f.Name), f.Args)
			}
		}
	}
	if u := m.Usage; u != nil {
		// A stream's counts are cumulative: the last one holds, the one
		// beside the answer's finish.
		finished := len(m.Candidates) == 0
		for _, c := range m.Candidates {
			finished = finished || c.FinishReason != ""
		}
		t.res.Usage = Usage{Known: true, Prompt: u.Prompt, Completion: u.Candidates + u.Thoughts, Total: u.Total, Final: finished}
		if u.Total == 0 {
			t.res.Usage.Total = u.Prompt + u.Candidates + u.Thoughts
		}
	}
}
