package egressgw

// A remote MCP server's requests (a host rule with api: mcp): the
// client's JSON-RPC is read whole before it goes, and a tools/call of a
// tool the rule does not allow, or a method beyond the protocol's own, is
// answered by the gateway with a JSON-RPC error the client shows: it never
// reaches the server. The server's answers (JSON, or server-sent events as
// they pass) keep only the allowed tools in a tools/list result.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"agentbox.dev/agentbox/internal/mcp"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// mcpTap is what the gateway read of one exchange with an MCP server.
type mcpTap struct {
	tools mcp.Tools
	// rpc: the request carried JSON-RPC, so a JSON answer is one too.
	rpc bool
	mu  sync.Mutex
	// hidden are the tools a response's tools/list named and the agent
	// did not see; asked the methods of the server's own requests.
	hidden, asked []string
	// calls are the calls let through, byID their index by JSON-RPC id.
	calls []MCPCallDone
	byID  map[string]int
	// stream is the SSE-transport stream its calls are answered on (nil:
	// they are answered on the request's own response).
	stream *sseStream
}

// saw notes what a server's message held: the tools tools/list named that
// the agent did not see (hidden), and the server's own requests (asked).
func (m *mcpTap) saw(names, asked []string) {
	m.mu.Lock()
	m.hidden = append(m.hidden, names...)
	m.asked = append(m.asked, asked...)
	m.mu.Unlock()
}

// seenNow are the tools hidden so far, and the methods of the server's requests.
func (m *mcpTap) seenNow() (hidden, asked []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hidden, m.asked
}

// answered notes what came back for the calls let through.
func (m *mcpTap) answered(answers []mcp.Answer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range answers {
		if i, ok := m.byID[string(a.ID)]; ok {
			c := &m.calls[i]
			c.Answered, c.ResultBytes, c.IsError = true, a.Bytes, a.IsError
		}
	}
}

// callsNow are the calls let through, with what came back so far.
func (m *mcpTap) callsNow() []MCPCallDone {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// admitMCP reads a request to an MCP server and decides it by the rule's
// tools (who: the role's rule, for the refusal). Refused, the agent has
// the JSON-RPC errors and ok is false.
func (g *Gateway) admitMCP(cw *countingWriter, r *http.Request, rule netpolicy.Rule, budget policy.MCPBudget, name string, ev *Event, x *exchange) (ok bool) {
	x.mcp = &mcpTap{tools: *rule.Tools}
	ev.MCP = &MCPEvent{}
	if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
		// A GET opens the server's stream (filtered as it passes); a
		// DELETE ends the session.
		return true
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, mcp.MaxMessage+1))
	switch {
	case errors.Is(err, errSlowBody):
		ev.Kind, ev.Reason = Refused, errSlowBody.Error()
		http.Error(cw, "agentbox egress gateway: "+err.Error(), http.StatusRequestTimeout)
		return false
	case err != nil:
		return mcpRefuse(cw, ev, http.StatusBadRequest, nil, "the request body could not be read: "+err.Error())
	case len(raw) > mcp.MaxMessage:
		return mcpRefuse(cw, ev, http.StatusRequestEntityTooLarge, nil, fmt.Sprintf("an MCP message over %d bytes is not read, so not sent", mcp.MaxMessage))
	}
	msgs, batch, err := mcp.Parse(raw)
	if err != nil {
		return mcpRefuse(cw, ev, http.StatusBadRequest, nil, "not an MCP message the gateway reads ("+err.Error()+"): not sent")
	}
	x.mcp.rpc = true
	// A POST to an SSE-transport stream's endpoint is answered there.
	stream := g.sse.lookup(name, r.URL)
	calls, refused := mcp.Decide(rule.Name, x.mcp.tools, msgs)
	if len(refused) == 0 {
		if why := g.mcpUsed.take(budget, name, calls); why != "" {
			for _, c := range calls {
				refused = append(refused, mcp.Refusal{ID: c.ID, Method: "tools/call", Tool: c.Tool, Reason: why})
			}
		}
	}
	if len(refused) == 0 {
		x.mcp.byID = map[string]int{}
		for i, c := range calls {
			x.mcp.calls = append(x.mcp.calls, MCPCallDone{Tool: c.Tool, Arguments: string(c.Arguments)})
			x.mcp.byID[string(c.ID)] = i
		}
		ev.MCP.Session, ev.MCP.Application = clipName(r.Header.Get("Mcp-Session-Id")), clipName(r.Header.Get("User-Agent"))
		if stream != nil && ev.MCP.Session == "" {
			// The SSE transport names its session in the endpoint's
			// query.
			ev.MCP.Session = clipName(r.URL.RawQuery)
		}
		if stream != nil && len(calls) > 0 {
			x.mcp.stream = stream
			stream.expect(x.mcp)
		}
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(raw)), int64(len(raw)), nil
		r.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		return true
	}
	var reasons []string
	for _, f := range refused {
		reasons = append(reasons, f.Reason)
		if f.Tool != "" {
			ev.MCP.Refused = append(ev.MCP.Refused, f.Tool)
		}
	}
	// A message refused refuses its batch: the others are answered too,
	// not sent (the batch goes whole or not at all).
	var answers []json.RawMessage
	for _, m := range msgs {
		if !m.IsRequest() {
			continue
		}
		why := "not sent: another message of its batch was refused"
		for _, f := range refused {
			if bytes.Equal(f.ID, m.ID) && f.Method == m.Method {
				why = f.Reason
			}
		}
		answers = append(answers, mcp.ErrorFor(mcp.Refusal{ID: m.ID, Reason: why}))
	}
	body := mcpBody(answers, batch)
	if stream != nil && sseRefusal(cw, stream, body) {
		ev.Kind, ev.Reason = Refused, "mcp: "+strings.Join(reasons, "; ")+" (answered on its SSE stream)"
		return false
	}
	return mcpRefuse(cw, ev, http.StatusOK, body, strings.Join(reasons, "; "))
}

// mcpBody is the answers as one message or a batch (nil: none, for
// notifications).
func mcpBody(answers []json.RawMessage, batch bool) []byte {
	switch {
	case len(answers) == 0:
		return nil
	case !batch && len(answers) == 1:
		return answers[0]
	}
	b, _ := json.Marshal(answers)
	return b
}

// mcpRefuse answers a refused MCP request: with its JSON-RPC errors
// (status 200, as a server answers them), else a plain HTTP error.
func mcpRefuse(cw *countingWriter, ev *Event, status int, body []byte, why string) bool {
	ev.Kind, ev.Reason = Refused, "mcp: "+why
	switch {
	case body != nil:
		cw.Header().Set("Content-Type", "application/json")
		cw.WriteHeader(status)
		cw.Write(body)
	case status == http.StatusOK:
		// Only notifications: accepted, and not sent.
		cw.WriteHeader(http.StatusAccepted)
	default:
		http.Error(cw, "agentbox egress gateway: "+why, status)
	}
	return false
}

// mcpResponse filters what an MCP server answers: a JSON body read whole
// (bounded), server-sent events as they pass.
func (g *Gateway) mcpResponse(res *http.Response, body io.ReadCloser, m *mcpTap, name string) (io.ReadCloser, error) {
	ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	switch ct {
	case "text/event-stream":
		// A GET's stream may be the older SSE transport's: its
		// endpoint event names where the client's POSTs go.
		var stream *sseStream
		if res.Request.Method == http.MethodGet {
			stream = newSSEStream()
		}
		events := mcp.NewSSE(body, func(event string, data []byte) ([]byte, error) {
			if event == "endpoint" {
				// The client's POSTs go there (to this host: the same
				// rule decides them).
				if stream != nil {
					g.sse.register(name, res.Request.URL, data, stream)
				}
				return data, nil
			}
			out, hidden, seen, err := mcp.FilterAnswers(m.tools, data)
			if err != nil {
				return nil, fmt.Errorf("the MCP server sent an event the gateway does not read (%v): the stream is cut", err)
			}
			m.saw(hidden, seen.Asked)
			m.answered(seen.Answers)
			if stream != nil {
				stream.answered(seen.Answers)
			}
			return out, nil
		})
		if stream == nil {
			return readCloser{events, body}, nil
		}
		return newSSEMerge(events, body, stream, func() { g.sse.remove(stream); stream.end() }), nil
	case "application/json":
		if !m.rpc || res.StatusCode/100 != 2 {
			// Not an answer to JSON-RPC (an OAuth metadata document, an
			// HTTP error): the client reads no tools from it.
			return body, nil
		}
		raw, err := io.ReadAll(io.LimitReader(body, mcp.MaxMessage+1))
		if err != nil {
			return nil, err
		}
		if len(raw) > mcp.MaxMessage {
			return nil, fmt.Errorf("the MCP server's answer is over %d bytes: not read, so not passed", mcp.MaxMessage)
		}
		if len(bytes.TrimSpace(raw)) > 0 {
			out, hidden, seen, err := mcp.FilterAnswers(m.tools, raw)
			if err != nil {
				return nil, fmt.Errorf("the MCP server's answer is not one the gateway reads (%v): not passed", err)
			}
			m.saw(hidden, seen.Asked)
			m.answered(seen.Answers)
			raw = out
		}
		res.ContentLength = int64(len(raw))
		res.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		res.Header.Del("Transfer-Encoding")
		return readCloser{bytes.NewReader(raw), body}, nil
	}
	// Nothing a client reads as JSON-RPC (an empty 202, a plain error).
	return body, nil
}

// mcpUsage counts a sandbox's tools/call, by server and by server and
// tool ("HOST" and "HOST TOOL"), against its role's limits.mcp.
type mcpUsage struct {
	mu   sync.Mutex
	used map[string]int64
}

// take counts calls to host, or says which bound they would pass (and
// counts none).
func (u *mcpUsage) take(b policy.MCPBudget, host string, calls []mcp.Call) string {
	if b.Calls == 0 && len(b.Tools) == 0 || len(calls) == 0 {
		return ""
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.used == nil {
		u.used = map[string]int64{}
	}
	if b.Calls > 0 && u.used[host]+int64(len(calls)) > b.Calls {
		return fmt.Sprintf("the sandbox's MCP budget for %s is spent: %d of %d calls (limits.mcp.calls)", host, u.used[host], b.Calls)
	}
	per := map[string]int64{}
	for _, c := range calls {
		per[c.Tool]++
	}
	for tool, n := range per {
		if bound, ok := b.Tools[tool]; ok && u.used[host+" "+tool]+n > bound {
			return fmt.Sprintf("the sandbox's MCP budget for tool %s on %s is spent: %d of %d calls (limits.mcp.tools.%s)", clipName(tool), host, u.used[host+" "+tool], bound, clipName(tool))
		}
	}
	u.used[host] += int64(len(calls))
	for tool, n := range per {
		u.used[host+" "+tool] += n
	}
	return ""
}

// MCPUsage is what the sandbox's MCP calls used, by "HOST" and "HOST
// TOOL" (a checkpoint keeps it).
func (g *Gateway) MCPUsage() map[string]int64 {
	g.mcpUsed.mu.Lock()
	defer g.mcpUsed.mu.Unlock()
	return maps.Clone(g.mcpUsed.used)
}

// SetMCPUsage starts the count from what a checkpointed sandbox had used.
func (g *Gateway) SetMCPUsage(used map[string]int64) {
	g.mcpUsed.mu.Lock()
	defer g.mcpUsed.mu.Unlock()
	g.mcpUsed.used = maps.Clone(used)
}
