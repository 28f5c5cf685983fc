//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// pod is one CRI pod sandbox created with crictl, as a kubelet does for a
// RuntimeClass whose handler is agentbox.
type pod struct {
	id       string
	uid      string
	dir      string
	podJSON  string
	logDir   string
	released bool
	// containers started in it by the CRI benchmark.
	containers []string
	// calls are the CRI benchmark's RunPodSandbox, CreateContainer and
	// StartContainer, each timed from crictl's start to its exit.
	calls [3]time.Duration
}

func writeJSON(t *testing.T, path string, v any) string {
	t.Helper()
	if err := writeJSONFile(path, v); err != nil {
		t.Fatal(err)
	}
	return path
}

func newPod(t *testing.T, name string, annotations map[string]string) *pod {
	t.Helper()
	p, r := tryPod(t, name, "agents", annotations)
	if r.code != 0 {
		t.Fatalf("crictl runp: %v", r)
	}
	return p
}

// tryPod runs a pod in a Kubernetes namespace and returns crictl's result.
func tryPod(t *testing.T, name, namespace string, annotations map[string]string) (*pod, result) {
	t.Helper()
	return tryPodWith(t, name, namespace, annotations, map[string]any{})
}

// tryPodWith runs a pod with the given CRI linux pod config (security
// context, sysctls).
func tryPodWith(t *testing.T, name, namespace string, annotations map[string]string, linux map[string]any) (*pod, result) {
	t.Helper()
	dir := t.TempDir()
	p := &pod{dir: dir, logDir: filepath.Join(dir, "logs"), uid: uniqueID("uid")}
	p.podJSON = writeJSON(t, filepath.Join(dir, "pod.json"), map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": namespace, "uid": p.uid, "attempt": 0},
		"annotations":   annotations,
		"log_directory": p.logDir,
		"linux":         linux,
	})
	r := dev.crictl(90*time.Second, "runp", "--runtime", handler, p.podJSON)
	if r.code != 0 {
		return p, r
	}
	p.id = strings.TrimSpace(r.stdout)
	t.Cleanup(func() {
		if !p.released {
			dev.crictl(60*time.Second, "stopp", p.id)
			dev.crictl(60*time.Second, "rmp", "-f", p.id)
		}
	})
	return p, r
}

func (p *pod) container(t *testing.T, name string, argv ...string) string {
	t.Helper()
	return p.containerWith(t, name, map[string]any{"command": argv})
}

// tryContainer creates a container from extra CRI container config fields
// (command, envs, mounts, annotations) and returns crictl's result.
func (p *pod) tryContainer(t *testing.T, name string, extra map[string]any) result {
	t.Helper()
	c := map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": agentImage},
		"log_path": name + ".log",
		"linux":    map[string]any{},
	}
	for k, v := range extra {
		c[k] = v
	}
	cfg := writeJSON(t, filepath.Join(p.dir, name+".json"), c)
	return dev.crictl(90*time.Second, "create", p.id, cfg, p.podJSON)
}

func (p *pod) containerWith(t *testing.T, name string, extra map[string]any) string {
	t.Helper()
	r := p.tryContainer(t, name, extra)
	if r.code != 0 {
		t.Fatalf("crictl create %s: %v", name, r)
	}
	id := strings.TrimSpace(r.stdout)
	if r := dev.crictl(90*time.Second, "start", id); r.code != 0 {
		t.Fatalf("crictl start %s: %v", name, r)
	}
	return id
}

// containerState returns a container's CRI state and exit code.
func containerState(t *testing.T, id string) (string, int) {
	t.Helper()
	st, code, _ := containerStatus(t, id)
	return st, code
}

// containerStatus returns a container's CRI state, exit code and reason.
func containerStatus(t *testing.T, id string) (state string, code int, reason string) {
	t.Helper()
	r := dev.crictl(30*time.Second, "inspect", "-o", "json", id)
	if r.code != 0 {
		t.Fatalf("crictl inspect: %v", r)
	}
	var st struct {
		Status struct {
			State    string `json:"state"`
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("inspect output: %v", err)
	}
	return st.Status.State, st.Status.ExitCode, st.Status.Reason
}

func waitState(t *testing.T, id, want string) int {
	t.Helper()
	var st string
	var code int
	if !eventually(t, 60*time.Second, func() bool { st, code = containerState(t, id); return st == want }) {
		t.Fatalf("container %s: state %s, want %s", id, st, want)
	}
	return code
}

// TestCRIPodSharesOneSandbox: the kubelet path. A pod under the agentbox
// handler (the CRI sets oom_score_adj -998 on it, which this host refuses),
// two containers sharing one gVisor sandbox, exec, logs, exit codes, then
// stopp and rmp leaving nothing behind.
func TestCRIPodSharesOneSandbox(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPod(t, "shared", nil)
	worker := p.container(t, "worker", "sh", "-c", "echo worker-ready; exec sleep 600")
	helper := p.container(t, "helper", "sh", "-c", "echo helper-out; echo helper-err >&2; exec sleep 601")
	waitState(t, worker, "CONTAINER_RUNNING")
	waitState(t, helper, "CONTAINER_RUNNING")

	// One sandbox: the worker sees the helper's process, and both run on
	// gVisor's kernel.
	var ps result
	eventually(t, 10*time.Second, func() bool {
		ps = dev.crictl(60*time.Second, "exec", worker, "ps")
		return strings.Contains(ps.stdout, "sleep 601")
	})
	if ps.code != 0 || !strings.Contains(ps.stdout, "sleep 601") || !strings.Contains(ps.stdout, "sleep 600") {
		t.Fatalf("worker should see both containers' processes in one sandbox: %v", ps)
	}
	if r := dev.crictl(60*time.Second, "exec", helper, "dmesg"); !strings.Contains(r.stdout, "Starting gVisor") {
		t.Fatalf("helper is not under gVisor: %v", r)
	}
	// crictl exits 1 and names the exec'd process's status.
	if r := dev.crictl(60*time.Second, "exec", worker, "sh", "-c", "exit 9"); r.code != 1 || !strings.Contains(r.stderr, "command terminated with exit code 9") {
		t.Fatalf("crictl exec exit code: want 9, got %v", r)
	}
	if n := countSandboxes(dev); n != 1 {
		t.Fatalf("want 1 runsc sandbox process for the pod, found %d", n)
	}
	// The pause container's root is the node's EROFS image of its rootfs:
	// runsc started a gofer for each of the pod's containers and none for
	// the pause.
	for id, want := range map[string]int{p.id: 0, worker: 1, helper: 1} {
		if n := countGofers(id); n != want {
			t.Errorf("container %s has %d gofer processes, want %d", id, n, want)
		}
	}
	var pause specs.Spec
	b, err := os.ReadFile(filepath.Join(dev.dir, "state", "io.containerd.runtime.v2.task", "k8s.io", p.id, "config.json"))
	if err != nil || json.Unmarshal(b, &pause) != nil {
		t.Fatalf("the pause's spec: %v", err)
	}
	if src := pause.Annotations["dev.gvisor.spec.rootfs.source"]; pause.Annotations["dev.gvisor.spec.rootfs.type"] != "erofs" || !strings.HasSuffix(src, ".erofs") {
		t.Errorf("the pause spec's root annotations: %v", pause.Annotations)
	}
	// The shim answered containerd 2.4 with task API v3, so containerd
	// joined the containers to the pod's shim itself: no `shim start` ran
	// for them (it writes "address" into the bundle; containerd writes
	// "sandbox" when it joins).
	for _, c := range []string{worker, helper} {
		b := filepath.Join(dev.dir, "state", "io.containerd.runtime.v2.task", "k8s.io", c)
		if _, err := os.Stat(filepath.Join(b, "sandbox")); err != nil {
			t.Errorf("container %s was not joined to the pod's shim by containerd: %v", c, err)
		}
		if _, err := os.Stat(filepath.Join(b, "address")); err == nil {
			t.Errorf("`shim start` ran for container %s (its bundle has an address file)", c)
		}
	}

	// Logs: stdout and stderr each arrive on their stream.
	var logs result
	eventually(t, 10*time.Second, func() bool {
		logs = dev.crictl(30*time.Second, "logs", helper)
		return strings.Contains(logs.stdout, "helper-out") && strings.Contains(logs.stderr, "helper-err")
	})
	if !strings.Contains(logs.stdout, "helper-out") || !strings.Contains(logs.stderr, "helper-err") {
		t.Fatalf("crictl logs: %v", logs)
	}

	// A container that exits reports its exact code through the CRI.
	quick := p.container(t, "quick", "sh", "-c", "exit 7")
	if code := waitState(t, quick, "CONTAINER_EXITED"); code != 7 {
		t.Fatalf("CRI exit code: want 7, got %d", code)
	}

	if r := dev.crictl(60*time.Second, "stopp", p.id); r.code != 0 {
		t.Fatalf("stopp: %v", r)
	}
	if r := dev.crictl(60*time.Second, "rmp", p.id); r.code != 0 {
		t.Fatalf("rmp: %v", r)
	}
	p.released = true
}

// remove stops and removes p's sandbox now (not at the test's end).
func (p *pod) remove() {
	dev.crictl(60*time.Second, "stopp", p.id)
	dev.crictl(60*time.Second, "rmp", p.id)
	p.released = true
}

// countSandboxes counts runsc sandbox processes under d's runsc root.
// countGofers counts the runsc gofer processes serving container id.
func countGofers(id string) int {
	n := 0
	for _, cmd := range cmdlines() {
		if strings.HasPrefix(cmd, "runsc-gofer") && strings.HasSuffix(strings.TrimSpace(cmd), " "+id) {
			n++
		}
	}
	return n
}

func countSandboxes(d *daemon) int {
	n := 0
	for _, cmd := range cmdlines() {
		if strings.HasPrefix(cmd, "runsc-sandbox") && strings.Contains(cmd, fmt.Sprintf("--root=%s/", d.runscRoot())) {
			n++
		}
	}
	return n
}
