//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// webServers serves "port-8080" on 8080 and "port-9090" on 9090, inside
// the sandbox.
const webServers = "mkdir -p /tmp/a /tmp/b && echo port-8080 > /tmp/a/index.html && echo port-9090 > /tmp/b/index.html && httpd -p 8080 -h /tmp/a && exec httpd -f -p 9090 -h /tmp/b"

// TestPortForward: the node's port-forward (crictl port-forward here, the
// kubelet's for kubectl port-forward and agent-sandbox's SDK the same CRI
// call) reaches a gVisor sandbox's port when its role's network.portForward
// names it. Its twins: the same pod's port 9090, which its role does not
// name, and a baseline pod's 8080 (a role naming none), are refused,
// though both servers answer inside their sandboxes. The role's egress is
// none: the sandbox keeps its interface for port-forward, and the agent's
// connection out through it is dropped and recorded. Each forwarded
// connection is one agentbox/port_forward record in the pod's trail.
func TestPortForward(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "pf", "e2e-pf", map[string]string{"agentbox.dev/role": "e2e-portforward"})
	pid := p.container(t, "web", "sh", "-c", webServers)
	twin := newPodIn(t, "pf-baseline", "e2e-pf", nil)
	tid := twin.container(t, "web", "sh", "-c", webServers)
	for _, id := range []string{pid, tid} {
		for _, port := range []int{8080, 9090} {
			want := fmt.Sprintf("port-%d", port)
			if !eventually(t, 20*time.Second, func() bool {
				r := dev.crictl(30*time.Second, "exec", id, "wget", "-qO-", fmt.Sprintf("http://127.0.0.1:%d/", port))
				return strings.TrimSpace(r.stdout) == want
			}) {
				t.Fatalf("%s: the server on %d does not answer inside the sandbox", id, port)
			}
		}
	}
	if body, err := portForwardGet(t, p.id, 8080); err != nil || strings.TrimSpace(body) != "port-8080" {
		t.Fatalf("port-forward to a port the role names: %q, %v (record: %+v)", body, err, findRecord(trailSoFar(t, p.id), "agentbox/port_forward"))
	}
	if body, err := portForwardGet(t, p.id, 9090); err == nil {
		t.Errorf("port-forward to a port the role does not name answered: %q", body)
	}
	if body, err := portForwardGet(t, twin.id, 8080); err == nil {
		t.Errorf("port-forward to a baseline pod answered: %q", body)
	}
	// The agent's way out: under egress none its pod keeps an interface
	// for port-forward, and every packet it sends is dropped. The server
	// answers any pod that may reach it.
	before := egress.allowed.count(egress.gateway)
	out := dev.crictl(30*time.Second, "exec", pid, "wget", "-T", "3", "-qO-", fmt.Sprintf("http://%s:%d/", egress.gateway, egress.allowed.port))
	if out.code == 0 || egress.allowed.count(egress.gateway) != before {
		t.Errorf("egress none with port-forward let the agent out: %v", out)
	}
	if !eventually(t, 10*time.Second, func() bool { return findRecord(trailSoFar(t, p.id), "agentbox/egress_denied") != nil }) {
		t.Error("the dropped connection is not in the trail")
	}
	var got *record
	eventually(t, 10*time.Second, func() bool {
		got = findRecord(trailSoFar(t, p.id), "agentbox/port_forward")
		return got != nil
	})
	if got == nil || got.Status != "Success" || got.Detail["port"] != "8080" || got.Detail["bytes_out"] == "0" || got.Detail["bytes_in"] == "0" {
		t.Fatalf("the port-forward record: %+v", got)
	}
	if r := findRecord(trailSoFar(t, twin.id), "agentbox/port_forward"); r != nil {
		t.Errorf("the baseline pod has a port-forward record: %+v", r)
	}
	t.Logf("port-forward: %s", got.Message)
}

// portForwardGet runs crictl port-forward to pod's port and GETs / through
// it: the body, or why none came.
func portForwardGet(t *testing.T, pod string, port int) (string, error) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "crictl", "port-forward", pod, fmt.Sprintf("%d:%d", local, port))
	cmd.Env = dev.env()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		t.Logf("crictl port-forward %s %d: %s", pod, port, strings.TrimSpace(stderr.String()))
	}()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Forwarding from") {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			return "", fmt.Errorf("crictl port-forward did not start: %s", stderr.String())
		}
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("crictl port-forward did not start in 30s")
	}
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", local))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return string(b), err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), nil
}
