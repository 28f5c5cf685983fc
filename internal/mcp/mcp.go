// Package mcp reads the Model Context Protocol's JSON-RPC messages as the
// egress gateway carries them to and from a remote MCP server (the
// streamable HTTP transport, and the older SSE one), and decides them by a
// host rule's tools: a tools/call of a tool the rule does not allow is
// answered by a JSON-RPC error and never reaches the server; a tools/list
// result keeps only the tools the rule allows. Pure: the gateway feeds
// bytes, nothing here touches a connection.
//
// What is read is what the server would read: a message with a member
// twice (which parsers resolve differently), a member JSON-RPC does not
// have, or over MaxMessage bytes is refused, never passed along unread.
package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// MaxMessage bounds a request body, a response body, or one server-sent
// event's data.
const MaxMessage = 1 << 20

// maxDepth bounds the nesting of a message.
const maxDepth = 64

// Tools are a rule's tool patterns: an exact name, or a prefix ending in
// '*'. Deny wins over allow.
type Tools struct {
	Allow, Deny []string
}

// Allows says whether the rule allows tool name.
func (t Tools) Allows(name string) bool {
	return !matchAny(t.Deny, name) && matchAny(t.Allow, name)
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if p == name {
			return true
		}
	}
	return false
}

// Message is one JSON-RPC 2.0 message: a request (method and id), a
// notification (method, no id) or a response (id, and result or error).
type Message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

// IsRequest, IsNotification and IsResponse say which kind m is.
func (m Message) IsRequest() bool      { return m.Method != "" && len(m.ID) > 0 }
func (m Message) IsNotification() bool { return m.Method != "" && len(m.ID) == 0 }
func (m Message) IsResponse() bool     { return m.Method == "" && len(m.ID) > 0 }

// Parse reads a body of one message or a batch (a JSON array of them).
func Parse(body []byte) (msgs []Message, batch bool, err error) {
	if len(body) > MaxMessage {
		return nil, false, fmt.Errorf("%d bytes, more than %d", len(body), MaxMessage)
	}
	if err := checkJSON(body); err != nil {
		return nil, false, err
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var raw []json.RawMessage
		if err := json.Unmarshal(body, &raw); err != nil {
			return nil, false, err
		}
		if len(raw) == 0 {
			return nil, false, errors.New("an empty batch")
		}
		for i, r := range raw {
			m, err := parseOne(r)
			if err != nil {
				return nil, false, fmt.Errorf("batch[%d]: %w", i, err)
			}
			msgs = append(msgs, m)
		}
		return msgs, true, nil
	}
	m, err := parseOne(body)
	if err != nil {
		return nil, false, err
	}
	return []Message{m}, false, nil
}

// envelope are the members a JSON-RPC message may have, spelled exactly
// (Go's decoder would match "Method" to method; a server would not).
var envelope = []string{"jsonrpc", "id", "method", "params", "result", "error"}

func parseOne(b []byte) (Message, error) {
	members, err := exactMembers(b, envelope)
	if err != nil {
		return Message{}, fmt.Errorf("not a JSON-RPC message: %w", err)
	}
	var m Message
	if err := stringMember(members, "jsonrpc", &m.JSONRPC); err != nil {
		return Message{}, err
	}
	if err := stringMember(members, "method", &m.Method); err != nil {
		return Message{}, err
	}
	m.ID, m.Params, m.Result, m.Error = members["id"], members["params"], members["result"], members["error"]
	if string(m.ID) == "null" {
		m.ID = nil
	}
	switch {
	case m.JSONRPC != "2.0":
		return Message{}, fmt.Errorf("jsonrpc %q, not 2.0", m.JSONRPC)
	case len(m.ID) > 0 && m.ID[0] != '"' && (m.ID[0] < '0' || m.ID[0] > '9') && m.ID[0] != '-':
		return Message{}, fmt.Errorf("id %s is not a string or a number", clip(string(m.ID)))
	case m.Method == "" && len(m.ID) == 0:
		return Message{}, errors.New("neither a method nor an id")
	case m.Method != "" && (len(m.Result) > 0 || len(m.Error) > 0):
		return Message{}, fmt.Errorf("method %s with a result or an error", clip(m.Method))
	case m.Method == "" && (len(m.Result) > 0) == (len(m.Error) > 0):
		return Message{}, errors.New("a response needs a result or an error, not both")
	}
	return m, nil
}

// frame is an open object or array while checkJSON walks a body.
type frame struct {
	object bool
	keys   map[string]bool
	// key: the next token is a member's name.
	key bool
}

// checkJSON refuses a body that is not one JSON value, that nests deeper
// than maxDepth, or that has an object with a member twice.
func checkJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) && len(stack) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].key {
			top := stack[n-1]
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
				valueEnded(stack)
				if len(stack) == 0 && dec.More() {
					return errors.New("data after the JSON value")
				}
				continue
			}
			k, _ := tok.(string)
			if top.keys[k] {
				return fmt.Errorf("member %q twice in one object", clip(k))
			}
			top.keys[k], top.key = true, false
			continue
		}
		switch d, _ := tok.(json.Delim); d {
		case '{', '[':
			if len(stack) == maxDepth {
				return fmt.Errorf("nested deeper than %d", maxDepth)
			}
			stack = append(stack, &frame{object: d == '{', keys: map[string]bool{}, key: d == '{'})
			continue
		case ']':
			stack = stack[:len(stack)-1]
		}
		valueEnded(stack)
		if len(stack) == 0 && dec.More() {
			return errors.New("data after the JSON value")
		}
	}
}

// valueEnded notes that a value ended inside the innermost open object:
// its next token is a member's name.
func valueEnded(stack []*frame) {
	if n := len(stack); n > 0 && stack[n-1].object {
		stack[n-1].key = true
	}
}

// exactMembers reads an object's members, each spelled exactly as one of
// known.
func exactMembers(b []byte, known []string) (map[string]json.RawMessage, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		return nil, err
	}
	if members == nil {
		return nil, errors.New("null")
	}
	for k := range members {
		if !slices.Contains(known, k) {
			return nil, fmt.Errorf("member %q is not one of %v", clip(k), known)
		}
	}
	return members, nil
}

// stringMember reads member k of members, a JSON string, into v.
func stringMember(members map[string]json.RawMessage, k string, v *string) error {
	raw, ok := members[k]
	if !ok {
		return nil
	}
	if json.Unmarshal(raw, v) != nil || len(raw) == 0 || raw[0] != '"' {
		return fmt.Errorf("%s is not a string", k)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
