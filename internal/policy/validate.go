package policy

// Validation of what a role, a binding or a rule says, each problem
// reported with its field path below spec.

import (
	"fmt"
	"net"
	"net/http"
	"path"
	"sort"
	"strings"

	"agentbox.dev/agentbox/internal/modelapi"
)

// ValidRoleName reports whether name can name a role.
func ValidRoleName(name string) bool { return nameRE.MatchString(name) }

// fieldError is a problem with a field, by path below spec.
type fieldError struct{ path, msg string }

func (e fieldError) Error() string { return e.path + ": " + e.msg }

func ferr(path, format string, args ...any) error {
	return fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

var (
	nameRE    = lazy(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	envNameRE = lazy(`^[A-Za-z_][A-Za-z0-9_]*$`)
	envPatRE  = lazy(`^[A-Za-z_][A-Za-z0-9_]*\*?$|^\*$`)
	syscallRE = lazy(`^[a-z0-9_]{1,64}$`)
	subjectRE = lazy(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)
	hostRE    = lazy(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.?$`)
)

// validateHeader checks what every object carries.
func validateHeader(apiVersion, name string) []fieldError {
	var errs []fieldError
	if apiVersion != APIVersion {
		errs = append(errs, fieldError{"apiVersion", fmt.Sprintf("%q is not %q", apiVersion, APIVersion)})
	}
	if !nameRE.MatchString(name) {
		errs = append(errs, fieldError{"metadata.name", fmt.Sprintf("%q is not a valid name (lower-case letters, digits and '-', at most 63)", name)})
	}
	return errs
}

func validateRole(r *Role) []fieldError {
	errs := validateHeader(r.APIVersion, r.Metadata.Name)
	if p := r.Spec.Inherits; p != "" && !nameRE.MatchString(p) {
		errs = append(errs, fieldError{"spec.inherits", fmt.Sprintf("%q is not a valid role name", p)})
	}
	if p := r.Spec.Inherits; p == r.Metadata.Name {
		errs = append(errs, fieldError{"spec.inherits", "a role cannot inherit from itself"})
	}
	return errs
}

func validateBinding(b *RoleBinding) []fieldError {
	errs := validateHeader(b.APIVersion, b.Metadata.Name)
	if b.Spec.Role == "" {
		errs = append(errs, fieldError{"spec.role", "missing"})
	}
	if len(b.Spec.Subjects) == 0 {
		errs = append(errs, fieldError{"spec.subjects", "missing: a binding without subjects binds nobody"})
	}
	for i, s := range b.Spec.Subjects {
		p := fmt.Sprintf("spec.subjects[%d]", i)
		if s.Namespace == "" && s.ContainerdNamespace == "" && s.RuntimeHandler == "" {
			errs = append(errs, fieldError{p, "sets none of namespace, containerdNamespace, runtimeHandler"})
		}
		for k, v := range map[string]string{"namespace": s.Namespace, "containerdNamespace": s.ContainerdNamespace, "runtimeHandler": s.RuntimeHandler} {
			if v != "" && v != "*" && !subjectRE.MatchString(v) {
				errs = append(errs, fieldError{p + "." + k, fmt.Sprintf("%q is not a valid name or \"*\"", v)})
			}
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].path < errs[j].path })
	return errs
}

func checkPath(field, p string) error {
	if !path.IsAbs(p) {
		return ferr(field, "%q is not an absolute path", p)
	}
	if path.Clean(p) != p {
		return ferr(field, "%q is not clean (want %q)", p, path.Clean(p))
	}
	return nil
}

func checkPaths(field string, ps []string) []error {
	var errs []error
	seen := map[string]bool{}
	for i, p := range ps {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := checkPath(f, p); err != nil {
			errs = append(errs, err)
		} else if p == "/" {
			errs = append(errs, ferr(f, "\"/\" is the whole filesystem"))
		} else if seen[p] {
			errs = append(errs, ferr(f, "%q is listed twice", p))
		}
		seen[p] = true
	}
	return errs
}

func checkEgressRule(field string, r EgressRule) []error {
	var errs []error
	switch {
	case r.Host != "" && r.CIDR != "":
		errs = append(errs, ferr(field, "sets both host and cidr; use one rule each"))
	case r.Host == "" && r.CIDR == "":
		errs = append(errs, ferr(field, "sets neither host nor cidr"))
	case r.Host != "":
		if net.ParseIP(r.Host) != nil {
			errs = append(errs, ferr(field+".host", "%q is an address; use cidr: %s/32", r.Host, r.Host))
		} else if !hostRE.MatchString(r.Host) || len(r.Host) > 253 {
			errs = append(errs, ferr(field+".host", "%q is not a DNS name", r.Host))
		}
		if len(r.Ports) == 0 {
			errs = append(errs, ferr(field+".ports", "a host rule names its ports (like [443]): the egress gateway serves TLS and HTTP to the name on those ports only"))
		}
		for i, port := range r.Ports {
			if port == 53 {
				errs = append(errs, ferr(fmt.Sprintf("%s.ports[%d]", field, i), "port 53 is the pod's resolver; a host rule cannot name it"))
			}
		}
		if r.HTTP != nil {
			errs = append(errs, checkHTTP(field+".http", *r.HTTP)...)
		}
		if r.API != "" && r.API != APIMCP && !modelapi.API(r.API).Valid() {
			errs = append(errs, ferr(field+".api", "%q is not a model API this gateway reads (%v), nor mcp", r.API, modelapi.APIs))
		}
		errs = append(errs, checkTools(field, r)...)
	default:
		if r.HTTP != nil {
			errs = append(errs, ferr(field+".http", "only a host rule takes it: the gateway decides requests by name"))
		}
		if r.AllowPrivate {
			errs = append(errs, ferr(field+".allowPrivate", "only a host rule takes it; a CIDR rule names its addresses already"))
		}
		if r.API != "" {
			errs = append(errs, ferr(field+".api", "only a host rule takes it: model calls are read at the gateway, which a CIDR rule's connections do not pass"))
		}
		if r.Tools != nil {
			errs = append(errs, ferr(field+".tools", "only a host rule with api: mcp takes it"))
		}
		if r.WebSocket {
			errs = append(errs, ferr(field+".websocket", "only a host rule takes it: the gateway decides upgrades by name, and a CIDR rule's connections do not pass it"))
		}
		if _, _, err := net.ParseCIDR(r.CIDR); err != nil {
			errs = append(errs, ferr(field+".cidr", "%q is not a CIDR (like 10.0.0.0/8)", r.CIDR))
		}
	}
	for i, port := range r.Ports {
		if port < 1 || port > 65535 {
			errs = append(errs, ferr(fmt.Sprintf("%s.ports[%d]", field, i), "%d is not a port (1-65535)", port))
		}
	}
	return errs
}

// hopHeaders are the request headers a secret may not be injected as: the
// gateway or the HTTP framing owns them.
var hopHeaders = map[string]bool{
	"Host": true, "Connection": true, "Content-Length": true, "Transfer-Encoding": true, "Te": true,
	"Trailer": true, "Upgrade": true, "Keep-Alive": true, "Proxy-Connection": true, "Expect": true,
}

// headerRE is an HTTP header name (RFC 9110 token).
var headerRE = lazy("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")

func checkInject(field string, in Inject) []error {
	var errs []error
	switch {
	case in.Host == "":
		errs = append(errs, ferr(field+".host", "is empty: name the host whose requests carry the secret"))
	case strings.HasPrefix(in.Host, "*"):
		errs = append(errs, ferr(field+".host", "%q is a pattern: a secret goes to one exact name", in.Host))
	case net.ParseIP(in.Host) != nil || !hostRE.MatchString(in.Host) || len(in.Host) > 253:
		errs = append(errs, ferr(field+".host", "%q is not a DNS name", in.Host))
	}
	switch {
	case !headerRE.MatchString(in.Header):
		errs = append(errs, ferr(field+".header", "%q is not an HTTP header name", in.Header))
	case hopHeaders[http.CanonicalHeaderKey(in.Header)]:
		errs = append(errs, ferr(field+".header", "%s is the HTTP framing's or the gateway's; a secret cannot be sent as it", http.CanonicalHeaderKey(in.Header)))
	}
	if in.Format != "" {
		if strings.Count(in.Format, SecretToken) != 1 {
			errs = append(errs, ferr(field+".format", "%q must hold %s once", in.Format, SecretToken))
		}
		for _, c := range in.Format {
			if c < 0x20 || c == 0x7f {
				errs = append(errs, ferr(field+".format", "%q holds a control character", in.Format))
				break
			}
		}
	}
	return errs
}

// checkHTTP checks a host rule's http section.
func checkHTTP(field string, h HTTPRule) []error {
	var errs []error
	if len(h.Methods) == 0 && len(h.Paths) == 0 {
		errs = append(errs, ferr(field, "restricts nothing: list methods or paths, or drop http"))
	}
	for i, m := range h.Methods {
		if !methodRE.MatchString(m) {
			errs = append(errs, ferr(fmt.Sprintf("%s.methods[%d]", field, i), "%q is not an HTTP method in upper case (GET, POST, ...)", m))
		} else if m == "CONNECT" {
			errs = append(errs, ferr(fmt.Sprintf("%s.methods[%d]", field, i), "CONNECT is never served by the gateway"))
		}
	}
	for i, pt := range h.Paths {
		f := fmt.Sprintf("%s.paths[%d]", field, i)
		base := strings.TrimSuffix(pt, "*")
		switch {
		case !strings.HasPrefix(pt, "/"):
			errs = append(errs, ferr(f, "%q does not start with /", pt))
		case strings.Contains(base, "*"):
			errs = append(errs, ferr(f, "%q has '*' inside it; only a final '*' (a prefix) is understood", pt))
		case !CanonicalPath(base) && base != "/":
			errs = append(errs, ferr(f, "%q is not a clean path (no '.', '..' or empty segments)", pt))
		case strings.ContainsAny(pt, "?#%"):
			errs = append(errs, ferr(f, "%q holds '?', '#' or '%%': paths are matched decoded, without the query", pt))
		}
	}
	return errs
}

var methodRE = lazy(`^[A-Z][A-Z-]{0,19}$`)

var knownCapabilities = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range strings.Fields(`CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID
		CAP_KILL CAP_SETGID CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE
		CAP_NET_BROADCAST CAP_NET_ADMIN CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE
		CAP_SYS_RAWIO CAP_SYS_CHROOT CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT
		CAP_SYS_NICE CAP_SYS_RESOURCE CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE
		CAP_AUDIT_WRITE CAP_AUDIT_CONTROL CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG
		CAP_WAKE_ALARM CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE`) {
		m[c] = true
	}
	return m
}()

// toolRE is a tool's name or a prefix of one ending in '*': printable,
// no space, '*' only at the end.
var toolRE = lazy(`^[^\s*\x00-\x1f\x7f]{1,128}\*?$|^\*$`)

// checkTools names what is wrong with a host rule's tools: an api: mcp
// rule lists the tools it allows, and only such a rule has tools.
func checkTools(field string, r EgressRule) []error {
	switch {
	case r.API == APIMCP && (r.Tools == nil || len(r.Tools.Allow) == 0):
		return []error{ferr(field+".tools.allow", "an api: mcp rule lists the tools it allows (\"*\" for every tool): with none, every tools/call would be refused")}
	case r.API != APIMCP && r.Tools != nil:
		return []error{ferr(field+".tools", "only an api: mcp rule takes it")}
	case r.Tools == nil:
		return nil
	case r.HTTP != nil || r.WebSocket:
		return []error{ferr(field, "an api: mcp rule takes no http or websocket: the gateway reads its JSON-RPC")}
	}
	var errs []error
	for _, l := range []struct {
		name string
		pats []string
	}{{"allow", r.Tools.Allow}, {"deny", r.Tools.Deny}} {
		for i, p := range l.pats {
			if !toolRE.MatchString(p) {
				errs = append(errs, ferr(fmt.Sprintf("%s.tools.%s[%d]", field, l.name, i), "%q is not a tool's name or a prefix ending in '*'", p))
			}
		}
	}
	return errs
}

// IsModelAPI says whether a host rule's api names a model API (not mcp).
func IsModelAPI(api string) bool { return modelapi.API(api).Valid() }
