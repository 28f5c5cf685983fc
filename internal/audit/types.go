package audit

import "time"

// RecordType is one kind of record agentbox writes of its own. Its Name is
// an external contract (SIEM rules match on it): every type is defined
// once, here, with its OCSF class and activity, and listed in docs/audit.md.
type RecordType struct {
	Name  string
	Class int
	// ActivityID is the class's activity; Activity its caption, or for
	// Other (99) agentbox's own label.
	ActivityID int
	Activity   string
	// Severity is the OCSF severity_id (Informational when 0).
	Severity int
	// About says when the record is written.
	About string
}

// New makes a record of this type.
func (t RecordType) New(status, msg string, detail map[string]string) *Record {
	r := NewRecord(time.Now(), t.Class, t.ActivityID, t.Activity, t.Name)
	r.Status, r.Message, r.Detail, r.Severity = status, msg, detail, t.Severity
	return r
}

const (
	info   = SeverityInformational
	low    = SeverityLow
	medium = SeverityMedium
)

// The record types, in the order a sandbox's life writes them.
var (
	TypeRestored         = RecordType{"agentbox/restored", ClassAppLifecycle, 5, "Restart", info, "the first record of a sandbox restored from a checkpoint: the checkpoint, its image digest, the sandbox it was taken of and the last record of that sandbox's trail (agentbox audit verify follows the link)"}
	TypeRoleResolved     = RecordType{"agentbox/role_resolved", ClassAuthorizeSession, 3, "Assign Roles", info, "the role a sandbox runs under, and the request that claimed it"}
	TypeRefused          = RecordType{"agentbox/refused", ClassAppLifecycle, 3, "Start", low, "a sandbox refused before it ran, with the reason"}
	TypeEgressApplied    = RecordType{"agentbox/egress_applied", ClassAppLifecycle, 6, "Enable", info, "the egress rules and resolver a pod got"}
	TypeProfileApplied   = RecordType{"agentbox/profile_applied", ClassAppLifecycle, 6, "Enable", info, "the profile's summary, spec changes and runsc flags"}
	TypeSandboxFailed    = RecordType{"agentbox/sandbox_failed", ClassAppLifecycle, 3, "Start", low, "runsc could not create or start the sandbox, or its audit session did not start"}
	TypeContainerCreated = RecordType{"agentbox/container_created", ClassAppLifecycle, 1, "Install", info, "a container joined a pod's sandbox"}
	TypeContainerFailed  = RecordType{"agentbox/container_failed", ClassAppLifecycle, 1, "Install", low, "a container of a pod could not be created"}
	TypeContainerStart   = RecordType{"agentbox/container_start", ClassAppLifecycle, 3, "Start", info, "a container started (for a sandbox: its wall clock armed)"}
	TypeExec             = RecordType{"agentbox/exec", ClassProcess, 1, "Launch", info, "an exec into a container, with its scrubbed argv"}
	TypeExecRefused      = RecordType{"agentbox/exec_refused", ClassProcess, 1, "Launch", low, "an exec refused, with the reason"}
	TypeExecStart        = RecordType{"agentbox/exec_start", ClassProcess, 1, "Launch", info, "an exec started"}
	TypeDNSAnswered      = RecordType{"agentbox/dns_answered", ClassDNS, 2, "Response", info, "an allowed name answered, with the addresses opened and for how long"}
	TypeDNSRefused       = RecordType{"agentbox/dns_refused", ClassDNS, 2, "Response", low, "a name or query the role does not allow"}
	TypeDNSFailed        = RecordType{"agentbox/dns_failed", ClassDNS, 2, "Response", info, "an allowed name the resolver could not answer (SERVFAIL)"}
	TypeDNSMalformed     = RecordType{"agentbox/dns_malformed", ClassDNS, 1, "Query", low, "a packet to the resolver that is not a query"}
	TypeDNSWithheld      = RecordType{"agentbox/dns_address_withheld", ClassDNS, 2, "Response", low, "an answered address a rule may not open (private, node, cluster)"}
	TypeEgressRequest    = RecordType{"agentbox/egress_request", ClassHTTP, 99, "Egress Request", info, "an HTTP request the egress gateway allowed by its Host and forwarded: host, method, path (query values scrubbed), status, bytes, duration, rule"}
	TypeModelLimit       = RecordType{"agentbox/model_limit", ClassHTTP, 99, "Model Limit", medium, "a call to a model host the role's model budget (limits.model) refused: which bound and why; the client got the vendor's own 429 answer"}
	TypeMCPCall          = RecordType{"agentbox/mcp_call", ClassHTTP, 99, "MCP Call", info, "a tools/call the egress gateway passed to a remote MCP server (a host rule with api: mcp), and what came back (OCSF ai_operation's message_context, the tool as its name and the session as its uid): the server, the tool, its arguments scrubbed like argv and bounded, the client, whether it was answered, the result's size and whether it was an error"}
	TypeModelCall        = RecordType{"agentbox/model_call", ClassHTTP, 99, "Model Call", info, "a request to a model host (a host rule with api:), forwarded as an egress request is, with what the gateway read of it (OCSF ai_operation): the model and its provider, the prompt, completion and total tokens the response counted, the stop reason, the time to the first byte, the tool calls the model asked for (inputs scrubbed and bounded), the client (User-Agent) and the request body's digest"}
	TypeEgressConnection = RecordType{"agentbox/egress_connection", ClassNetwork, 6, "Traffic", info, "a TLS connection the egress gateway allowed by its SNI and spliced: SNI, address dialled, bytes, duration, rule"}
	TypeEgressRefused    = RecordType{"agentbox/egress_refused", ClassNetwork, 5, "Refuse", low, "a connection or request the egress gateway refused, with the reason (the name, no SNI, neither TLS nor HTTP, a failed lookup)"}
	TypeWebSocketClosed  = RecordType{"agentbox/websocket_closed", ClassNetwork, 2, "Close", info, "an allowed WebSocket through the egress gateway ended (its opening is an egress_request with status 101): bytes each way, duration, address dialled, and why (idle, the role changed, quarantine, an end closed it)"}
	TypeSecretReflected  = RecordType{"agentbox/secret_reflected", ClassHTTP, 99, "Secret Reflected", medium, "a response of a host a secret is injected for carried the secret back (echoed, in a header or the body, raw or encoded): the gateway replaced it before the agent read it; host, path, where, encoding and count, never the value"}
	TypePortForward      = RecordType{"agentbox/port_forward", ClassNetwork, 2, "Close", info, "a connection of the node's port-forward (kubectl or crictl port-forward, agent-sandbox's SDK) to a port the role's network.portForward names, at its end: the port, bytes each way, duration; one the sandbox did not take is a failure, with the reason"}
	TypeGatewayStopped   = RecordType{"agentbox/gateway_stopped", ClassAppLifecycle, 4, "Stop", info, "the pod's egress gateway stopped, with the connections it rejected for its bound"}
	TypeEgressDenied     = RecordType{"agentbox/egress_denied", ClassNetwork, 5, "Refuse", low, "a packet the egress rules dropped, as the kernel logged it"}
	TypeEgressDrops      = RecordType{"agentbox/egress_drops", ClassNetwork, 6, "Traffic", info, "the drop rules' counters at the root's exit"}
	TypeLimit            = RecordType{"agentbox/limit", ClassAppLifecycle, 4, "Stop", medium, "a limit stopped the sandbox: wall clock, memory, audit"}
	TypeAuditFull        = RecordType{"agentbox/audit_full", ClassEventLog, 99, "Audit Trail Full", medium, "the sandbox's records stopped fitting: it is held back"}
	TypeContainerExit    = RecordType{"agentbox/container_exit", ClassAppLifecycle, 4, "Stop", info, "a container exited, with its status"}
	TypeContainerDeleted = RecordType{"agentbox/container_deleted", ClassAppLifecycle, 2, "Remove", info, "a container of a pod was deleted"}
	TypeResolverStopped  = RecordType{"agentbox/resolver_stopped", ClassAppLifecycle, 4, "Stop", info, "the pod's resolver stopped and its link removed"}
	TypeEgressRemoved    = RecordType{"agentbox/egress_removed", ClassAppLifecycle, 7, "Disable", info, "the pod's egress rules removed"}
	TypeAnomaly          = RecordType{"agentbox/anomaly", ClassDetectionFinding, 1, "Create", medium, "a malformed, oversized or out-of-order message from the sandbox"}
	TypePolicySnapshot   = RecordType{"agentbox/policy_snapshot", ClassAppLifecycle, 8, "Update", info, "a node's trail: the cluster's policy objects became the node's snapshot, with the old and new digest and what changed"}
	TypePolicyRefused    = RecordType{"agentbox/policy_refused", ClassAppLifecycle, 8, "Update", low, "a node's trail: the newest set of policy objects does not load, and the node keeps its snapshot"}
	TypePolicyTightened  = RecordType{"agentbox/policy_tightened", ClassAppLifecycle, 8, "Update", info, "a running sandbox's role changed and it took what tightens it (egress rules removed or narrowed): the new digest, what was applied, what is pending for new sandboxes"}
	TypePolicyPending    = RecordType{"agentbox/policy_pending", ClassAppLifecycle, 8, "Update", info, "a running sandbox's role changed in a way that does not tighten it (it loosens, or cannot change live): applies to new sandboxes only"}
	TypeQuarantined      = RecordType{"agentbox/quarantined", ClassRemediation, 1, "Isolate", medium, "an admin cut the sandbox's egress (agentbox sandbox quarantine): the reason, who asked, the egress before and after, what was cut"}
	TypeReleased         = RecordType{"agentbox/released", ClassRemediation, 3, "Restore", info, "a quarantine lifted: the role's egress rules back, who asked"}
	TypeFrozen           = RecordType{"agentbox/frozen", ClassRemediation, 1, "Isolate", medium, "an admin paused the whole sandbox (agentbox sandbox freeze), or a failed quarantine froze it: the reason, who asked"}
	TypeThawed           = RecordType{"agentbox/thawed", ClassRemediation, 3, "Restore", info, "a frozen sandbox resumed, with how long it was frozen"}
	TypeCheckpointed     = RecordType{"agentbox/checkpointed", ClassAppLifecycle, 99, "Checkpoint", info, "gVisor wrote the sandbox's memory into the node's checkpoint store (agentbox sandbox checkpoint or suspend, ctr task checkpoint): the checkpoint's name, whether the sandbox was stopped after, who asked; a restored sandbox's trail links to this record"}
	TypeCheckpointShared = RecordType{"agentbox/checkpoint_shared", ClassAppLifecycle, 99, "Checkpoint", info, "a suspend's image written to the cluster's shared store, encrypted with the cluster's checkpoint key: the checkpoint, the bytes and the time; a failure says why (the image stays on its node). A restore that takes an image from there says so in its agentbox/restored record (shared_store)"}
	TypeCheckpointFailed = RecordType{"agentbox/checkpoint_failed", ClassAppLifecycle, 99, "Checkpoint", low, "a checkpoint was asked for and not made, with the reason"}
	TypeStopped          = RecordType{"agentbox/stopped", ClassRemediation, 2, "Evict", medium, "an admin stopped the sandbox (agentbox sandbox stop), or a failed quarantine did: every container killed, the reason, who asked"}
	TypeSecretRotated    = RecordType{"agentbox/secret_rotated", ClassAppLifecycle, 8, "Update", info, "an injected secret's source changed on the node (a rotated Kubernetes Secret, a rewritten file): the gateway's next requests carry the new value; host, header and source, never the value. A source that cannot be read is recorded as a failure, and the value the gateway had stays"}
	TypeOwner            = RecordType{"agentbox/owner", ClassAppLifecycle, 8, "Update", info, "the node agent named the kubernetes-sigs/agent-sandbox Sandbox the pod belongs to, and what holds it (the SandboxClaim that claimed it, or the SandboxWarmPool keeping it warm), as the API server says: names and UIDs; from this record on, every record carries the claim and the task it names (agentbox.dev/subject, tenant, task, read by the broker; claim_keys names the keys the claim gives, which the gateway injects from this record on, never a value; claim_refused says why none was bound), or the warm pool"}
	TypeGap              = RecordType{EventGap, ClassEventLog, 99, "Gap", medium, "events that were not recorded, by reason"}
	TypeSandboxEnd       = RecordType{EventSandboxEnd, ClassEventLog, 7, "Stop", info, "the trail's last record, with its totals"}
)

// Catalog lists every record type of agentbox's own.
var Catalog = []RecordType{
	TypeRoleResolved, TypeRefused, TypeEgressApplied, TypeProfileApplied, TypeSandboxFailed,
	TypeContainerCreated, TypeContainerFailed, TypeContainerStart, TypeExec, TypeExecRefused, TypeExecStart,
	TypeDNSAnswered, TypeDNSRefused, TypeDNSFailed, TypeDNSMalformed, TypeDNSWithheld,
	TypeEgressRequest, TypeModelCall, TypeMCPCall, TypeModelLimit, TypeEgressConnection, TypeEgressRefused, TypeWebSocketClosed, TypeSecretReflected, TypePortForward, TypeGatewayStopped, TypeEgressDenied, TypeEgressDrops, TypeLimit, TypeAuditFull, TypeContainerExit, TypeContainerDeleted,
	TypeResolverStopped, TypeEgressRemoved, TypeAnomaly, TypePolicySnapshot, TypePolicyRefused,
	TypePolicyTightened, TypePolicyPending, TypeQuarantined, TypeReleased, TypeFrozen, TypeThawed, TypeCheckpointed, TypeCheckpointShared, TypeCheckpointFailed, TypeRestored, TypeStopped, TypeOwner, TypeSecretRotated, TypeGap, TypeSandboxEnd,
}

// typeByName finds a record type by its name.
var typeByName = func() map[string]RecordType {
	m := map[string]RecordType{}
	for _, t := range Catalog {
		m[t.Name] = t
	}
	return m
}()

// Points selects the event families a role records.
type Points struct {
	Process bool
	File    bool
	Network bool
}
