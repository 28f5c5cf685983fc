// Package audit is a sandbox's tamper-evident audit trail: its records
// (OCSF, encoded without reflection), joined with the pod, role and policy,
// scrubbed of secrets, chained by hash and written to the node's files
// within their budget, recording every event it could not keep; and the
// verifier that checks a trail later.
//
// Two packages feed and drain it: internal/audit/ingest receives gVisor's
// Sentry events over a per-sandbox socket (untrusted input) and turns them
// into records (the only code that reads gVisor's protos), and
// internal/audit/forward sends what the trail wrote to a webhook or an
// OpenTelemetry collector. This package imports neither, nor any other
// agentbox package but internal/version.
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// SchemaVersion is the OCSF schema the records conform to: 1.9.0-dev,
// the first with the ai_agent object (under the ai_operation profile) and
// the record_integrity profile, whose attestation carries the hash chain.
// internal/ocsf validates the records against a copy of that schema.
const SchemaVersion = "1.9.0-dev"

// The OCSF classes agentbox writes (class_uid), each with its category.
const (
	ClassBase             = 0    // Base Event (legacy trails only)
	ClassFileSystem       = 1001 // File System Activity
	ClassProcess          = 1007 // Process Activity
	ClassEventLog         = 1008 // Event Log Activity: the trail's own gaps, fill and end
	ClassDetectionFinding = 2004 // Detection Finding: anomalies from the sandbox
	ClassAuthorizeSession = 3003 // Authorize Session: the role a sandbox is given
	ClassNetwork          = 4001 // Network Activity
	ClassHTTP             = 4002 // HTTP Activity: the egress gateway's requests
	ClassDNS              = 4003 // DNS Activity: the pod resolver's decisions
	ClassAppLifecycle     = 6002 // Application Lifecycle: the sandbox and its containers
	ClassRemediation      = 7001 // Remediation Activity: an admin's quarantine, freeze or stop
)

type classInfo struct {
	name, category string
	categoryUID    int
}

var classes = map[int]classInfo{
	ClassBase:             {"Base Event", "Uncategorized", 0},
	ClassFileSystem:       {"File System Activity", "System Activity", 1},
	ClassProcess:          {"Process Activity", "System Activity", 1},
	ClassEventLog:         {"Event Log Activity", "System Activity", 1},
	ClassDetectionFinding: {"Detection Finding", "Findings", 2},
	ClassAuthorizeSession: {"Authorize Session", "Identity & Access Management", 3},
	ClassNetwork:          {"Network Activity", "Network Activity", 4},
	ClassHTTP:             {"HTTP Activity", "Network Activity", 4},
	ClassDNS:              {"DNS Activity", "Network Activity", 4},
	ClassAppLifecycle:     {"Application Lifecycle", "Application Activity", 6},
	ClassRemediation:      {"Remediation Activity", "Remediation", 7},
}

// Severities (severity_id) agentbox uses.
const (
	SeverityInformational = 1
	SeverityLow           = 2 // a refusal or denial: the boundary held
	SeverityMedium        = 3 // a limit hit, an anomaly, records lost
)

var severityNames = map[int]string{0: "Unknown", 1: "Informational", 2: "Low", 3: "Medium", 4: "High"}

// Record is one audit record: one JSON object per line.
type Record struct {
	Time         string `json:"time"`
	ClassUID     int    `json:"class_uid"`
	ClassName    string `json:"class_name"`
	ActivityID   int    `json:"activity_id"`
	ActivityName string `json:"activity_name"`
	// Status is Success or Failure; Errno is set on failure.
	Status string `json:"status,omitempty"`
	Errno  int64  `json:"errno,omitempty"`
	// Result is a syscall's return value where it means something (an fd).
	Result  *int64    `json:"result,omitempty"`
	Process *Process  `json:"process,omitempty"`
	File    *File     `json:"file,omitempty"`
	Dst     *Endpoint `json:"dst_endpoint,omitempty"`
	// Src is the sandbox's end of a connection, where it is known (a
	// connect's local address; the client a gateway accepted).
	Src     *Endpoint `json:"src_endpoint,omitempty"`
	Message string    `json:"message,omitempty"`
	// Event names the source: a gVisor point ("syscall/openat"), or the
	// shim's own ("agentbox/role_resolved", "agentbox/gap", ...).
	Event string `json:"event"`
	// Counts carries numbers of gap and end records (received, written,
	// dropped...).
	Counts map[string]uint64 `json:"counts,omitempty"`
	Detail map[string]string `json:"detail,omitempty"`

	// Target is a second path: a rename's new name, a link's new name, a
	// symlink's target.
	Target *File `json:"target,omitempty"`
	// Model is a model call's (agentbox/model_call): OCSF's ai_operation
	// profile carries the model and the tokens, the rest is unmapped.
	Model *ModelCall `json:"model,omitempty"`
	// MCP is a tools/call to a remote MCP server (agentbox/mcp_call).
	MCP *MCPCall `json:"mcp,omitempty"`
	// Severity is an OCSF severity_id (0 is Informational).
	Severity int `json:"severity_id,omitempty"`

	Sandbox   string `json:"sandbox_id"`
	Container string `json:"container_id,omitempty"`
	// Namespace is the containerd namespace the sandbox runs in.
	Namespace    string `json:"namespace,omitempty"`
	PodNamespace string `json:"pod_namespace,omitempty"`
	PodName      string `json:"pod_name,omitempty"`
	Role         string `json:"role,omitempty"`
	PolicyDigest string `json:"policy_digest,omitempty"`
	// Claim and WarmPool: the task the sandbox works for, or the warm pool
	// holding it (Meta's).
	Claim    *Claim `json:"claim,omitempty"`
	WarmPool string `json:"warm_pool,omitempty"`

	Seq      uint64 `json:"seq"`
	PrevHash string `json:"prev_hash"`

	// at is Time before formatting (for ordering checks).
	at time.Time
	// joined: Process, on a record of the shim's own, is the sandbox
	// process it is about (ConnectIndex.Emit), and so its actor.
	joined bool
}

// Claim is the agent-sandbox SandboxClaim a sandbox works for, in its
// pod's namespace, and the task's identity the claim names. Never changed
// once made: a new claim is a new Claim.
type Claim struct {
	Name    string `json:"name"`
	UID     string `json:"uid"`
	Subject string `json:"subject,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	Task    string `json:"task,omitempty"`
}

// Process is the actor.
type Process struct {
	PID     int32    `json:"pid,omitempty"`
	TID     int32    `json:"tid,omitempty"`
	PPID    int32    `json:"ppid,omitempty"`
	Name    string   `json:"name,omitempty"`
	Argv    []string `json:"argv,omitempty"`
	Env     []string `json:"env,omitempty"`
	Exe     string   `json:"exe,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	UID     *uint32  `json:"uid,omitempty"`
	GID     *uint32  `json:"gid,omitempty"`
	ExitSts *int32   `json:"exit_status,omitempty"`
	// ExitSignal is the signal that killed the process.
	ExitSignal *int32 `json:"exit_signal,omitempty"`
	// ChildPID is the new process or thread of a clone.
	ChildPID int32 `json:"child_pid,omitempty"`
}

// File is the object of a file activity.
type File struct {
	Path  string `json:"path"`
	Flags string `json:"flags,omitempty"`
	Mode  uint32 `json:"mode,omitempty"`
}

// Endpoint is a network address.
type Endpoint struct {
	Family string `json:"family,omitempty"`
	IP     string `json:"ip,omitempty"`
	Port   int    `json:"port,omitempty"`
	Path   string `json:"path,omitempty"`
	// Type is the socket type for socket(2) (stream, dgram...).
	Type string `json:"type,omitempty"`
}

// At is when the record's event happened (zero: not known yet; the trail
// stamps it when it is emitted).
func (r *Record) At() time.Time { return r.at }

// Stamp sets when the record's event happened (a record replayed or
// built for a test; the trail stamps the shim's own when they are emitted).
func (r *Record) Stamp(t time.Time) { r.at = t }

// NewRecord starts a record of a class at t; its time is formatted when it
// is encoded.
func NewRecord(t time.Time, class, activity int, activityName, event string) *Record {
	return &Record{
		at:           t, // Time is formatted when the record is encoded
		ClassUID:     class,
		ClassName:    classes[class].name,
		ActivityID:   activity,
		ActivityName: activityName,
		Event:        event,
	}
}

// Chain sequences records and links each to the previous one's hash. It is
// not safe for concurrent use.
type Chain struct {
	seq  uint64
	prev string
}

// Seal numbers r as the next record, links it to the last committed one,
// and returns its JSON line (with a trailing newline) and hash. The line
// is an OCSF event whose attestation (record_integrity profile) names the
// chain (the sandbox), the record and the previous record's fingerprint;
// its own fingerprint, the SHA-256 of the line without that fingerprint,
// closes the line. Seal does not advance the chain: Commit does, once the
// line is written, so a record that could not be written leaves no hole in
// the chain (a gap record accounts for it instead).
func (c *Chain) Seal(r *Record) ([]byte, string, error) {
	line, hash := c.SealAppend(nil, r)
	return line, hash, nil
}

// SealAppend is Seal appending the line to dst.
func (c *Chain) SealAppend(dst []byte, r *Record) ([]byte, string) {
	r.Seq = c.seq + 1
	r.PrevHash = c.prev
	start := len(dst)
	dst = r.appendOCSF(dst)
	dst = append(dst, attestationEnd...)
	sum := sha256.Sum256(dst[start:])
	dst = dst[:len(dst)-len(attestationEnd)]
	dst = append(dst, fingerprintPrefix...)
	var h [64]byte
	hex.Encode(h[:], sum[:])
	dst = append(dst, h[:]...)
	dst = append(dst, fingerprintSuffix...)
	dst = append(dst, '\n')
	return dst, string(h[:])
}

// Commit advances the chain past a sealed record.
func (c *Chain) Commit(hash string) {
	c.seq++
	c.prev = hash
}

// Seq is the last sequence number sealed.
func (c *Chain) Seq() uint64 { return c.seq }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// MCPCall is a tools/call the egress gateway passed to a remote MCP
// server, and what came back. The server, the client and the tool go to
// OCSF's message_context (the ai_operation profile), the session as its
// uid; the rest, under unmapped.mcp.
type MCPCall struct {
	Server string `json:"server"`
	Tool   string `json:"tool"`
	// Arguments are the call's arguments, scrubbed like argv and
	// bounded.
	Arguments   string `json:"arguments,omitempty"`
	Session     string `json:"session,omitempty"`
	Application string `json:"application,omitempty"`
	// Answered: a result or an error came back for the call; ResultBytes
	// is the result's size, IsError whether it was an error (a JSON-RPC
	// error, or a result with isError).
	Answered    bool  `json:"answered"`
	ResultBytes int64 `json:"result_bytes"`
	IsError     bool  `json:"is_error"`
}

// ModelCall is what the egress gateway read of a call to a model host.
// Name, Provider, Application and the token counts go to OCSF's ai_model
// and message_context; the rest, under unmapped.model.
type ModelCall struct {
	// Name is the model that answered (or, without an answer, the one
	// asked for); Provider its vendor (OCSF ai_provider).
	Name        string `json:"-"`
	Provider    string `json:"-"`
	Application string `json:"-"` // the client's User-Agent
	// Tokens are the response's own counts (nil: it gave none).
	Tokens *Tokens `json:"-"`
	// API is the host rule's (anthropic, openai, gemini).
	API        string `json:"api"`
	Requested  string `json:"requested_model,omitempty"`
	Stream     bool   `json:"stream,omitempty"`
	StopReason string `json:"stop_reason,omitempty"`
	// FirstByteMS is the time from the request to its response's first
	// byte, in milliseconds.
	FirstByteMS float64 `json:"first_byte_ms,omitempty"`
	Events      int     `json:"events,omitempty"`
	// RequestDigest is the SHA-256 of the request body (what the model
	// was sent), RequestBytes its size.
	RequestDigest string `json:"request_digest,omitempty"`
	RequestBytes  int64  `json:"request_bytes,omitempty"`
	// RequestContent is the end of what the model was sent, scrubbed,
	// when the role asks for it (audit.model: content); ContentCut says
	// it is not the whole. Keep is the role's audit.model.
	RequestContent string     `json:"request_content,omitempty"`
	ContentCut     bool       `json:"request_content_cut,omitempty"`
	Keep           string     `json:"kept,omitempty"`
	ToolCalls      []ToolCall `json:"tool_calls,omitempty"`
	// Error is the API's error message; Problem what the gateway could
	// not read (counts may then be partial).
	Error   string `json:"error,omitempty"`
	Problem string `json:"problem,omitempty"`
	// Endpoint is what the call called ("messages", "embeddings"...).
	Endpoint string `json:"endpoint,omitempty"`
	// Budget is what a token budget reserved for the call and charged it
	// (nil: no token budget bounded it).
	Budget *ModelCharge `json:"budget,omitempty"`
}

// ModelCharge is a budgeted call's reservation and charge: the output cap
// the gateway set on it when it named none (CapSet), and what it was
// charged once done (its final usage, or its reservation when that could
// not be read).
type ModelCharge struct {
	Reserved int64 `json:"reserved_tokens"`
	Charged  int64 `json:"charged_tokens"`
	CapSet   int64 `json:"cap_set,omitempty"`
}

// Tokens are a model call's token counts.
type Tokens struct {
	Prompt, Completion, Total int64
}

// ToolCall is a tool the model asked the agent to run: its input is
// scrubbed like argv and cut to a bound (Truncated).
type ToolCall struct {
	ID        string `json:"id,omitempty"`
	Name      string `json:"name"`
	Input     string `json:"input,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}
