package mcp

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// FuzzParse: whatever the agent sends, a message read is one the server
// reads the same way (no member twice, nothing unknown), and every
// tools/call is either allowed by name or refused; a tool the rule does
// not allow is never a call.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`))
	f.Add([]byte(`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_repo"}},{"jsonrpc":"2.0","method":"notifications/initialized"}]`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_issue","name":"delete_repo"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"x","result":{"tools":[{"name":"delete_repo"}]}}`))
	tools := Tools{Allow: []string{"get_*"}, Deny: []string{"get_secret"}}
	f.Fuzz(func(t *testing.T, body []byte) {
		msgs, _, err := Parse(body)
		if err != nil {
			return
		}
		calls, refused := Decide("role r", tools, msgs)
		for _, c := range calls {
			if !tools.Allows(c.Tool) {
				t.Fatalf("call of %q passed", c.Tool)
			}
			// What the server would read as the tool's name: the last
			// member of that name, in any parser: there is only one.
			var p map[string]any
			for _, m := range msgs {
				if bytes.Equal(m.ID, c.ID) && m.Method == "tools/call" {
					if json.Unmarshal(m.Params, &p) == nil && p["name"] != c.Tool {
						t.Fatalf("the gateway read %q, a server reads %v", c.Tool, p["name"])
					}
				}
			}
		}
		n := 0
		for _, m := range msgs {
			if m.Method == "tools/call" {
				n++
			}
		}
		k := 0
		for _, r := range refused {
			if r.Method == "tools/call" {
				k++
			}
		}
		if n != len(calls)+k {
			t.Fatalf("%d tools/call, %d allowed and %d refused", n, len(calls), k)
		}
		if out, removed, err := FilterBody(tools, body); err == nil {
			for _, name := range removed {
				if tools.Allows(name) || bytes.Contains(out, []byte(`"name":"`+name+`"`)) && !bytes.Equal(out, body) {
					t.Fatalf("tool %q: removed wrongly, or kept", name)
				}
			}
		}
	})
}

// FuzzSSE: a stream read through a function that changes nothing comes
// out byte for byte, or ends with an error; it never panics.
func FuzzSSE(f *testing.F) {
	f.Add("event: endpoint\ndata: /messages\n\n")
	f.Add("data: a\r\ndata: b\r\n\r\n: comment\n\nid: 1\n")
	f.Add("data:\n\ndata")
	f.Fuzz(func(t *testing.T, stream string) {
		b, err := io.ReadAll(NewSSE(strings.NewReader(stream), func(_ string, d []byte) ([]byte, error) { return d, nil }))
		if err == nil && string(b) != stream {
			t.Fatalf("%q came out as %q", stream, b)
		}
	})
}
