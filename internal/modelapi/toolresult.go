package modelapi

import (
	"encoding/json"
	"strings"
)

// MaxToolResult bounds what LastToolResult returns.
const MaxToolResult = 1 << 10

// LastToolResult is the newest tool result in a request body of api's
// wire format (what the agent had just read and sent the model), cut to
// MaxToolResult bytes, and the id of the call it answers. ok is false
// when content is not a whole request (a body kept only in part) or
// holds no tool result.
func LastToolResult(api API, content string) (text, id string, ok bool) {
	_, items, _ := conversation(api, []byte(content))
	for i := len(items) - 1; i >= 0; i-- {
		if text, id, ok := toolResult(items[i]); ok {
			return clipBytes(text, MaxToolResult), id, true
		}
	}
	return "", "", false
}

// toolResult reads a tool result out of one message or input item, the
// last one when it holds several.
func toolResult(raw json.RawMessage) (text, id string, ok bool) {
	var m struct {
		Type       string          `json:"type"`
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		CallID     string          `json:"call_id"`
		Output     json.RawMessage `json:"output"`
		Parts      []struct {
			FunctionResponse *struct {
				ID       string          `json:"id"`
				Name     string          `json:"name"`
				Response json.RawMessage `json:"response"`
			} `json:"functionResponse"`
		} `json:"parts"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return "", "", false
	}
	switch {
	case m.Type == "function_call_output" || m.Type == "custom_tool_call_output": // Responses
		return textOf(m.Output), m.CallID, true
	case m.Role == "tool": // Chat Completions
		return textOf(m.Content), m.ToolCallID, true
	case len(m.Parts) > 0: // Gemini
		for i := len(m.Parts) - 1; i >= 0; i-- {
			if f := m.Parts[i].FunctionResponse; f != nil {
				return textOf(f.Response), f.ID, true
			}
		}
	case m.Role == "user" && len(m.Content) > 0 && m.Content[0] == '[': // Messages
		var blocks []struct {
			Type      string          `json:"type"`
			ToolUseID string          `json:"tool_use_id"`
			Content   json.RawMessage `json:"content"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			return "", "", false
		}
		for i := len(blocks) - 1; i >= 0; i-- {
			if blocks[i].Type == "tool_result" {
				return textOf(blocks[i].Content), blocks[i].ToolUseID, true
			}
		}
	}
	return "", "", false
}

// textOf is a tool result's text: a string, the text blocks of a list
// ([{type: text, text}]), the one string of an object, or else the JSON
// itself.
func textOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &blocks) == nil {
		var parts []string
		for _, b := range blocks {
			if b.Text != "" {
				parts = append(parts, b.Text)
			}
		}
		if len(parts) > 0 {
			return strings.Join(parts, "\n")
		}
	}
	// Gemini CLI answers {"output": "..."}; a response of one text
	// field reads as its text.
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) == nil && len(obj) == 1 {
		for _, v := range obj {
			if json.Unmarshal(v, &s) == nil {
				return s
			}
		}
	}
	return strings.TrimSpace(string(raw))
}
