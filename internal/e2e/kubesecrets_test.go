//go:build e2e

package e2e

import (
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// authOrigin is a TLS web host on the node's bridge that remembers the
// Authorization header of each path it served.
type authOrigin struct {
	port int
	mu   sync.Mutex
	seen map[string]string
}

func newAuthOrigin(t *testing.T, nodeIP, name string) (*authOrigin, string) {
	t.Helper()
	cert, caPEM, err := webCert(name)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", nodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	o := &authOrigin{port: ln.Addr().(*net.TCPAddr).Port, seen: map[string]string{}}
	srv := &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.seen[r.URL.Path] = r.Header.Get("Authorization")
		o.mu.Unlock()
		fmt.Fprintf(w, "site=%s path=%s\n", r.Host, r.URL.Path)
	})}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return o, caPEM
}

func (o *authOrigin) auth(path string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[path]
}

// secretObj is a Secret with one key.
func secretObj(ns, name, key, value string) obj {
	return obj{"apiVersion": "v1", "kind": "Secret", "metadata": obj{"name": name, "namespace": ns},
		"data": obj{key: base64.StdEncoding.EncodeToString([]byte(value))}}
}

// TestKubeSecretRef: a role's injected key comes from a Kubernetes Secret
// (secretRef). The node agent, allowed to get that Secret only, keeps its
// value on the node (no file written by hand); the pod's requests to the
// allowed host carry it while the pod holds a placeholder; the Secret is
// rotated while the pod runs, and its next request carries the new value.
// Neither value is in the pod or its trail. A role naming a Secret the
// node agent may not read gets a recorded refusal on the node.
func TestKubeSecretRef(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "e2e-keys-agent")
	keys := k.namespace(t, "e2e-keys")
	const nodeIP = "10.97.0.1"
	origin, caPEM := newAuthOrigin(t, nodeIP, "api.kube.test")
	k.inspectedOnBridge(t, nodeIP, caPEM, "api.kube.test")
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "e2e-keys", "e2e-keys-other", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "e2e-keys", "e2e-keys-other", "--ignore-not-found")
	})
	v1, v2 := "sk-e2e-first-"+uniqueID("k"), "sk-e2e-rotated-"+uniqueID("k")
	// The Secret, and leave for the node agent to get it (and only it).
	k.apply(t, secretObj(keys, "vendor", "token", v1), secretObj(keys, "other", "token", "never-read"),
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": obj{"name": "agentbox-sync-keys", "namespace": keys},
			"rules": []obj{{"apiGroups": []string{""}, "resources": []string{"secrets"}, "resourceNames": []string{"vendor"}, "verbs": []string{"get"}}}},
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": obj{"name": "agentbox-sync-keys", "namespace": keys},
			"roleRef":  obj{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentbox-sync-keys"},
			"subjects": []obj{{"kind": "ServiceAccount", "name": "agentbox-sync", "namespace": "kube-system"}}})
	role := func(secret string) obj {
		return obj{"inherits": "baseline",
			"network": obj{"egress": "allowlist", "allow": []obj{{"host": "api.kube.test", "ports": []int{origin.port}, "allowPrivate": true}}},
			"credentials": obj{"secrets": []obj{{"env": "VENDOR_KEY", "secretRef": obj{"namespace": keys, "name": secret, "key": "token"},
				"inject": obj{"host": "api.kube.test", "header": "authorization", "format": "Bearer {secret}"}}}}}
	}
	k.apply(t, agentRole("e2e-keys", role("vendor")), agentBinding("e2e-keys", "e2e-keys", ns))
	k.waitPolicy(t, "agentrole", "e2e-keys", "enforced", enforced)

	// On the node: the value, in a file root's alone; nobody wrote it by
	// hand.
	file := filepath.Join(k.dir, "varlib", "agentbox", "secrets", keys, "vendor", "token")
	if !eventually(t, time.Minute, func() bool { b, err := os.ReadFile(file); return err == nil && string(b) == v1 }) {
		t.Fatalf("the node agent did not keep the Secret in %s", file)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v", file, st.Mode(), err)
	}

	pod := podSpec(ns, "agent", "agentbox", "e2e-keys", "sh", "-c", "echo ready; exec sleep 600")
	pod["spec"].(obj)["containers"].([]obj)[0]["image"] = probeImage
	k.apply(t, pod)
	p := k.waitPod(t, ns, "agent", 2*time.Minute, "Running", running)
	k.waitLogs(t, ns, "agent", "ready", time.Minute)
	sandbox := k.sandboxOf(t, p.Metadata.UID)
	fetch := func(path string) string {
		t.Helper()
		return k.mustKubectl(t, "-n", ns, "exec", "agent", "--", "abx-fetch", fmt.Sprintf("https://api.kube.test:%d%s", origin.port, path))
	}
	if out := fetch("/call-1"); !strings.Contains(out, "status=200") {
		t.Fatalf("the first call: %q", out)
	}
	if got := origin.auth("/call-1"); got != "Bearer "+v1 {
		t.Fatalf("the vendor received %q, want the Secret's value", got)
	}

	// Rotated while the pod runs: the next request carries the new value.
	t0 := time.Now()
	k.apply(t, secretObj(keys, "vendor", "token", v2))
	var rotated *record
	if !eventually(t, time.Minute, func() bool {
		rotated = findRecord(k.trail(t, sandbox), "agentbox/secret_rotated")
		return rotated != nil
	}) {
		t.Fatal("the pod's trail records no rotation within a minute")
	}
	t.Logf("rotation reached the gateway %.1fs after kubectl apply: %s", time.Since(t0).Seconds(), rotated.Message)
	if rotated.Detail["source"] != "Secret "+keys+"/vendor[token]" || rotated.Status != "Success" {
		t.Errorf("the rotation record: %+v", rotated)
	}
	if out := fetch("/call-2"); !strings.Contains(out, "status=200") {
		t.Fatalf("the call after rotation: %q", out)
	}
	if got := origin.auth("/call-2"); got != "Bearer "+v2 {
		t.Fatalf("after rotation the vendor received %q, want the rotated value", got)
	}

	// Neither value is in the pod or its trail.
	env := k.mustKubectl(t, "-n", ns, "exec", "agent", "--", "sh", "-c", "echo $VENDOR_KEY; cat /proc/1/environ | tr '\\0' '\\n'")
	if !strings.HasPrefix(env, "agentbox-placeholder-") || strings.Contains(env, "sk-e2e-") {
		t.Errorf("the pod's environment: %q", env)
	}
	b, err := os.ReadFile(filepath.Join(k.dir, "varlog", "agentbox", "audit", sandbox+".jsonl"))
	if err != nil || strings.Contains(string(b), v1) || strings.Contains(string(b), v2) {
		t.Errorf("the pod's trail holds a secret value (%v)", err)
	}
	if ann := k.mustKubectl(t, "-n", ns, "get", "pod", "agent", "-o", "jsonpath={.metadata.annotations}"); strings.Contains(ann, "sk-e2e-") {
		t.Errorf("an annotation holds the secret: %s", ann)
	}

	// A role naming a Secret the node agent may not get: refused, and
	// recorded on the node.
	k.apply(t, agentRole("e2e-keys-other", role("other")), agentBinding("e2e-keys-other", "e2e-keys-other", ns))
	var refused *record
	if !eventually(t, time.Minute, func() bool {
		for _, r := range k.trail(t, "node-agentbox-node") {
			if r.Event == "agentbox/secret_rotated" && r.Status == "Failure" && strings.Contains(r.Message, keys+"/other[token]") {
				refused = &r
			}
		}
		return refused != nil
	}) {
		t.Fatal("the node's trail records no refusal for a Secret the node agent may not read")
	}
	if !strings.Contains(refused.Message, "forbidden") {
		t.Errorf("the refusal: %s", refused.Message)
	}
	if _, err := os.Stat(filepath.Join(k.dir, "varlib", "agentbox", "secrets", keys, "other", "token")); err == nil {
		t.Error("a Secret the node agent may not read is on the node")
	}
}
