//go:build e2e

package e2e

// The TestKube tests run pods through a real kubelet: hack/kube.sh's
// single-node cluster (etcd, kube-apiserver, controller-manager, scheduler,
// kubelet) on a private containerd, with agentbox installed on the node by
// the installer DaemonSet (examples/kubernetes). The first TestKube test
// brings the cluster up unless it is up already; TestMain takes down what
// it brought up.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// kubeNode is hack/kube.sh's cluster.
type kubeNode struct {
	dir  string   // AGENTBOX_KUBE
	env  []string // from `hack/kube.sh env`
	sock string
}

var (
	kubeOnce sync.Once
	kube     *kubeNode
	kubeErr  error
	// kubeOurs: the suite brought the cluster up and takes it down.
	kubeOurs bool
)

func kubeDir() string {
	if d := os.Getenv("AGENTBOX_KUBE"); d != "" {
		return d
	}
	return "/tmp/agentbox-kube"
}

// kubeScript runs hack/kube.sh ARGS, its output to the log file.
func kubeScript(log string, args ...string) error {
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "kube.sh"), args...)
	cmd.Env = append(os.Environ(), "AGENTBOX_KUBE="+kubeDir())
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
	deadline := time.Now().Add(60 * time.Second)
	for k.kubectl("-n", name, "get", "serviceaccount", "default").code != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s: no default service account", name)
		}
		time.Sleep(500 * time.Millisecond)
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
	deadline := time.Now().Add(timeout)
	for {
		p := k.pod(t, ns, name)
		if ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: not %s after %s\n%s", ns, name, what, timeout, clip(k.kubectl("-n", ns, "describe", "pod", name).stdout))
		}
		time.Sleep(300 * time.Millisecond)
	}
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
	deadline := time.Now().Add(90 * time.Second)
	for {
		ev := k.events(t, ns, name)
		for _, line := range strings.Split(ev, "\n") {
			if !strings.HasPrefix(line, reason+": ") {
				continue
			}
			all := true
			for _, w := range want {
				all = all && strings.Contains(line, w)
			}
			if all {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: no %s event with %q; events:\n%s", ns, name, reason, want, ev)
		}
		time.Sleep(time.Second)
	}
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
	for deadline := time.Now().Add(timeout); !strings.Contains(logs, want) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		logs = k.logs(t, ns, name)
	}
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
	deadline := time.Now().Add(60 * time.Second)
	var left []string
	for {
		left = k.nodeTraces(sandbox, uid)
		for l := range hostLinks() {
			if !linksBefore[l] {
				left = append(left, "host link: "+l)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s deleted, but its sandbox %s left:\n  %s", ns, name, sandbox[:12], strings.Join(left, "\n  "))
		}
		time.Sleep(time.Second)
	}
}

// TestKubePodLifecycle: a RuntimeClass agentbox pod runs under gVisor with
// the role's user; its logs keep stdout and stderr; exec works; deleting
// it leaves nothing on the node. The runc twin runs on the host kernel.
func TestKubePodLifecycle(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-life")
	for _, rc := range []string{"agentbox", "runc"} {
		t.Run(rc, func(t *testing.T) {
			links := hostLinks()
			name := "life-" + rc
			k.apply(t, podSpec(ns, name, rc, "baseline", "sh", "-c", "dmesg | head -n1; echo uid=$(id -u); echo to-stderr >&2; sleep 3600"))
			p := k.waitPod(t, ns, name, 3*time.Minute, "Running", running)
			logs := k.waitLogs(t, ns, name, "to-stderr", 10*time.Second)
			gvisor := strings.Contains(logs, "Starting gVisor")
			if rc == "agentbox" && (!gvisor || !strings.Contains(logs, "uid=65532")) {
				t.Fatalf("not under gVisor as the role's user:\n%s", logs)
			}
			if rc == "runc" && gvisor {
				t.Fatalf("a runc pod under gVisor:\n%s", logs)
			}
			if !strings.Contains(logs, "to-stderr") {
				t.Errorf("stderr missing from the logs:\n%s", logs)
			}
			ex := k.kubectl("-n", ns, "exec", name, "--", "sh", "-c", "echo exec-ok; exit 7")
			if ex.code != 7 || ex.stdout != "exec-ok\n" {
				t.Errorf("exec: %v, want exec-ok and exit 7", ex)
			}
			sandbox := k.sandboxOf(t, p.Metadata.UID)
			k.deleteAndExpectGone(t, ns, name, sandbox, p.Metadata.UID, links)
		})
	}
}

// TestKubeRoleBinding: the role comes from the pod's annotation, the right
// to it from the pod's namespace or its RuntimeClass's handler. An unknown
// or unbound role does not start, and says why in the pod's events.
func TestKubeRoleBinding(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-roles")
	agents := k.namespace(t, "agents")
	for _, c := range []struct {
		ns, name, rc, role string
		want               []string // refusal text; nil: runs
	}{
		{ns, "coder-unbound", "agentbox", "coder", []string{`role "coder"`, "not bound"}},
		{ns, "no-such-role", "agentbox", "no-such-role", []string{`"no-such-role"`}},
		{ns, "coder-by-handler", "agentbox-coder", "coder", nil},
		{agents, "coder-by-namespace", "agentbox", "coder", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			k.apply(t, podSpec(c.ns, c.name, c.rc, c.role, "sh", "-c", "echo started; sleep 3600"))
			if c.want == nil {
				p := k.waitPod(t, c.ns, c.name, 3*time.Minute, "Running", running)
				sandbox := k.sandboxOf(t, p.Metadata.UID)
				var role string
				for _, r := range k.trail(t, sandbox) {
					if r.Event == "agentbox/role_resolved" {
						role = r.Role
					}
				}
				if role != c.role {
					t.Errorf("trail: role %q, want %q", role, c.role)
				}
				return
			}
			line := k.waitEvent(t, c.ns, c.name, "FailedCreatePodSandBox", c.want...)
			t.Logf("refused: %s", clip(line))
			if p := k.pod(t, c.ns, c.name); p.Status.Phase == "Running" {
				t.Errorf("a refused pod is Running")
			}
		})
	}
}

// TestKubeVolumes: under baseline, the pod's own emptyDir, configMap,
// secret and downwardAPI volumes work and the service-account token is
// absent; a hostPath volume is refused unless a role's hostMounts allow it.
// The runc twin sees everything, token included.
func TestKubeVolumes(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-vol")
	k.apply(t,
		obj{"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj{"name": "cm", "namespace": ns}, "data": obj{"task.txt": "the task"}},
		obj{"apiVersion": "v1", "kind": "Secret", "metadata": obj{"name": "sec", "namespace": ns}, "stringData": obj{"key": "s3cret"}},
	)
	hostDir := filepath.Join(k.dir, "hostdata")
	os.MkdirAll(hostDir, 0o755)
	os.WriteFile(filepath.Join(hostDir, "model.txt"), []byte("weights"), 0o644)
	writeNodePolicy(t, k, "e2e-kube-host.yaml", fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-kube-host}
spec:
  inherits: baseline
  filesystem: {hostMounts: [{path: %s}]}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-kube-host}
spec:
  role: e2e-kube-host
  subjects: [{namespace: %s}]
`, hostDir, ns))

	script := `for f in /cm/task.txt /sec/key /info/name; do echo "$f=$(cat $f 2>&1)"; done
echo scratch > /scratch/x && echo "emptydir=$(cat /scratch/x)"
echo "token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token 2>/dev/null | wc -c)"
sleep 3600`
	volumes := []obj{
		{"name": "scratch", "emptyDir": obj{}},
		{"name": "cm", "configMap": obj{"name": "cm"}},
		{"name": "sec", "secret": obj{"secretName": "sec"}},
		{"name": "info", "downwardAPI": obj{"items": []obj{{"path": "name", "fieldRef": obj{"fieldPath": "metadata.name"}}}}},
	}
	mounts := []obj{{"name": "scratch", "mountPath": "/scratch"}, {"name": "cm", "mountPath": "/cm"}, {"name": "sec", "mountPath": "/sec"}, {"name": "info", "mountPath": "/info"}}
	withVolumes := func(p obj, vols []obj, ms []obj) obj {
		spec := p["spec"].(obj)
		spec["volumes"] = vols
		spec["containers"].([]obj)[0]["volumeMounts"] = ms
		return p
	}
	for _, rc := range []string{"agentbox", "runc"} {
		t.Run(rc, func(t *testing.T) {
			name := "vol-" + rc
			k.apply(t, withVolumes(podSpec(ns, name, rc, "baseline", "sh", "-c", script), volumes, mounts))
			k.waitPod(t, ns, name, 3*time.Minute, "Running", running)
			logs := k.waitLogs(t, ns, name, "token=", 10*time.Second)
			for _, want := range []string{"/cm/task.txt=the task", "/sec/key=s3cret", "/info/name=" + name, "emptydir=scratch"} {
				if !strings.Contains(logs, want) {
					t.Errorf("missing %q:\n%s", want, logs)
				}
			}
			if tokenAbsent := strings.Contains(logs, "token=0"); tokenAbsent != (rc == "agentbox") {
				t.Errorf("service-account token (absent=%v) under %s:\n%s", tokenAbsent, rc, logs)
			}
		})
	}
	host := []obj{{"name": "host", "hostPath": obj{"path": hostDir, "type": "Directory"}}}
	hostMount := []obj{{"name": "host", "mountPath": "/host", "readOnly": true}}
	t.Run("hostPath-refused", func(t *testing.T) {
		k.apply(t, withVolumes(podSpec(ns, "host-baseline", "agentbox", "baseline", "sh", "-c", "cat /host/model.txt; sleep 3600"), host, hostMount))
		// The sandbox starts; the container with the hostPath does not.
		line := k.waitEvent(t, ns, "host-baseline", "Failed", hostDir, "host mounts")
		t.Logf("refused: %s", clip(line))
	})
	t.Run("hostPath-by-role", func(t *testing.T) {
		k.apply(t, withVolumes(podSpec(ns, "host-role", "agentbox", "e2e-kube-host", "sh", "-c", "echo model=$(cat /host/model.txt); sleep 3600"), host, hostMount))
		k.waitPod(t, ns, "host-role", 3*time.Minute, "Running", running)
		logs := k.waitLogs(t, ns, "host-role", "model=", 10*time.Second)
		if !strings.Contains(logs, "model=weights") {
			t.Errorf("hostPath under its role:\n%s", logs)
		}
	})
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

// TestKubeExitStatus: the wall clock ends a pod with 124; a termination
// message and an exit code reach the pod's status exactly; OnFailure
// restarts a failed container under the same profile.
func TestKubeExitStatus(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-exit")
	t.Run("wall-clock", func(t *testing.T) {
		p := podSpec(ns, "wall", "agentbox", "baseline", "sleep", "3600")
		p["metadata"].(obj)["annotations"].(obj)["agentbox.dev/wall-clock"] = "3s"
		k.apply(t, p)
		st := k.waitPod(t, ns, "wall", 2*time.Minute, "terminated", terminated).Status.ContainerStatuses[0].State.Terminated
		if st.ExitCode != 124 {
			t.Errorf("wall clock: exit %d (%s), want 124", st.ExitCode, st.Reason)
		}
	})
	t.Run("termination-message", func(t *testing.T) {
		k.apply(t, podSpec(ns, "msg", "agentbox", "baseline", "sh", "-c", "printf 'task failed: quota' >/dev/termination-log; exit 3"))
		st := k.waitPod(t, ns, "msg", 2*time.Minute, "terminated", terminated).Status.ContainerStatuses[0].State.Terminated
		if st.ExitCode != 3 || st.Message != "task failed: quota" {
			t.Errorf("exit %d, message %q; want 3 and %q", st.ExitCode, st.Message, "task failed: quota")
		}
	})
	t.Run("restart-on-failure", func(t *testing.T) {
		// The second run keeps running: the kubelet removes the dead
		// containers of a finished pod but the last, and with them their
		// logs.
		p := podSpec(ns, "again", "agentbox", "baseline", "sh", "-c",
			`echo "run uid=$(id -u) gvisor=$(dmesg | grep -c 'Starting gVisor')"; if [ -f /scratch/ran ]; then exec sleep 3600; fi; touch /scratch/ran; exit 1`)
		spec := p["spec"].(obj)
		spec["restartPolicy"] = "OnFailure"
		spec["volumes"] = []obj{{"name": "scratch", "emptyDir": obj{}}}
		spec["containers"].([]obj)[0]["volumeMounts"] = []obj{{"name": "scratch", "mountPath": "/scratch"}}
		k.apply(t, p)
		pod := k.waitPod(t, ns, "again", 3*time.Minute, "running again after a restart", func(p kubePod) bool {
			return running(p) && p.Status.ContainerStatuses[0].RestartCount >= 1 && p.Status.ContainerStatuses[0].State.Running != nil
		})
		cs := pod.Status.ContainerStatuses[0]
		if cs.RestartCount != 1 || cs.LastState.Terminated == nil || cs.LastState.Terminated.ExitCode != 1 {
			t.Errorf("restarts %d, last state %+v, want 1 restart after exit 1", cs.RestartCount, cs.LastState.Terminated)
		}
		now, before := k.logs(t, ns, "again"), k.logs(t, ns, "again", "--previous")
		for _, l := range []string{before, now} {
			if !strings.Contains(l, "run uid=65532 gvisor=1") {
				t.Errorf("a run not under the role's profile in gVisor: %q", l)
			}
		}
		sandbox := k.sandboxOf(t, pod.Metadata.UID)
		starts := 0
		for _, r := range k.trail(t, sandbox) {
			if r.Event == "container/start" && r.Role == "baseline" && r.Process != nil && len(r.Process.Argv) > 0 && r.Process.Argv[0] == "sh" {
				starts++
			}
		}
		if starts < 2 {
			t.Errorf("trail: %d starts of the container's sh under baseline, want 2", starts)
		}
	})
}

// TestKubeTwoContainers: a two-container pod shares one sandbox (one runsc
// sandbox process) and one audit trail whose records carry the pod's name
// and namespace for both containers.
func TestKubeTwoContainers(t *testing.T) {
	k := kubeCluster(t)
	ns := k.namespace(t, "abx-two")
	p := podSpec(ns, "pair", "agentbox", "baseline", "sh", "-c", "cat /etc/hostname >/dev/null; sleep 3600")
	spec := p["spec"].(obj)
	spec["containers"] = append(spec["containers"].([]obj), obj{
		"name": "sidecar", "image": agentImage, "imagePullPolicy": "Never",
		"command": []string{"sh", "-c", "cat /etc/passwd >/dev/null; sleep 3600"},
	})
	k.apply(t, p)
	pod := k.waitPod(t, ns, "pair", 3*time.Minute, "Running with both containers", func(p kubePod) bool {
		return running(p) && len(p.Status.ContainerStatuses) == 2 && p.Status.ContainerStatuses[0].State.Running != nil && p.Status.ContainerStatuses[1].State.Running != nil
	})
	sandbox := k.sandboxOf(t, pod.Metadata.UID)
	boots := 0
	for _, cmd := range cmdlines() {
		if strings.HasPrefix(cmd, "runsc") && strings.Contains(cmd, " boot ") && strings.Contains(cmd, sandbox) {
			boots++
		}
	}
	if boots != 1 {
		t.Errorf("%d runsc sandboxes for the pod, want 1", boots)
	}
	ids := map[string]string{}
	for _, cs := range pod.Status.ContainerStatuses {
		ids[strings.TrimPrefix(cs.ContainerID, "containerd://")] = cs.Name
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		seen := map[string]bool{}
		var bad []string
		for _, r := range k.trail(t, sandbox) {
			if r.Container == "" {
				continue
			}
			if r.PodName != "pair" || r.PodNS != ns {
				bad = append(bad, fmt.Sprintf("seq %d: pod %s/%s", r.Seq, r.PodNS, r.PodName))
			}
			if name, ok := ids[r.Container]; ok && strings.HasPrefix(r.Event, "syscall/open") {
				seen[name] = true
			}
		}
		if len(bad) > 0 {
			t.Fatalf("records not joined with the pod: %v", bad)
		}
		if seen["main"] && seen["sidecar"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("file events in the pod's trail from %v, want main and sidecar", seen)
		}
		time.Sleep(time.Second)
	}
}

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
	cfg := filepath.Join(k.dir, "etc", "agentbox", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(orig, []byte("upstreams = []")) {
		t.Fatalf("the installed config has no `upstreams = []` to point at the test's DNS server:\n%s", orig)
	}
	os.WriteFile(cfg, bytes.Replace(orig, []byte("upstreams = []"), []byte(fmt.Sprintf("upstreams = [%q]", upstream.conn.LocalAddr().String())), 1), 0o644)
	t.Cleanup(func() { os.WriteFile(cfg, orig, 0o644) })
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
	upstream, err := newDNSServer("127.0.0.1:0", map[string]netip.Addr{"api.kube.test.": netip.MustParseAddr(nodeIP)})
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.conn.Close()
	cfg := filepath.Join(k.dir, "etc", "agentbox", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(k.dir, "realclients-ca.pem")
	if err := os.WriteFile(caFile, []byte(caPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(orig, []byte("upstreams = []"), []byte(fmt.Sprintf("upstreams = [%q]", upstream.conn.LocalAddr().String())), 1)
	if !bytes.Contains(edited, []byte(`upstream_ca_file = ""`)) {
		t.Fatalf("the installed config has no `upstream_ca_file = \"\"` to name the test's CA:\n%s", orig)
	}
	edited = bytes.Replace(edited, []byte(`upstream_ca_file = ""`), []byte(fmt.Sprintf("upstream_ca_file = %q", caFile)), 1)
	os.WriteFile(cfg, edited, 0o644)
	t.Cleanup(func() { os.WriteFile(cfg, orig, 0o644) })
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

// kubeAuditDir is the node's audit directory, when this run used the
// cluster.
func kubeAuditDir() string {
	if kube == nil || !kubeOurs {
		return ""
	}
	return filepath.Join(kube.dir, "varlog", "agentbox", "audit")
}
