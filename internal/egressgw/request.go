package egressgw

// What a request may carry: the checks of its target, Host and method,
// and the inspection of its path against the rule.

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// splitHost takes the port off an HTTP Host.
func splitHost(hostport string) (string, string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	return hostport, ""
}

// requestRefusal says why the front refuses r before deciding its name
// ("" when it does not): what would let the agent past the decision or
// take a secret back.
func requestRefusal(r *http.Request, hostPort string, port int) string {
	switch {
	case r.Method == http.MethodConnect:
		return "CONNECT is not served: connect to the name itself (the pod's resolver answers it with the gateway)"
	case r.Method == "TRACE" || r.Method == "TRACK":
		return r.Method + " is not served: it echoes the request back, with any secret the gateway injected"
	case hostPort != "" && hostPort != strconv.Itoa(port):
		// Only this connection's own port: "a.example:b.example" or
		// another port would reach the origin as the agent spelled it.
		return fmt.Sprintf("Host port %q is not this connection's port %d", clipName(hostPort), port)
	case r.URL.Opaque != "" || strings.HasPrefix(r.URL.Path, "//") || strings.HasPrefix(r.RequestURI, "//"):
		// Some origins read "//other.example/x" as another host.
		return "the request target " + ScrubPath(r.RequestURI) + " starts with '//' or is opaque: some origins read it as another host"
	}
	return ""
}

// inspect checks what an allowed name's request carries: on a terminated
// connection its Host against the SNI (fronting), the rule's methods and
// paths, and the secrets' placeholders. It says why it refuses, or "".
func (g *Gateway) inspect(r *http.Request, rule netpolicy.Rule, name string) string {
	if r.TLS != nil {
		sni, err := HostName(r.TLS.ServerName)
		if err != nil || sni != name {
			return fmt.Sprintf("Host %s differs from the TLS server name %s (fronting)", name, clipName(r.TLS.ServerName))
		}
	}
	if len(rule.Methods) > 0 && !contains(rule.Methods, r.Method) {
		return fmt.Sprintf("method %s is not allowed by %s (it allows %s)", clipName(r.Method), rule.Name, strings.Join(rule.Methods, ", "))
	}
	if len(rule.Paths) > 0 {
		raw := strings.ToLower(r.URL.EscapedPath())
		switch {
		case strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") || strings.Contains(r.URL.Path, "\\"):
			return "path " + ScrubPath(r.RequestURI) + " holds an encoded '/' or a '\\': a rule with paths refuses it"
		case r.URL.Path == "" || !policy.CanonicalPath(r.URL.Path):
			return "path " + ScrubPath(r.RequestURI) + " is not a clean absolute path ('.', '..' or empty segments): a rule with paths refuses it"
		case !policy.PathAllowed(rule.Paths, r.URL.Path):
			return fmt.Sprintf("path %s is not allowed by %s", clipName(r.URL.Path), rule.Name)
		}
	}
	for _, sec := range g.secretsNow() {
		if sec.Placeholder == "" {
			continue
		}
		if targetHolds(r.RequestURI, sec.Placeholder) {
			return fmt.Sprintf("the placeholder of the secret for %s was sent to %s in the URL", sec.Host, name)
		}
		for k, vs := range r.Header {
			if k == sec.Header && sec.Host == name && r.TLS != nil {
				continue // replaced with the secret
			}
			for _, v := range vs {
				if strings.Contains(v, sec.Placeholder) {
					return fmt.Sprintf("the placeholder of the secret for %s was sent to %s in header %s", sec.Host, name, clipName(k))
				}
			}
		}
	}
	if r.TLS == nil {
		for _, sec := range g.secretsNow() {
			if sec.Host == name {
				return "the secret for " + name + " is injected over TLS only: use https"
			}
		}
	}
	return ""
}

// targetHolds says whether a request target holds s, as sent or
// percent-decoded (once, and as a query decodes '+').
func targetHolds(target, s string) bool {
	if strings.Contains(target, s) {
		return true
	}
	for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
		if d, err := unescape(target); err == nil && strings.Contains(d, s) {
			return true
		}
	}
	// A target that does not decode as a whole: decode what does.
	return strings.Contains(hexEscapes.ReplaceAllStringFunc(target, func(e string) string {
		d, _ := url.PathUnescape(e)
		return d
	}), s)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ScrubPath keeps a request target's path and its query's keys; values
// (tokens, search terms) are replaced. At most 512 bytes are kept.
func ScrubPath(uri string) string {
	path, query, ok := strings.Cut(uri, "?")
	if ok {
		parts := strings.Split(query, "&")
		for i, p := range parts {
			if k, _, has := strings.Cut(p, "="); has {
				parts[i] = k + "=..."
			}
		}
		path += "?" + strings.Join(parts, "&")
	}
	if len(path) > 512 {
		path = path[:512] + "...(truncated)"
	}
	return path
}
