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
// (secretRef). The cluster's broker, allowed to get that Secret only, gives
// it to the node once a pod of the role is bound there, and not before; the
// node agent keeps its value on the node (no file written by hand); the
// pod's requests to the allowed host carry it while the pod holds a
// placeholder; the Secret is rotated while the pod runs, and its next
// request carries the new value. Neither value is in the pod or its trail.
// Once the pod is gone, the key leaves the node. A role naming a Secret the
// broker may not read gets a recorded refusal on the node, and its pod does
// not start.
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
	// The Secret, and leave for the broker to get it (and only it).
	k.apply(t, secretObj(keys, "vendor", "token", v1), secretObj(keys, "other", "token", "never-read"),
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": obj{"name": "agentbox-broker-keys", "namespace": keys},
			"rules": []obj{{"apiGroups": []string{""}, "resources": []string{"secrets"}, "resourceNames": []string{"vendor"}, "verbs": []string{"get"}}}},
		obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": obj{"name": "agentbox-broker-keys", "namespace": keys},
			"roleRef":  obj{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentbox-broker-keys"},
			"subjects": []obj{{"kind": "ServiceAccount", "name": "agentbox-broker", "namespace": "kube-system"}}})
	role := func(secret string) obj {
		return obj{"inherits": "baseline",
			"network": obj{"egress": "allowlist", "allow": []obj{{"host": "api.kube.test", "ports": []int{origin.port}, "allowPrivate": true}}},
			"credentials": obj{"secrets": []obj{{"env": "VENDOR_KEY", "secretRef": obj{"namespace": keys, "name": secret, "key": "token"},
				"inject": obj{"host": "api.kube.test", "header": "authorization", "format": "Bearer {secret}"}}}}}
	}
	k.apply(t, agentRole("e2e-keys", role("vendor")), agentBinding("e2e-keys", "e2e-keys", ns))
	k.waitPolicy(t, "agentrole", "e2e-keys", "enforced", enforced)

	// No pod of the role on the node yet: the node holds no key of it
	// (the node agent asks the broker every few seconds).
	file := filepath.Join(k.dir, "varlib", "agentbox", "secrets", keys, "vendor", "token")
	time.Sleep(12 * time.Second)
	if _, err := os.Stat(file); err == nil {
		t.Fatalf("the node holds the key with no pod of its role bound to it: %s", file)
	}

	pod := podSpec(ns, "agent", "agentbox", "e2e-keys", "sh", "-c", "echo ready; exec sleep 600")
	pod["spec"].(obj)["containers"].([]obj)[0]["image"] = probeImage
	k.apply(t, pod)
	p := k.waitPod(t, ns, "agent", 2*time.Minute, "Running", running)
	// On the node now: the value, in a file root's alone; nobody wrote it
	// by hand.
	if b, err := os.ReadFile(file); err != nil || string(b) != v1 {
		t.Fatalf("the node agent did not keep the Secret in %s: %q %v", file, b, err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v", file, st.Mode(), err)
	}
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

	// The pod gone, the key leaves the node.
	k.kubectl("-n", ns, "delete", "pod", "agent", "--wait=true", "--timeout=60s")
	if !eventually(t, time.Minute, func() bool { _, err := os.Stat(file); return os.IsNotExist(err) }) {
		t.Error("the key stays on the node with no pod of its role bound to it")
	}

	// A role naming a Secret the broker may not get: refused, recorded on
	// the node, and its pod does not start.
	k.apply(t, agentRole("e2e-keys-other", role("other")), agentBinding("e2e-keys-other", "e2e-keys-other", ns))
	k.waitPolicy(t, "agentrole", "e2e-keys-other", "enforced", enforced)
	other := podSpec(ns, "other", "agentbox", "e2e-keys-other", "sh", "-c", "echo ready; exec sleep 600")
	other["spec"].(obj)["containers"].([]obj)[0]["image"] = probeImage
	k.apply(t, other)
	var refused *record
	if !eventually(t, time.Minute, func() bool {
		for _, r := range k.trail(t, "node-agentbox-node") {
			if r.Event == "agentbox/secret_rotated" && r.Status == "Failure" && strings.Contains(r.Message, keys+"/other[token]") {
				refused = &r
			}
		}
		return refused != nil
	}) {
		t.Fatal("the node's trail records no refusal for a Secret the broker may not read")
	}
	if !strings.Contains(refused.Message, "forbidden") {
		t.Errorf("the refusal: %s", refused.Message)
	}
	line := k.waitEvent(t, ns, "other", "FailedCreatePodSandBox", "other[token]")
	t.Logf("the pod of the role is refused: %s", clip(line))
	if _, err := os.Stat(filepath.Join(k.dir, "varlib", "agentbox", "secrets", keys, "other", "token")); err == nil {
		t.Error("a Secret the broker may not read is on the node")
	}
}
