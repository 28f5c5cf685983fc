package audit

import "time"

// RecordType is one kind of record agentbox writes of its own. Its Name is
// an external contract (SIEM rules match on it): every type is defined
// once, here, with its OCSF class and activity, and listed in the README.
type RecordType struct {
	Name     string
	Class    int
	Activity string
	// About says when the record is written.
	About string
}

// New makes a record of this type.
func (t RecordType) New(status, msg string, detail map[string]string) *Record {
	r := NewRecord(time.Now(), t.Class, 99, t.Activity, t.Name)
	r.Status, r.Message, r.Detail = status, msg, detail
	return r
}

// The record types, in the order a sandbox's life writes them.
var (
	TypeRoleResolved     = RecordType{"agentbox/role_resolved", ClassBase, "Role Resolved", "the role a sandbox runs under, and the request that claimed it"}
	TypeRefused          = RecordType{"agentbox/refused", ClassBase, "Refused", "a sandbox refused before it ran, with the reason"}
	TypeEgressApplied    = RecordType{"agentbox/egress_applied", ClassBase, "Egress Rules Applied", "the egress rules and resolver a pod got"}
	TypeProfileApplied   = RecordType{"agentbox/profile_applied", ClassBase, "Profile Applied", "the profile's summary, spec changes and runsc flags"}
	TypeSandboxFailed    = RecordType{"agentbox/sandbox_failed", ClassBase, "Sandbox Failed", "runsc could not create the sandbox, or its audit session did not start"}
	TypeContainerCreated = RecordType{"agentbox/container_created", ClassBase, "Container Created", "a container joined a pod's sandbox"}
	TypeContainerFailed  = RecordType{"agentbox/container_failed", ClassBase, "Container Failed", "a container of a pod could not be created"}
	TypeContainerStart   = RecordType{"agentbox/container_start", ClassBase, "Container Start", "a container started (for a sandbox: its wall clock armed)"}
	TypeExec             = RecordType{"agentbox/exec", ClassBase, "Exec Request", "an exec into a container, with its scrubbed argv"}
	TypeExecRefused      = RecordType{"agentbox/exec_refused", ClassBase, "Exec Refused", "an exec refused, with the reason"}
	TypeExecStart        = RecordType{"agentbox/exec_start", ClassBase, "Exec Start", "an exec started"}
	TypeDNSAnswered      = RecordType{"agentbox/dns_answered", ClassBase, "DNS Answered", "an allowed name answered, with the addresses opened and for how long"}
	TypeDNSRefused       = RecordType{"agentbox/dns_refused", ClassBase, "DNS Refused", "a name or query the role does not allow"}
	TypeDNSFailed        = RecordType{"agentbox/dns_failed", ClassBase, "DNS Failed", "an allowed name the resolver could not answer (SERVFAIL)"}
	TypeDNSMalformed     = RecordType{"agentbox/dns_malformed", ClassBase, "DNS Malformed", "a packet to the resolver that is not a query"}
	TypeDNSWithheld      = RecordType{"agentbox/dns_address_withheld", ClassBase, "DNS Address Withheld", "an answered address a rule may not open (private, node, cluster)"}
	TypeEgressRequest    = RecordType{"agentbox/egress_request", ClassNetwork, "Egress Request", "an HTTP request the egress gateway allowed by its Host and forwarded: host, method, path (query values scrubbed), status, bytes, duration, rule"}
	TypeEgressConnection = RecordType{"agentbox/egress_connection", ClassNetwork, "Egress Connection", "a TLS connection the egress gateway allowed by its SNI and spliced: SNI, address dialled, bytes, duration, rule"}
	TypeEgressRefused    = RecordType{"agentbox/egress_refused", ClassNetwork, "Egress Refused", "a connection or request the egress gateway refused, with the reason (the name, no SNI, neither TLS nor HTTP, a failed lookup)"}
	TypeGatewayStopped   = RecordType{"agentbox/gateway_stopped", ClassBase, "Egress Gateway Stopped", "the pod's egress gateway stopped, with the connections it rejected for its bound"}
	TypeEgressDenied     = RecordType{"agentbox/egress_denied", ClassBase, "Egress Denied", "a packet the egress rules dropped, as the kernel logged it"}
	TypeEgressDrops      = RecordType{"agentbox/egress_drops", ClassBase, "Egress Drops", "the drop rules' counters at the root's exit"}
	TypeLimit            = RecordType{"agentbox/limit", ClassBase, "Limit Hit", "a limit stopped the sandbox: wall clock, memory, audit"}
	TypeAuditFull        = RecordType{"agentbox/audit_full", ClassBase, "Audit Trail Full", "the sandbox's records stopped fitting: it is held back"}
	TypeContainerExit    = RecordType{"agentbox/container_exit", ClassBase, "Container Exit", "a container exited, with its status"}
	TypeContainerDeleted = RecordType{"agentbox/container_deleted", ClassBase, "Container Deleted", "a container of a pod was deleted"}
	TypeResolverStopped  = RecordType{"agentbox/resolver_stopped", ClassBase, "Resolver Stopped", "the pod's resolver stopped and its link removed"}
	TypeEgressRemoved    = RecordType{"agentbox/egress_removed", ClassBase, "Egress Rules Removed", "the pod's egress rules removed"}
	TypeAnomaly          = RecordType{"agentbox/anomaly", ClassBase, "Anomaly", "a malformed, oversized or out-of-order message from the sandbox"}
	TypePolicySnapshot   = RecordType{"agentbox/policy_snapshot", ClassBase, "Policy Snapshot Applied", "a node's trail: the cluster's policy objects became the node's snapshot, with the old and new digest and what changed"}
	TypePolicyRefused    = RecordType{"agentbox/policy_refused", ClassBase, "Policy Snapshot Refused", "a node's trail: the newest set of policy objects does not load, and the node keeps its snapshot"}
	TypeGap              = RecordType{EventGap, ClassBase, "Gap", "events that were not recorded, by reason"}
	TypeSandboxEnd       = RecordType{EventSandboxEnd, ClassBase, "Sandbox End", "the trail's last record, with its totals"}
)

// Catalog lists every record type of agentbox's own.
var Catalog = []RecordType{
	TypeRoleResolved, TypeRefused, TypeEgressApplied, TypeProfileApplied, TypeSandboxFailed,
	TypeContainerCreated, TypeContainerFailed, TypeContainerStart, TypeExec, TypeExecRefused, TypeExecStart,
	TypeDNSAnswered, TypeDNSRefused, TypeDNSFailed, TypeDNSMalformed, TypeDNSWithheld,
	TypeEgressRequest, TypeEgressConnection, TypeEgressRefused, TypeGatewayStopped, TypeEgressDenied, TypeEgressDrops, TypeLimit, TypeAuditFull, TypeContainerExit, TypeContainerDeleted,
	TypeResolverStopped, TypeEgressRemoved, TypeAnomaly, TypePolicySnapshot, TypePolicyRefused, TypeGap, TypeSandboxEnd,
}
