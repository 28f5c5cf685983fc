//go:build e2e

package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestKubeEgressAllowlist: a pod under an allowlist role resolves through
// its resolver (the shim rewrites the kubelet's resolv.conf to name it): an
// allowed name is fetched on its port through the egress gateway, another
// port and a name off the list are not. Every destination is on this machine: the upstream DNS server on
// loopback, the allowed server on the node's bridge.
func TestKubeEgressAllowlist(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-egress")
	const nodeIP = "10.97.0.1"
	allowed, err := serveHTTPReply(nodeIP+":0", "hello-from-allowed\n")
	if err != nil {
		t.Fatal(err)
	}
	defer allowed.ln.Close()
	other, err := serveHTTPReply(nodeIP+":0", "hello-from-other\n")
	if err != nil {
		t.Fatal(err)
	}
	defer other.ln.Close()
	ip := netip.MustParseAddr(nodeIP)
	upstream, err := newDNSServer("127.0.0.1:0", map[string]netip.Addr{"api.kube.test.": ip, "other.kube.test.": ip})
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.conn.Close()
	k.patchConfig(t, map[string]string{"upstreams = []": fmt.Sprintf("upstreams = [%q]", upstream.conn.LocalAddr().String())})
	writeNodePolicy(t, k, "e2e-kube-egress.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-egress}
spec:
  inherits: baseline
  network:
    egress: allowlist
    allow:
      - {host: api.kube.test, ports: [%d], allowPrivate: true}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-egress}
spec:
  role: e2e-kube-egress
  subjects: [{namespace: %s}]
`, allowed.port, ns))
	script := "grep nameserver /etc/resolv.conf; " + fetchScript(
		net.JoinHostPort("api.kube.test", fmt.Sprint(allowed.port)),
		net.JoinHostPort("api.kube.test", fmt.Sprint(other.port)),
		net.JoinHostPort("other.kube.test", fmt.Sprint(allowed.port)),
	)
	links := hostLinks()
	k.apply(t, podSpec(ns, "egress", "agentbox", "e2e-kube-egress", "sh", "-c", script))
	pod := k.waitPod(t, ns, "egress", 3*time.Minute, "Running", running)
	logs := k.waitLogs(t, ns, "egress", "probes-done", 60*time.Second)
	if !strings.Contains(logs, "probes-done") {
		t.Fatalf("probes did not finish:\n%s", logs)
	}
	t.Logf("pod:\n%s", logs)
	if !strings.Contains(logs, "nameserver 169.254.53.53") {
		t.Errorf("resolv.conf does not name the pod's resolver")
	}
	if !regexp.MustCompile(fmt.Sprintf(`fetch api\.kube\.test:%d: HTTP/1\.[01] 200 .*hello-from-allowed`, allowed.port)).MatchString(logs) {
		t.Errorf("the allowed name and port did not connect")
	}
	if strings.Contains(logs, "hello-from-other") || other.count(nodeIP) != 0 {
		t.Errorf("another port of the allowed name connected")
	}
	if n := upstream.count("other.kube.test."); n != 0 {
		t.Errorf("a name off the list reached upstream %d times", n)
	}
	if allowed.count(nodeIP) != 1 {
		t.Errorf("the allowed server saw %d connections, want 1", allowed.count(nodeIP))
	}
	// The resolver's link is the one host link the pod adds; it goes
	// with the pod, as do its netns (and the nft table in it).
	sandbox := k.sandboxOf(t, pod.Metadata.UID)
	var added []string
	for l := range hostLinks() {
		if !links[l] {
			added = append(added, l)
		}
	}
	if len(added) == 0 {
		t.Errorf("no host link for the pod's resolver")
	}
	k.deleteAndExpectGone(t, ns, "egress", sandbox, pod.Metadata.UID, links)
}

// TestKubeEgressRealClients: in a Kubernetes pod from the glibc image,
// curl, Python's urllib, Node's https and fetch, git over https, pip and
// npm reach an inspected host rule through the pod's gateway, trusting the
// sandbox's CA through what agentbox sets; the gateway verifies the server
// with the CA the node's config names ([egress] upstream_ca_file).
func TestKubeEgressRealClients(t *testing.T) {
	requireRealAgentImage(t)
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-realclients")
	const nodeIP = "10.97.0.1"
	cert, caPEM, err := webCert("api.kube.test")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", nodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	base := fmt.Sprintf("https://api.kube.test:%d", port)
	files, err := packageFiles(base)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, ok := files[r.URL.Path]; ok {
			w.Write(b)
			return
		}
		fmt.Fprintf(w, "site=%s path=%s\n", r.Host, r.URL.Path)
	})}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	k.inspectedOnBridge(t, nodeIP, caPEM, "api.kube.test")
	writeNodePolicy(t, k, "e2e-kube-realclients.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-realclients}
spec:
  inherits: coder
  credentials:
    env: {allow: [PATH, HOME, "npm_config_*"]}
  network:
    egress: allowlist
    allow:
      - {host: api.kube.test, ports: [%d], allowPrivate: true, http: {methods: [GET, HEAD, POST], paths: ["/*"]}}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-realclients}
spec:
  role: e2e-kube-realclients
  subjects: [{namespace: %s}]
`, port, ns))
	var script []string
	for _, l := range strings.Split(realClientScript, "\n") {
		if !strings.Contains(l, "other.gw") {
			script = append(script, strings.ReplaceAll(l, "https://"+gwAllowA, base))
		}
	}
	pod := podSpec(ns, "realclients", "agentbox", "e2e-kube-realclients")
	c := pod["spec"].(obj)["containers"].([]obj)[0]
	c["image"], c["command"] = realAgentImage, []string{"bash", "-c", strings.Join(script, "\n")}
	c["env"] = []obj{{"name": "HOME", "value": "/workspace"}, {"name": "npm_config_cache", "value": "/workspace/.npm"}}
	c["securityContext"] = obj{"runAsUser": 65532}
	k.apply(t, pod)
	k.waitPod(t, ns, "realclients", 3*time.Minute, "Running", running)
	logs := k.waitLogs(t, ns, "realclients", "probes-done", 4*time.Minute)
	for step, want := range map[string]string{
		"curl": "path=/curl", "python-urllib": "path=/urllib", "node-https": "path=/node-https", "node-fetch": "path=/node-fetch",
		"git-clone": "cloned-through-the-gateway", "pip": "abxdemo-ok", "npm": "abxdemo-ok",
	} {
		m := regexp.MustCompile(`(?m)^== ` + step + `: (.*)$`).FindStringSubmatch(logs)
		if m == nil || !strings.HasPrefix(m[1], "rc=0 ") || !strings.Contains(m[1], want) {
			t.Errorf("%s: %v, want rc=0 and %q", step, m, want)
		}
	}
	if t.Failed() {
		t.Fatalf("pod logs:\n%s", logs)
	}
}

// inspectedOnBridge has the node resolve names to addr (an upstream DNS
// server on loopback) and its gateways trust caPEM for the servers behind
// inspected rules, until the test ends.
func (k *kubeNode) inspectedOnBridge(t *testing.T, addr, caPEM string, names ...string) {
	t.Helper()
	answers := map[string]netip.Addr{}
	for _, name := range names {
		answers[name+"."] = netip.MustParseAddr(addr)
	}
	upstream, err := newDNSServer("127.0.0.1:0", answers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { upstream.conn.Close() })
	caFile := filepath.Join(k.dir, names[0]+"-ca.pem")
	if err := os.WriteFile(caFile, []byte(caPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	k.patchConfig(t, map[string]string{
		"upstreams = []":        fmt.Sprintf("upstreams = [%q]", upstream.conn.LocalAddr().String()),
		`upstream_ca_file = ""`: fmt.Sprintf("upstream_ca_file = %q", caFile),
	})
}
