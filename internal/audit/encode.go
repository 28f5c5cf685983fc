package audit

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/version"
)

func errnoName(n int64) string {
	if name := unix.ErrnoName(unix.Errno(n)); name != "" {
		return name
	}
	return "errno " + strconv.FormatInt(n, 10)
}

// ocsfProfiles are the OCSF profiles every record applies.
var ocsfProfiles = []string{"host", "datetime", "security_control", "ai_operation", "record_integrity"}

// aiOperationCategories are the categories whose classes take the
// ai_operation profile's top-level ai_agent.
var aiOperationCategories = map[int]bool{1: true, 3: true, 4: true, 6: true}

// Node is the device every record names: the node the shim runs on.
var Node = func() string { h, _ := os.Hostname(); return h }()

// The parts of a record that do not change with it, encoded once.
var (
	metadataHead = `,"metadata":{"version":"` + SchemaVersion + `","product":{"name":"agentbox","vendor_name":"agentbox","version":` +
		string(appendString(nil, version.Version)) + `},"uid":`
	metadataTail = func() string {
		b := []byte(`,"log_name":"agentbox audit trail","profiles":[`)
		for i, p := range ocsfProfiles {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, p)
		}
		return string(b) + "]}"
	}()
	classHeaders = func() map[int]string {
		m := map[int]string{}
		for uid, ci := range classes {
			b := []byte(`,"class_uid":` + strconv.Itoa(uid) + `,"class_name":`)
			b = appendString(b, ci.name)
			b = append(b, `,"category_uid":`+strconv.Itoa(ci.categoryUID)+`,"category_name":`...)
			b = appendString(b, ci.category)
			m[uid] = string(b)
		}
		return m
	}()
	deviceMu              sync.Mutex
	deviceFor, deviceJSON string
)

func classHeader(uid int) string {
	if h, ok := classHeaders[uid]; ok {
		return h
	}
	return `,"class_uid":` + strconv.Itoa(uid)
}

// deviceBlock is the device object for Node (which tests may change).
func deviceBlock() string {
	deviceMu.Lock()
	defer deviceMu.Unlock()
	if deviceJSON == "" || deviceFor != Node {
		deviceFor = Node
		deviceJSON = `,"device":{"type_id":1,"type":"Server","hostname":` + string(appendString(nil, orUnknown(Node))) + `}`
	}
	return deviceJSON
}

// appendOCSF encodes r as an OCSF event of its class, without reflection
// (the receiver's hot path), up to and including its attestation's
// prev_event: the caller closes the attestation, with or without its
// fingerprint. FuzzEncode checks that ParseLine gives r back.
func (r *Record) appendOCSF(b []byte) []byte {
	e := enc{b: append(b, '{')}
	t := r.at
	if t.IsZero() && r.Time != "" {
		t, _ = time.Parse(time.RFC3339Nano, r.Time)
	}
	if t.IsZero() {
		t = time.Now() // a record made without a time is written now
	}
	t = t.UTC()
	ci := classes[r.ClassUID]
	e.int("time", t.UnixMilli())
	e.key("time_dt")
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.b = append(e.b, '"')
	activity, activityName := r.ActivityID, r.ActivityName
	if r.ClassUID == ClassHTTP {
		activity, activityName = httpActivity(r.Detail["method"])
	}
	e.b = append(e.b, classHeader(r.ClassUID)...)
	e.int("activity_id", int64(activity))
	e.str("activity_name", activityName)
	e.int("type_uid", int64(r.ClassUID)*100+int64(activity))
	sev := r.Severity
	if sev == 0 {
		sev = SeverityInformational
	}
	e.int("severity_id", int64(sev))
	e.str("severity", severityNames[sev])
	switch {
	case r.ClassUID == ClassDetectionFinding:
		// A finding's status is its own (New...); the record's outcome
		// is kept under unmapped.
		e.b = append(e.b, `,"status_id":1,"status":"New"`...)
	case r.Status == "Success":
		e.b = append(e.b, `,"status_id":1,"status":"Success"`...)
	case r.Status == "Failure":
		e.b = append(e.b, `,"status_id":2,"status":"Failure"`...)
	}
	if r.Errno != 0 {
		e.str("status_code", errnoName(r.Errno))
	}
	e.optStr("message", r.Message)

	e.b = append(e.b, metadataHead...)
	e.b = appendString(e.b, eventUID(r.Sandbox, r.Seq))
	e.int("sequence", int64(r.Seq))
	e.str("event_code", r.Event)
	if r.Claim != nil {
		e.optStr("tenant_uid", r.Claim.Tenant)
	}
	e.b = append(e.b, metadataTail...)
	e.b = append(e.b, deviceBlock()...)

	e.open("actor")
	if r.Process != nil && (r.joined || !strings.HasPrefix(r.Event, "agentbox/")) {
		e.open("process")
		r.Process.encode(&e)
		e.close()
	} else {
		e.str("app_name", "agentbox")
		if uid := r.Detail["requested_by_uid"]; uid != "" && r.ClassUID == ClassRemediation {
			// The admin who asked, as the kernel named the peer.
			e.open("user")
			e.str("uid", uid)
			e.close()
		}
	}
	e.close()
	if aiOperationCategories[ci.categoryUID] {
		e.open("ai_agent")
		e.str("uid", r.agentUID())
		e.str("instance_uid", orUnknown(r.Sandbox))
		e.str("name", r.agentName())
		e.close()
	}
	if r.Role != "" || r.PolicyDigest != "" {
		e.open("policy")
		e.optStr("name", r.Role)
		e.optStr("uid", r.PolicyDigest)
		e.close()
	}
	if a := r.action(); a != 0 {
		e.int("action_id", int64(a))
		e.str("action", map[int]string{1: "Allowed", 2: "Denied"}[a])
	}
	r.encodeClass(&e)

	// The sandbox is the attestation's chain_uid, the role and its digest
	// the policy's name and uid: not repeated here.
	e.open("unmapped")
	e.optStr("container_id", r.Container)
	e.optStr("namespace", r.Namespace)
	e.optStr("pod_namespace", r.PodNamespace)
	e.optStr("pod_name", r.PodName)
	if c := r.Claim; c != nil {
		e.open("claim")
		e.str("name", c.Name)
		e.str("uid", c.UID)
		e.optStr("subject", c.Subject)
		e.optStr("tenant", c.Tenant)
		e.optStr("task", c.Task)
		e.close()
	}
	e.optStr("warm_pool", r.WarmPool)
	if r.ClassUID == ClassDetectionFinding {
		e.optStr("status", r.Status)
	}
	e.optInt("errno", r.Errno)
	if r.Result != nil {
		e.int("result", *r.Result)
	}
	if p := r.Process; p != nil {
		e.optInt("child_pid", int64(p.ChildPID))
		if p.ExitSignal != nil {
			e.int("exit_signal", int64(*p.ExitSignal))
		}
		if p.GID != nil {
			e.int("gid", int64(*p.GID))
		}
		if p.ExitSts != nil && r.ClassUID != ClassProcess {
			e.int("exit_status", int64(*p.ExitSts))
		}
		if len(p.Argv) > 0 {
			// cmd_line joins argv with spaces; the list itself, exact:
			e.strs("argv", p.Argv)
		}
	}
	if f := r.File; f != nil {
		e.optStr("file_flags", f.Flags)
		e.optInt("file_mode", int64(f.Mode))
	}
	if f := r.Target; f != nil {
		e.optInt("target_mode", int64(f.Mode))
	}
	for _, ep := range []struct {
		key string
		e   *Endpoint
	}{{"dst", r.Dst}, {"src", r.Src}} {
		if d := ep.e; d != nil {
			e.open(ep.key)
			e.optStr("family", d.Family)
			e.optStr("ip", d.IP)
			e.optInt("port", int64(d.Port))
			e.optStr("path", d.Path)
			e.optStr("type", d.Type)
			e.close()
		}
	}
	if r.Model != nil {
		// Rare and nested: encoding/json's (deterministic) encoding.
		if b, err := json.Marshal(r.Model); err == nil {
			e.key("model")
			e.b = append(e.b, b...)
		}
	}
	if r.MCP != nil {
		if b, err := json.Marshal(r.MCP); err == nil {
			e.key("mcp")
			e.b = append(e.b, b...)
		}
	}
	e.b = appendMap(e.b, "counts", r.Counts, func(b []byte, v uint64) []byte { return strconv.AppendUint(b, v, 10) })
	e.b = appendMap(e.b, "detail", r.Detail, appendString)
	e.close()

	e.openArr("attestation_list")
	e.b = append(e.b, '{')
	e.str("chain_uid", r.Sandbox)
	e.str("uid", eventUID(r.Sandbox, r.Seq))
	if r.PrevHash != "" {
		e.open("prev_event")
		e.str("uid", eventUID(r.Sandbox, r.Seq-1))
		e.open("fingerprint")
		e.int("algorithm_id", 3)
		e.str("algorithm", "SHA-256")
		e.str("value", r.PrevHash)
		e.close()
		e.close()
	}
	return e.b
}

// attestationEnd closes a record's attestation, its list and the record;
// fingerprintPrefix and fingerprintSuffix frame the record's own hash.
const (
	attestationEnd    = "}]}"
	fingerprintPrefix = `,"fingerprint":{"algorithm_id":3,"algorithm":"SHA-256","value":"`
	fingerprintSuffix = `"}}]}`
)

func eventUID(sandbox string, seq uint64) string {
	return sandbox + "/" + strconv.FormatUint(seq, 10)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// agentUID is the agent's stable identity, from what the runtime knows:
// the pod (namespace and name, from the CRI's sandbox annotations), or,
// outside Kubernetes, the containerd namespace and the role.
func (r *Record) agentUID() string {
	if r.PodNamespace != "" || r.PodName != "" {
		return "k8s/" + r.PodNamespace + "/" + r.PodName
	}
	return "containerd/" + orUnknown(r.Namespace) + "/" + orUnknown(r.Role)
}

func (r *Record) agentName() string {
	if r.PodName != "" {
		return r.PodName
	}
	return orUnknown(r.Role)
}

// action is the security_control profile's action_id for the records that
// decide something: 1 Allowed, 2 Denied; 0 for the rest.
func (r *Record) action() int {
	switch r.Event {
	case "agentbox/refused", "agentbox/exec_refused", "agentbox/dns_refused", "agentbox/dns_address_withheld",
		"agentbox/egress_refused", "agentbox/egress_denied":
		return 2
	case "agentbox/dns_answered", "agentbox/egress_request", "agentbox/egress_connection", "agentbox/role_resolved":
		return 1
	case "syscall/connect":
		switch r.Detail["egress"] {
		case "allow":
			return 1
		case "deny":
			return 2
		}
	}
	return 0
}
