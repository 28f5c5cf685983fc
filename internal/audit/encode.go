package audit

import (
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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

// enc writes one JSON object field by field; a field is preceded by a
// comma unless it opens its object or array.
type enc struct{ b []byte }

func (e *enc) key(k string) {
	if c := e.b[len(e.b)-1]; c != '{' && c != '[' {
		e.b = append(e.b, ',')
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, k...)
	e.b = append(e.b, '"', ':')
}
func (e *enc) open(k string) { e.key(k); e.b = append(e.b, '{') }
func (e *enc) openArr(k string) {
	e.key(k)
	e.b = append(e.b, '[')
}
func (e *enc) close() { e.b = append(e.b, '}') }
func (e *enc) int(k string, v int64) {
	e.key(k)
	e.b = strconv.AppendInt(e.b, v, 10)
}
func (e *enc) optInt(k string, v int64) {
	if v != 0 {
		e.int(k, v)
	}
}
func (e *enc) str(k, v string) {
	e.key(k)
	e.b = appendString(e.b, v)
}
func (e *enc) strs(k string, v []string) {
	e.openArr(k)
	for i, s := range v {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = appendString(e.b, s)
	}
	e.b = append(e.b, ']')
}
func (e *enc) optStr(k, v string) {
	if v != "" {
		e.str(k, v)
	}
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

func (p *Process) encode(e *enc) {
	e.optInt("pid", int64(p.PID))
	e.optInt("tid", int64(p.TID))
	e.optStr("name", p.Name)
	if len(p.Argv) > 0 {
		e.str("cmd_line", strings.Join(p.Argv, " "))
	}
	if p.Exe != "" {
		e.open("file")
		e.str("name", path.Base(p.Exe))
		e.str("path", p.Exe)
		e.int("type_id", 1)
		e.str("type", "Regular File")
		e.close()
	}
	e.optStr("working_directory", p.Cwd)
	if p.UID != nil {
		e.open("user")
		e.str("uid", strconv.FormatUint(uint64(*p.UID), 10))
		e.close()
	}
	if p.PPID != 0 {
		e.open("parent_process")
		e.int("pid", int64(p.PPID))
		e.close()
	}
	if len(p.Env) > 0 {
		e.openArr("environment_variables")
		for i, kv := range p.Env {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			k, v, _ := strings.Cut(kv, "=")
			e.b = append(e.b, '{')
			e.str("name", k)
			e.str("value", v)
			e.b = append(e.b, '}')
		}
		e.b = append(e.b, ']')
	}
}

// encodeClass writes the class's own objects.
func (r *Record) encodeClass(e *enc) {
	switch r.ClassUID {
	case ClassNetwork, ClassHTTP, ClassDNS:
		// The sandbox is the source of its traffic.
		e.open("src_endpoint")
		e.str("uid", orUnknown(r.Sandbox))
		e.str("name", r.agentName())
		if s := r.Src; s != nil && s.IP != "" {
			e.str("ip", s.IP)
			e.optInt("port", int64(s.Port))
		}
		e.close()
	case ClassEventLog:
		e.str("log_name", "agentbox audit trail")
		e.str("log_provider", "agentbox")
	}
	switch r.ClassUID {
	case ClassFileSystem:
		if r.File != nil {
			e.open("file")
			r.File.encode(e, r.Event)
			e.close()
		}
		if r.Target != nil {
			e.open("file_result")
			r.Target.encode(e, r.Event)
			e.close()
		}
	case ClassProcess:
		e.open("process")
		p := r.Process
		switch {
		case p == nil:
			e.str("uid", orUnknown(r.Detail["exec_id"]))
		case p.ChildPID != 0:
			e.int("pid", int64(p.ChildPID))
			if p.PID != 0 {
				e.open("parent_process")
				e.int("pid", int64(p.PID))
				e.close()
			}
		case strings.HasPrefix(r.Event, "agentbox/"):
			// An exec request: the process does not exist yet.
			e.str("uid", orUnknown(r.Detail["exec_id"]))
			if len(p.Argv) > 0 {
				e.str("cmd_line", strings.Join(p.Argv, " "))
			}
		default:
			e.int("pid", int64(p.PID))
			e.optStr("name", p.Name)
			if f := r.File; f != nil {
				// A failed execve: the file it could not run.
				e.open("file")
				f.encode(e, r.Event)
				e.close()
			}
		}
		e.close()
		if p != nil && p.ExitSts != nil {
			e.int("exit_code", int64(*p.ExitSts))
		}
	case ClassNetwork:
		if d := r.Dst; d != nil && (d.IP != "" || d.Path != "") {
			e.open("dst_endpoint")
			e.optStr("ip", d.IP)
			if d.IP == "" {
				e.str("name", d.Path)
			}
			e.optInt("port", int64(d.Port))
			e.close()
		}
	case ClassDNS:
		if name := r.Detail["name"]; name != "" {
			e.open("query")
			e.str("hostname", name)
			e.optStr("type", r.Detail["type"])
			e.close()
		}
		if id, name, ok := rcode(r.Detail["rcode"]); ok {
			e.int("rcode_id", int64(id))
			e.str("rcode", name)
		}
	case ClassHTTP:
		e.open("http_request")
		e.optStr("http_method", r.Detail["method"])
		if h := r.Detail["host"]; h != "" {
			e.open("url")
			e.str("hostname", h)
			e.optStr("path", r.Detail["path"])
			e.close()
		}
		e.close()
		if code, err := strconv.Atoi(r.Detail["http_status"]); err == nil {
			e.open("http_response")
			e.int("code", int64(code))
			e.close()
		}
		if d := r.Dst; d != nil && d.IP != "" {
			e.open("dst_endpoint")
			e.str("ip", d.IP)
			e.optInt("port", int64(d.Port))
			e.optStr("hostname", r.Detail["host"])
			e.close()
		}
	case ClassAuthorizeSession:
		e.open("user")
		e.str("uid", r.agentUID())
		e.str("name", r.agentName())
		e.close()
		e.openArr("iam_roles")
		e.b = append(e.b, '{')
		e.str("name", orUnknown(r.Role))
		e.optStr("uid", r.PolicyDigest)
		e.b = append(e.b, '}', ']')
	case ClassDetectionFinding:
		e.open("finding_info")
		e.str("uid", eventUID(r.Sandbox, r.Seq))
		e.str("title", orUnknown(r.Message))
		e.close()
	case ClassRemediation:
		// The request's id, as the shim that applied it numbered it.
		e.str("command_uid", orUnknown(r.Detail["command_uid"]))
	case ClassAppLifecycle:
		e.open("app")
		e.str("name", "agentbox sandbox")
		e.str("uid", orUnknown(r.Sandbox))
		e.str("vendor_name", "agentbox")
		e.close()
	}
}

func (f *File) encode(e *enc, event string) {
	e.str("name", path.Base(f.Path))
	e.str("path", f.Path)
	id, name := 0, "Unknown"
	switch {
	case event == "syscall/mkdir" || event == "syscall/mkdirat" || event == "syscall/rmdir" || event == "syscall/chdir" ||
		event == "syscall/fchdir" || f.Flags == "AT_REMOVEDIR":
		id, name = 2, "Folder"
	case event == "syscall/symlink" || event == "syscall/symlinkat":
		id, name = 7, "Symbolic Link"
	}
	e.int("type_id", int64(id))
	e.str("type", name)
}

// httpActivity maps a method to HTTP Activity's activity_id.
func httpActivity(method string) (int, string) {
	switch method {
	case "CONNECT":
		return 1, "Connect"
	case "DELETE":
		return 2, "Delete"
	case "GET":
		return 3, "Get"
	case "HEAD":
		return 4, "Head"
	case "OPTIONS":
		return 5, "Options"
	case "POST":
		return 6, "Post"
	case "PUT":
		return 7, "Put"
	case "TRACE":
		return 8, "Trace"
	case "PATCH":
		return 9, "Patch"
	}
	return 99, orUnknown(method)
}

// rcode maps a DNS response code's name to DNS Activity's rcode_id.
func rcode(name string) (int, string, bool) {
	ids := map[string]int{"NOERROR": 0, "FORMERR": 1, "SERVFAIL": 2, "NXDOMAIN": 3, "NOTIMP": 4, "REFUSED": 5}
	captions := map[int]string{0: "NoError", 1: "FormError", 2: "ServError", 3: "NXDomain", 4: "NotImp", 5: "Refused"}
	id, ok := ids[strings.ToUpper(name)]
	return id, captions[id], ok
}

// appendMap appends ,"name":{...} with sorted keys, as encoding/json
// encodes a map; nothing for an empty map (omitempty).
func appendMap[V any](b []byte, name string, m map[string]V, appendValue func([]byte, V) []byte) []byte {
	if len(m) == 0 {
		return b
	}
	if b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"', ':', '{')
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendValue(b, m[k])
	}
	return append(b, '}')
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

const hexDigits = "0123456789abcdef"

// plainASCII marks the ASCII bytes a JSON string carries as they are.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString appends s as a JSON string, as encoding/json does: control
// characters, quotes and backslashes escaped, <, > and & as \u00XX,
// invalid UTF-8 as U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plainASCII[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
