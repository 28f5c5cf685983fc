//go:build e2e

package e2e

// The private single-node cluster the TestKube tests run on
// (hack/kube/), and what they ask of it: kubectl, pods, events, logs,
// trails, the node's traces of a sandbox, its config and policies.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kubeNode is hack/kube.sh's cluster.
type kubeNode struct {
	dir  string   // AGENTBOX_KUBE
	env  []string // from `hack/kube.sh env`
	sock string
}

func kubeDir() string {
	if d := os.Getenv("AGENTBOX_KUBE"); d != "" {
		return d
	}
	return "/tmp/agentbox-kube"
}

// kubeScript runs hack/kube.sh ARGS, its output to the log file.
func kubeScript(log string, args ...string) error {
	return kubeScriptEnv(nil, log, args...)
}

// kubeScriptEnv is kubeScript with env added to the environment.
func kubeScriptEnv(env []string, log string, args ...string) error {
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "kube.sh"), args...)
	cmd.Env = append(append(os.Environ(), "AGENTBOX_KUBE="+kubeDir()), env...)
	if log == "" {
		return cmd.Run()
	}
	f, err := os.OpenFile(log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	return cmd.Run()
}

// kubeCluster returns the cluster, bringing it up on first use.
func kubeCluster(t *testing.T) *kubeNode {
	t.Helper()
	requireEnv(t)
	kubeOnce.Do(func() {
		log := filepath.Join(repoRoot, "_output", "kube-up.log")
		os.MkdirAll(filepath.Dir(log), 0o755)
		if kubeScript("", "status") != nil {
			kubeOurs = true
			os.Remove(log)
			start := time.Now()
			if err := kubeScript(log, "up"); err != nil {
				b, _ := os.ReadFile(log)
				kubeErr = fmt.Errorf("hack/kube.sh up: %v\n%s", err, clip(string(b)))
				return
			}
			fmt.Fprintf(os.Stderr, "e2e: hack/kube.sh up took %s (log %s)\n", time.Since(start).Round(time.Second), log)
		}
		out, err := exec.Command(filepath.Join(repoRoot, "hack", "kube.sh"), "env").Output()
		if err != nil {
			kubeErr = fmt.Errorf("hack/kube.sh env: %v", err)
			return
		}
		k := &kubeNode{dir: kubeDir(), sock: filepath.Join(kubeDir(), "containerd.sock")}
		env := os.Environ()
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			kv, ok := strings.CutPrefix(sc.Text(), "export ")
			if !ok {
				continue
			}
			env = append(env, strings.ReplaceAll(kv, "$PATH", os.Getenv("PATH")))
		}
		k.env = env
		kube = k
	})
	if kubeErr != nil {
		t.Fatal(kubeErr)
	}
	return kube
}

// kubeDown takes down a cluster the suite brought up (from TestMain).
func kubeDown() error {
	if !kubeOurs {
		return nil
	}
	log := filepath.Join(repoRoot, "_output", "kube-up.log")
	if err := kubeScript(log, "down"); err != nil {
		return fmt.Errorf("hack/kube.sh down: %v (log %s)", err, log)
	}
	return nil
}

func (k *kubeNode) run(timeout time.Duration, stdin []byte, name string, args ...string) result {
	return runCommand(timeout, k.env, stdin, name, args...)
}

func (k *kubeNode) kubectl(args ...string) result {
	return k.run(2*time.Minute, nil, "kubectl", args...)
}

func (k *kubeNode) mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	r := k.kubectl(args...)
	if r.code != 0 || r.timedOut {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), r)
	}
	return r.stdout
}

// apply applies objects (JSON), each its own document.
func (k *kubeNode) apply(t *testing.T, objs ...any) {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		j, _ := json.Marshal(o)
		b.Write(j)
		b.WriteByte('\n')
	}
	if r := k.run(time.Minute, b.Bytes(), "kubectl", "apply", "-f", "-"); r.code != 0 || r.timedOut {
		t.Fatalf("kubectl apply: %v\n%s", r, b.String())
	}
}

// namespace makes a namespace for one test and deletes it (with its pods,
// through the kubelet) afterwards.
func (k *kubeNode) namespace(t *testing.T, name string) string {
	t.Helper()
	k.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s")
	k.apply(t, obj{"apiVersion": "v1", "kind": "Namespace", "metadata": obj{"name": name}})
	// Pods need the namespace's default service account.
	if !eventually(t, 60*time.Second, func() bool { return k.kubectl("-n", name, "get", "serviceaccount", "default").code == 0 }) {
		t.Fatalf("namespace %s: no default service account", name)
	}
	t.Cleanup(func() {
		k.kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s")
	})
	return name
}

type obj = map[string]any

// podSpec is a one-container pod under runtimeClass with the role claimed
// by annotation (none when role is "").
func podSpec(ns, name, runtimeClass, role string, argv ...string) obj {
	ann := obj{}
	if role != "" {
		ann["agentbox.dev/role"] = role
	}
	return obj{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": obj{"name": name, "namespace": ns, "annotations": ann},
		"spec": obj{
			"runtimeClassName":              runtimeClass,
			"restartPolicy":                 "Never",
			"terminationGracePeriodSeconds": 0,
			"containers": []obj{{
				"name": "main", "image": agentImage, "imagePullPolicy": "Never", "command": argv,
			}},
		},
	}
}

// kubePod is the part of a pod's status the tests read.
type kubePod struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase             string          `json:"phase"`
		ContainerStatuses []kubeContainer `json:"containerStatuses"`
	} `json:"status"`
}

type kubeContainer struct {
	Name         string    `json:"name"`
	RestartCount int       `json:"restartCount"`
	ContainerID  string    `json:"containerID"`
	State        kubeState `json:"state"`
	LastState    kubeState `json:"lastState"`
}

type kubeState struct {
	Running    *struct{} `json:"running"`
	Terminated *struct {
		ExitCode int    `json:"exitCode"`
		Reason   string `json:"reason"`
		Message  string `json:"message"`
	} `json:"terminated"`
	Waiting *struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"waiting"`
}

func (k *kubeNode) pod(t *testing.T, ns, name string) kubePod {
	t.Helper()
	var p kubePod
	if err := json.Unmarshal([]byte(k.mustKubectl(t, "-n", ns, "get", "pod", name, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitPod polls the pod until ok says so, failing after timeout with the
// pod's description.
func (k *kubeNode) waitPod(t *testing.T, ns, name string, timeout time.Duration, what string, ok func(kubePod) bool) kubePod {
	t.Helper()
	var p kubePod
	if !eventually(t, timeout, func() bool { p = k.pod(t, ns, name); return ok(p) }) {
		t.Fatalf("pod %s/%s: not %s after %s\n%s", ns, name, what, timeout, clip(k.kubectl("-n", ns, "describe", "pod", name).stdout))
	}
	return p
}

func running(p kubePod) bool { return p.Status.Phase == "Running" }

func terminated(p kubePod) bool {
	return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Terminated != nil
}

// events returns "Reason: message" lines of the pod's events.
func (k *kubeNode) events(t *testing.T, ns, name string) string {
	t.Helper()
	var l struct {
		Items []struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"items"`
	}
	json.Unmarshal([]byte(k.mustKubectl(t, "-n", ns, "get", "events", "--field-selector", "involvedObject.name="+name, "-o", "json")), &l)
	var b strings.Builder
	for _, e := range l.Items {
		fmt.Fprintf(&b, "%s: %s\n", e.Reason, e.Message)
	}
	return b.String()
}

// waitEvent waits for an event of the pod with the reason whose message
// holds every one of want.
func (k *kubeNode) waitEvent(t *testing.T, ns, name, reason string, want ...string) string {
	t.Helper()
	var ev, found string
	if !eventually(t, 90*time.Second, func() bool {
		ev = k.events(t, ns, name)
		for _, line := range strings.Split(ev, "\n") {
			if !strings.HasPrefix(line, reason+": ") {
				continue
			}
			all := true
			for _, w := range want {
				all = all && strings.Contains(line, w)
			}
			if all {
				found = line
				return true
			}
		}
		return false
	}) {
		t.Fatalf("pod %s/%s: no %s event with %q; events:\n%s", ns, name, reason, want, ev)
	}
	return found
}

// sandboxOf is the pod's CRI sandbox id.
func (k *kubeNode) sandboxOf(t *testing.T, uid string) string {
	t.Helper()
	r := k.run(30*time.Second, nil, "crictl", "pods", "--label", "io.kubernetes.pod.uid="+uid, "-q")
	id := strings.TrimSpace(strings.Split(strings.TrimSpace(r.stdout), "\n")[0])
	if r.code != 0 || id == "" {
		t.Fatalf("no sandbox for pod uid %s: %v", uid, r)
	}
	return id
}

func (k *kubeNode) logs(t *testing.T, ns, name string, args ...string) string {
	t.Helper()
	return k.mustKubectl(t, append([]string{"-n", ns, "logs", name}, args...)...)
}

// trail reads the audit trail of a sandbox on the node (its /var/log is
// the cluster's varlog directory).
func (k *kubeNode) trail(t *testing.T, sandbox string) []record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k.dir, "varlog", "agentbox", "audit", sandbox+".jsonl"))
	if err != nil {
		t.Fatalf("audit trail of %s: %v", sandbox, err)
	}
	return parseTrail(t, b)
}

// waitLogs polls the pod's logs until they hold want or timeout passes,
// and returns them either way.
func (k *kubeNode) waitLogs(t *testing.T, ns, name, want string, timeout time.Duration) string {
	t.Helper()
	var logs string
	eventually(t, timeout, func() bool {
		logs = k.logs(t, ns, name)
		return strings.Contains(logs, want)
	})
	return logs
}

// nodeTraces lists what a sandbox may leave on the node: processes naming
// it, mounts naming it or its pod's UID (in the host's and the node's
// mount namespaces), its audit socket, cgroups of it or its pod.
func (k *kubeNode) nodeTraces(sandbox, uid string) []string {
	var out []string
	for _, cmd := range cmdlines() {
		if strings.Contains(cmd, sandbox) {
			out = append(out, "process: "+clipLine(cmd))
		}
	}
	mountFiles := []string{"/proc/self/mounts"}
	if b, err := os.ReadFile(filepath.Join(k.dir, "pids", "containerd.pid")); err == nil {
		mountFiles = append(mountFiles, "/proc/"+strings.TrimSpace(string(b))+"/mounts")
	}
	for _, mf := range mountFiles {
		b, _ := os.ReadFile(mf)
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && (strings.Contains(f[1], sandbox) || strings.Contains(f[1], uid)) {
				out = append(out, "mount: "+f[1])
			}
		}
	}
	if socks, _ := filepath.Glob("/run/agentbox/audit/" + sandbox + "*"); len(socks) > 0 {
		out = append(out, fmt.Sprint("audit socket: ", socks))
	}
	filepath.WalkDir("/sys/fs/cgroup/memory/agentbox-kube", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && (strings.Contains(d.Name(), sandbox) || strings.Contains(d.Name(), uid)) {
			out = append(out, "cgroup: "+p)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// hostLinks lists the host's network interfaces.
func hostLinks() map[string]bool {
	m := map[string]bool{}
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		m[i.Name] = true
	}
	return m
}

// deleteAndExpectGone deletes the pod through the kubelet and waits until
// nothing of its sandbox is left on the node: no runsc or shim process, no
// mount (rootfs, volumes, netns: its nft table lived there), no audit
// socket (the resolver lived in the shim), no cgroup, no new host link.
func (k *kubeNode) deleteAndExpectGone(t *testing.T, ns, name, sandbox, uid string, linksBefore map[string]bool) {
	t.Helper()
	// The check must see the running pod, or its silence after means nothing.
	seen := map[string]bool{}
	for _, tr := range k.nodeTraces(sandbox, uid) {
		seen[strings.SplitN(tr, ":", 2)[0]] = true
	}
	if !seen["process"] || !seen["mount"] || !seen["cgroup"] {
		t.Fatalf("the leak check does not see the running pod's processes, mounts and cgroups: %v", seen)
	}
	k.mustKubectl(t, "-n", ns, "delete", "pod", name, "--wait=true", "--timeout=120s")
	var left []string
	if !eventually(t, 60*time.Second, func() bool {
		left = k.nodeTraces(sandbox, uid)
		for l := range hostLinks() {
			if !linksBefore[l] {
				left = append(left, "host link: "+l)
			}
		}
		return len(left) == 0
	}) {
		t.Fatalf("pod %s/%s deleted, but its sandbox %s left:\n  %s", ns, name, sandbox[:12], strings.Join(left, "\n  "))
	}
}

// writeNodePolicy adds a policy file to the node's policy directory, as a
// cluster admin would; the shim rereads the directory on change.
func writeNodePolicy(t *testing.T, k *kubeNode, name, body string) {
	t.Helper()
	p := filepath.Join(k.dir, "etc", "agentbox", "policies", name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
}

// kubeAuditDirs are the nodes' audit directories, when this run used the
// cluster (node 2's when it has two).
func kubeAuditDirs() []string {
	if kube == nil || !kubeOurs {
		return nil
	}
	dirs := []string{filepath.Join(kube.dir, "varlog", "agentbox", "audit")}
	if d := filepath.Join(kube.dir, "node2", "varlog", "agentbox", "audit"); dirExists(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

func dirExists(d string) bool {
	st, err := os.Stat(d)
	return err == nil && st.IsDir()
}

// patchConfig edits the node's installed agentbox config for one test,
// each line (as the installer writes it) replaced by its new text, and
// puts it back when the test ends. A line the config lacks fails the test:
// the installer changed, and the test would run unpatched.
func (k *kubeNode) patchConfig(t *testing.T, lines map[string]string) {
	t.Helper()
	cfg := filepath.Join(k.dir, "etc", "agentbox", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	edited := orig
	for old, repl := range lines {
		if !bytes.Contains(edited, []byte(old)) {
			t.Fatalf("the installed config has no %q to patch:\n%s", old, orig)
		}
		edited = bytes.Replace(edited, []byte(old), []byte(repl), 1)
	}
	if err := os.WriteFile(cfg, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(cfg, orig, 0o644); err != nil {
			t.Errorf("restoring %s: %v", cfg, err)
		}
	})
}
