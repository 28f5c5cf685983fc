package mcp

// The decisions: what of the client's messages may reach the server, and
// what of the server's answers the client may see.

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Protocol methods an MCP rule passes whatever its tools: the session's
// own (initialize, ping, notifications) and tools/list, whose result the
// gateway filters. Every other client method (resources/*, prompts/*,
// completion/complete, logging/setLevel, tasks/*) is refused: a rule that
// names tools says what the agent may do there, and those methods reach
// data and actions the rule does not name.
var protocol = map[string]bool{"initialize": true, "ping": true, "tools/list": true}

// Refusal is a client message the gateway answers itself.
type Refusal struct {
	// ID is the request's id (nil for a notification: no answer).
	ID     json.RawMessage
	Method string
	// Tool is the tool a refused tools/call names ("" otherwise).
	Tool   string
	Reason string
}

// Call is a tools/call the rule allows.
type Call struct {
	ID        json.RawMessage
	Tool      string
	Arguments json.RawMessage
}

// callMembers are a tools/call's params' members.
var callMembers = []string{"name", "arguments", "_meta", "task"}

// Decide is what the client's messages may do under a rule's tools (who:
// the role and rule, for the reasons): the tools/calls it allows, and the
// messages it refuses. A response from the client (to a server's request)
// passes.
func Decide(who string, t Tools, msgs []Message) (calls []Call, refused []Refusal) {
	for _, m := range msgs {
		switch {
		case m.IsResponse():
		case strings.HasPrefix(m.Method, "notifications/"):
		case protocol[m.Method]:
		case m.Method == "tools/call":
			c, err := callOf(m)
			switch {
			case err != nil:
				refused = append(refused, Refusal{ID: m.ID, Method: m.Method, Reason: err.Error()})
			case !t.Allows(c.Tool):
				refused = append(refused, Refusal{ID: m.ID, Method: m.Method, Tool: c.Tool,
					Reason: fmt.Sprintf("tool %s is not allowed by %s", clip(c.Tool), who)})
			default:
				calls = append(calls, c)
			}
		default:
			refused = append(refused, Refusal{ID: m.ID, Method: m.Method,
				Reason: fmt.Sprintf("method %s is not allowed by %s: an mcp rule passes the protocol's own methods and tools/call of the tools it allows", clip(m.Method), who)})
		}
	}
	return calls, refused
}

// callOf reads a tools/call's tool and arguments.
func callOf(m Message) (Call, error) {
	members, err := exactMembers(m.Params, callMembers)
	if len(m.Params) == 0 || err != nil {
		return Call{}, fmt.Errorf("tools/call params are not {name, arguments}")
	}
	var name string
	if err := stringMember(members, "name", &name); err != nil || name == "" {
		return Call{}, fmt.Errorf("tools/call names no tool")
	}
	args := members["arguments"]
	if len(args) > 0 && args[0] != '{' && string(args) != "null" {
		return Call{}, fmt.Errorf("tools/call arguments are not an object")
	}
	return Call{ID: m.ID, Tool: name, Arguments: args}, nil
}

// RefusedCode is the JSON-RPC error code of a refusal (in the range
// JSON-RPC leaves to servers).
const RefusedCode = -32001

// ErrorFor is the JSON-RPC error response the client gets for r (nil for
// a notification, which has no answer).
func ErrorFor(r Refusal) json.RawMessage {
	if len(r.ID) == 0 {
		return nil
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   any             `json:"error"`
	}{"2.0", r.ID, map[string]any{"code": RefusedCode, "message": "agentbox: " + r.Reason}})
	return b
}

// toolList is a tools/list result's members.
type toolList map[string]json.RawMessage

// FilterResult keeps of a result only the tools the rule allows, when it
// is a tools/list result (a "tools" array of named tools); removed names
// the others. A result that is not one is returned as it is.
func FilterResult(t Tools, result json.RawMessage) (json.RawMessage, []string, error) {
	if len(result) == 0 || result[0] != '{' {
		return result, nil, nil
	}
	var members toolList
	if err := json.Unmarshal(result, &members); err != nil {
		return nil, nil, err
	}
	raw, ok := members["tools"]
	if !ok {
		return result, nil, nil
	}
	var tools []json.RawMessage
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, nil, fmt.Errorf("tools is not a list: %w", err)
	}
	var kept []json.RawMessage
	var removed []string
	for _, tool := range tools {
		var members map[string]json.RawMessage
		var name string
		if json.Unmarshal(tool, &members) != nil || stringMember(members, "name", &name) != nil || name == "" {
			return nil, nil, fmt.Errorf("a listed tool has no name")
		}
		if t.Allows(name) {
			kept = append(kept, tool)
		} else {
			removed = append(removed, name)
		}
	}
	if len(removed) == 0 {
		return result, nil, nil
	}
	if kept == nil {
		kept = []json.RawMessage{}
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, nil, err
	}
	members["tools"] = b
	out, err := json.Marshal(members)
	return out, removed, err
}

// FilterBody filters the tools/list results of a server's body (one
// message or a batch): what the client reads of it.
func FilterBody(t Tools, body []byte) ([]byte, []string, error) {
	out, removed, _, err := FilterAnswers(t, body)
	return out, removed, err
}

// Seen is what a server's message (or batch) says besides its tools: its
// answers to the client's requests, and the methods of its own requests
// to the client (sampling/createMessage, elicitation/create, roots/list,
// ping).
type Seen struct {
	Answers []Answer
	Asked   []string
}

// FilterAnswers is FilterBody, with what else the body says.
func FilterAnswers(t Tools, body []byte) ([]byte, []string, Seen, error) {
	msgs, batch, err := Parse(body)
	if err != nil {
		return nil, nil, Seen{}, err
	}
	seen := Seen{Answers: Answers(msgs)}
	for _, m := range msgs {
		if m.IsRequest() {
			seen.Asked = append(seen.Asked, m.Method)
		}
	}
	out, removed, err := filterMsgs(t, body, msgs, batch)
	return out, removed, seen, err
}

// filterMsgs filters the parsed messages of body.
func filterMsgs(t Tools, body []byte, msgs []Message, batch bool) ([]byte, []string, error) {
	var err error
	var removed []string
	changed := false
	for i, m := range msgs {
		if len(m.Result) == 0 {
			continue
		}
		res, gone, err := FilterResult(t, m.Result)
		if err != nil {
			return nil, nil, err
		}
		if gone != nil {
			msgs[i].Result, changed, removed = res, true, append(removed, gone...)
		}
	}
	if !changed {
		return body, nil, nil
	}
	var out []byte
	if batch {
		out, err = json.Marshal(msgs)
	} else {
		out, err = json.Marshal(msgs[0])
	}
	return out, removed, err
}

// Answer is what a server's response message says of the request of ID.
type Answer struct {
	ID json.RawMessage
	// Bytes is the result's (or the error's) size; IsError: a JSON-RPC
	// error, or a result with isError true.
	Bytes   int64
	IsError bool
}

// Answers are the responses among msgs.
func Answers(msgs []Message) []Answer {
	var out []Answer
	for _, m := range msgs {
		if !m.IsResponse() {
			continue
		}
		a := Answer{ID: m.ID, Bytes: int64(len(m.Result) + len(m.Error)), IsError: len(m.Error) > 0}
		var r struct {
			IsError bool `json:"isError"`
		}
		if len(m.Result) > 0 && json.Unmarshal(m.Result, &r) == nil && r.IsError {
			a.IsError = true
		}
		out = append(out, a)
	}
	return out
}
