package audit

// The class-specific part of a record's OCSF event: process, file,
// network, DNS, HTTP, remediation and the others.

import (
	"path"
	"strconv"
	"strings"
)

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
		if h, path := r.Detail["host"], r.Detail["path"]; h != "" && path != "" {
			// OCSF's url needs a path or a whole URL: without the path
			// (a request the gateway refused before reading it), the host
			// stays in unmapped.detail alone.
			e.open("url")
			e.str("hostname", h)
			e.str("path", path)
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
		if m := r.Model; m != nil {
			// The ai_operation profile's model and message context.
			e.open("ai_model")
			e.str("name", orUnknown(m.Name))
			e.str("ai_provider", orUnknown(m.Provider))
			e.close()
			e.open("message_context")
			e.open("application")
			e.str("name", orUnknown(m.Application))
			e.close()
			e.open("service")
			e.str("name", orUnknown(r.Detail["host"]))
			e.close()
			if t := m.Tokens; t != nil {
				e.int("prompt_tokens", t.Prompt)
				e.int("completion_tokens", t.Completion)
				e.int("total_tokens", t.Total)
			}
			e.close()
		}
		if m := r.MCP; m != nil {
			// The ai_operation profile's message context: a tool's call.
			e.open("message_context")
			e.int("ai_role_id", 3)
			e.str("ai_role", "Tool")
			e.open("application")
			e.str("name", orUnknown(m.Application))
			e.close()
			e.open("service")
			e.str("name", orUnknown(m.Server))
			e.close()
			e.str("name", orUnknown(m.Tool))
			e.optStr("uid", m.Session)
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
