// Package egressev holds what the egress gateway and the pod's resolver
// decided, as they report it for the trail: their events' types, with no
// behaviour. The record builders (internal/egressrec) read them without
// importing the parts that dial, listen and enter namespaces.
package egressev

import (
	"net/netip"
	"time"

	"agentbox.dev/agentbox/internal/modelapi"
)

// Kind classifies an Event.
type Kind string

const (
	// Passthrough: a TLS connection allowed by its SNI and spliced to the
	// name's server; the agent verifies that server itself.
	Passthrough Kind = "passthrough"
	// WebSocketClosed: an allowed WebSocket ended (its opening is a
	// Request with status 101), with the bytes it carried and why.
	WebSocketClosed Kind = "websocket_closed"
	// Request: one HTTP request allowed by its Host and forwarded (plain
	// HTTP, or HTTPS the gateway terminated for an inspected rule).
	Request Kind = "request"
	// Refused: a connection or request the gateway did not forward.
	Refused Kind = "refused"
)

// Event is what the gateway did with one connection or request, for the
// trail. Names, paths and methods come from the sandbox: untrusted.
type Event struct {
	Kind Kind
	// Client is the agent's end of the connection.
	Client netip.AddrPort
	// Port is the gateway port the agent connected to: the port the
	// gateway dials.
	Port int
	// Proto is "tls" (passthrough), "http" or "https" (terminated).
	Proto string
	SNI   string
	// Host is an HTTP request's Host, without its port.
	Host string
	// Rule is the host rule that allowed it (or matched, for a refusal
	// after the rule: a failed lookup or dial).
	Rule string
	// Dialled is the address the gateway connected to.
	Dialled string
	// Method and Path of an HTTP request (the query's values scrubbed).
	Method, Path string
	// Status is the HTTP response status the agent got.
	Status int
	// Sent and Received count bytes from the agent and to it.
	Sent, Received int64
	Duration       time.Duration
	// Reason says why a refusal was one.
	Reason string
	// Injected names the headers the gateway set to a secret.
	Injected []string
	// KeyWait is how long the request waited for a key its sandbox's
	// claim gives; KeyNotGiven: the claim gave none within the bound (the
	// request went without it).
	KeyWait     time.Duration
	KeyNotGiven bool
	// Reflected are the injected secrets the response carried back,
	// replaced before the agent read them.
	Reflected []Reflection
	// Model is what a model host's request and response said (its rule
	// names an API); nil otherwise.
	Model *ModelCall
	// MCP is what the gateway read of a request to an MCP server (its
	// rule has api: mcp); nil otherwise.
	MCP *MCPEvent
	// Limit names the bound of the model budget that refused the
	// request (model_tokens, model_requests, model_requests_per_minute),
	// or that it could not account for (model_unaccounted).
	Limit string
}

// MCPEvent is what the gateway read of one request to an MCP server.
type MCPEvent struct {
	// Refused are the tools/call it answered itself (a tool the rule does
	// not allow, a spent budget), by tool.
	Refused []string
	// Hidden are the tools a tools/list result named that the agent did
	// not see.
	Hidden []string
	// Asked are the methods of the server's own requests to the client
	// (sampling/createMessage, elicitation/create, roots/list), passed.
	Asked []string
	// Each is every call let through, with what came back; Session and
	// Application are the request's Mcp-Session-Id and User-Agent.
	Each                 []MCPCallDone
	Session, Application string
}

// MCPCallDone is one tools/call the gateway let through.
type MCPCallDone struct {
	Tool string
	// Arguments are as the agent sent them (the record scrubs and bounds
	// them).
	Arguments string
	// Answered: a result or an error came back for it (ResultBytes its
	// size; IsError a JSON-RPC error, or a result with isError).
	Answered    bool
	ResultBytes int64
	IsError     bool
}

// Reflection counts the replacements of one spelling in one place.
type Reflection struct {
	// Where is "header NAME", "body" or "trailer NAME".
	Where string
	// Encoding is the spelling found (secretForm.Encoding).
	Encoding string
	Count    int
}

// ModelCall is a call to a model host, as the gateway read it on the way.
type ModelCall struct {
	API      modelapi.API
	Request  modelapi.Request
	Response modelapi.Response
	// Answered: a response came (its status is the Event's).
	Answered bool
	// FirstByte is the time from the request's arrival to the first byte
	// of its response's body.
	FirstByte time.Duration
	// Application is the client's User-Agent.
	Application string
	// Keep is what the record keeps (the plan's ModelAudit).
	Keep string
	// Endpoint is what the call called (modelapi.EndpointOf).
	Endpoint modelapi.Endpoint
	// Budgeted: a token budget bounded the call. It reserved Reserved
	// tokens before it went, and was charged Charged once done.
	Budgeted          bool
	Reserved, Charged int64
	// CapSet is the output cap the gateway set on a call that named none
	// (0: it named one, or no token budget bounded it).
	CapSet int64
}
