//go:build e2e

package e2e

// The TestKube tests run pods through a real kubelet: hack/kube.sh's
// single-node cluster (etcd, kube-apiserver, controller-manager, scheduler,
// kubelet) on a private containerd, with agentbox installed on the node by
// the installer DaemonSet (examples/kubernetes). The first TestKube test
// brings the cluster up unless it is up already; TestMain takes down what
// it brought up.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	kubeOnce sync.Once
	kube     *kubeNode
	kubeErr  error
	// kubeOurs: the suite brought the cluster up and takes it down.
	kubeOurs bool
)

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
		// Running is the kubelet's word before the run's first line is
		// in its log: wait for the line.
		now, before := k.waitLogs(t, ns, "again", "run uid=", 30*time.Second), k.logs(t, ns, "again", "--previous")
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
	var seen map[string]bool
	var bad []string
	eventually(t, 30*time.Second, func() bool {
		seen, bad = map[string]bool{}, nil
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
		return len(bad) > 0 || seen["main"] && seen["sidecar"]
	})
	if len(bad) > 0 {
		t.Fatalf("records not joined with the pod: %v", bad)
	}
	if !seen["main"] || !seen["sidecar"] {
		t.Fatalf("file events in the pod's trail from %v, want main and sidecar", seen)
	}
}
