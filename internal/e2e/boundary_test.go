//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/policy"
)

// The boundary against pod authors and agents: one test per class of
// escape. Each shows the attempt refused or blocked, with its message, and
// the legitimate twin working.

// expectRefused checks that a ctr run was refused with want in its error.
func expectRefused(t *testing.T, r result, want string) {
	t.Helper()
	if r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Fatalf("want a refusal with %q, got %v", want, r)
	}
}

// startFails creates a CRI container and expects its start to be refused
// by the shim with want in the message.
func (p *pod) startFails(t *testing.T, name string, extra map[string]any, want string) {
	t.Helper()
	if extra["command"] == nil {
		extra["command"] = []string{"true"}
	}
	c := p.tryContainer(t, name, extra)
	if c.code != 0 {
		if strings.Contains(unescape(c.stderr), want) {
			return
		}
		t.Fatalf("create %s: %v", name, c)
	}
	r := dev.crictl(60*time.Second, "start", strings.TrimSpace(c.stdout))
	if r.code == 0 || !strings.Contains(unescape(r.stderr), want) {
		t.Fatalf("%s: want the start refused with %q, got %v", name, want, r)
	}
}

// kubeletPodDir makes the kubelet's directory of a pod's UID, as a kubelet
// would (the private containerd's cri.kubelet_root).
func kubeletPodDir(t *testing.T, uid string) string {
	t.Helper()
	dir := filepath.Join(dev.dir, "kubelet", "pods", uid)
	for _, d := range []string{"volumes/kubernetes.io~secret/creds", "volumes/kubernetes.io~empty-dir/scratch", "containers/c", "volumes/kubernetes.io~projected/kube-api-access-x"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "volumes/kubernetes.io~empty-dir/scratch"), 0o777)
	os.WriteFile(filepath.Join(dir, "volumes/kubernetes.io~secret/creds/token"), []byte("secret-of-"+uid+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "volumes/kubernetes.io~projected/kube-api-access-x/token"), []byte("sa-token-of-"+uid+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "containers/c/termlog"), nil, 0o666)
	os.Chmod(filepath.Join(dir, "containers/c/termlog"), 0o666) // as the kubelet does
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Class 1: runtime mounts are recognised by where they provably are: this
// pod's kubelet directory (by UID) and containerd's directories for its
// sandbox id. Never by name or by prefix text.
func TestBoundaryPodVolumes(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "vols", "team", nil)
	own := kubeletPodDir(t, p.uid)
	other := kubeletPodDir(t, uniqueID("other-uid"))

	// The pod's own volumes work under baseline: its secret read-only, its
	// emptyDir writable but noexec, its termination message writable.
	id := p.containerWith(t, "c", map[string]any{
		"command": []string{"sh", "-c", `cat /creds/token; echo done > /work/f && cat /work/f
			cp /bin/busybox /work/busybox; /work/busybox echo emptydir-exec-ran; echo "emptydir exec status $?"
			echo "terminated: reason" > /dev/termination-log && echo termlog-written
			echo x > /creds/new 2>/dev/null || echo secret-read-only; sleep 600`},
		"mounts": []map[string]any{
			{"container_path": "/creds", "host_path": own + "/volumes/kubernetes.io~secret/creds", "readonly": true},
			{"container_path": "/work", "host_path": own + "/volumes/kubernetes.io~empty-dir/scratch"},
			{"container_path": "/dev/termination-log", "host_path": own + "/containers/c/termlog"},
		},
	})
	logs := waitLogs(t, id, "secret-read-only")
	for _, want := range []string{"secret-of-" + p.uid, "done", "emptydir exec status 126", "termlog-written", "secret-read-only"} {
		if !strings.Contains(logs.stdout+logs.stderr, want) {
			t.Fatalf("own volumes: %q missing: %v", want, logs)
		}
	}
	if strings.Contains(logs.stdout, "emptydir-exec-ran") {
		t.Fatalf("a binary written to an emptyDir ran: %v", logs)
	}
	if b, _ := os.ReadFile(own + "/containers/c/termlog"); string(b) != "terminated: reason\n" {
		t.Fatalf("termination message did not reach the host file: %q", b)
	}

	// An image VOLUME: containerd's CRI made it for this container.
	vid := p.containerWith(t, "imgvol", map[string]any{
		"image":   map[string]any{"image": probeImage},
		"command": []string{"sh", "-c", "echo kept > /var/lib/probe/f && cat /var/lib/probe/f && echo image-volume-ok; sleep 600"},
	})
	if logs := waitLogs(t, vid, "image-volume-ok"); !strings.Contains(logs.stdout, "kept") {
		t.Fatalf("an image volume must be writable: %v", logs)
	}

	// Another pod's secret, a walk out of this pod's directory, the
	// projected token volume at another place, and a host file that only
	// carries a runtime file's name are all refused.
	fake := t.TempDir()
	os.WriteFile(filepath.Join(fake, "hosts"), []byte("6.6.6.6 evil\n"), 0o644)
	for name, m := range map[string]map[string]any{
		"other-pod": {"container_path": "/creds", "host_path": other + "/volumes/kubernetes.io~secret/creds"},
		"dotdot":    {"container_path": "/dev/termination-log", "host_path": own + "/containers/../../../../../../../etc/passwd"},
		"projected": {"container_path": "/tok", "host_path": own + "/volumes/kubernetes.io~projected/kube-api-access-x"},
		"by-name":   {"container_path": "/etc/hosts", "host_path": filepath.Join(fake, "hosts")},
	} {
		p.startFails(t, name, map[string]any{"mounts": []map[string]any{m}}, "mounts not allowed by role \"baseline\"")
	}
}

// Class 2: a symlink an agent plants in a writable host mount does not
// redirect a later container's mount: sources are resolved without
// following any symlink, and the opened file is what gets mounted.
func TestBoundarySymlinkInHostMount(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	rw := filepath.Join(dev.dir, "rw")
	t.Cleanup(func() { os.Remove(filepath.Join(rw, "link")) })
	ann := []string{"--annotation", "agentbox.dev/role=e2e-rwvol"}
	// The agent plants rw/link -> / through its writable mount, and what
	// it writes there does not run.
	r := dev.runAgent(t, uniqueID("plant"), append(ann, "--mount", "type=bind,src="+rw+",dst=/data,options=rbind:rw"), "sh", "-c",
		`ln -s / /data/link && echo planted; cp /bin/busybox /data/busybox; /data/busybox echo hostmount-exec-ran; echo "exec status $?"; rm -f /data/busybox`)
	expectCode(t, r, 0, "planted", "exec status 126")
	if strings.Contains(r.stdout, "hostmount-exec-ran") {
		t.Fatalf("a binary written to a writable host mount ran: %v", r)
	}
	if target, err := os.Readlink(filepath.Join(rw, "link")); err != nil || target != "/" {
		t.Fatalf("the planted symlink is not on the host (%q, %v): the test proves nothing", target, err)
	}
	// A later container names ALLOWED/link/etc: text under the allowlist,
	// the host's /etc on the disk.
	r = dev.runAgent(t, uniqueID("follow"), append(ann, "--mount", "type=bind,src="+rw+"/link/etc,dst=/hostetc,options=rbind:ro"), "cat", "/hostetc/hostname")
	expectRefused(t, r, "symlink component")
	// The legitimate twin: a real directory below the allowed path.
	r = dev.runAgent(t, uniqueID("sub"), append(ann, "--mount", "type=bind,src="+rw+"/sub,dst=/sub,options=rbind:ro"), "cat", "/sub/data.txt")
	expectCode(t, r, 0, "rw-data")
}

// Class 3: mounts that are not binds are limited to what a runtime adds.
func TestBoundaryNonBindMount(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := dev.runAgent(t, uniqueID("tmpfs"), []string{"--mount", "type=tmpfs,src=tmpfs,dst=/mnt,options=exec"}, "true")
	expectRefused(t, r, "tmpfs at /mnt: not a mount a runtime adds")
	// The runtime's own (proc, dev, shm, /run, ...) are accepted, hardened.
	r = dev.runAgent(t, uniqueID("mounts"), nil, "sh", "-c", "grep -E ' /(dev/shm|run) ' /proc/mounts")
	expectCode(t, r, 0, "/dev/shm", "/run")
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if !strings.Contains(l, "noexec") || !strings.Contains(l, "nosuid") {
			t.Fatalf("runtime scratch must be nosuid,noexec: %q", l)
		}
	}
}

// Class 4: the agent cannot run what it wrote: no new namespaces (clone
// flags, clone3, unshare, setns), no mounts, no memfd, and every writable
// place noexec. Tried by abx-probe, a static program, inside gVisor; the
// twin role that allows those classes shows the probe would succeed.
func TestBoundaryNoExecOfWrittenCode(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	probe := func(role, what string) result {
		return dev.ctr(90*time.Second, "run", "--rm", "--runtime", runtimeType, "--annotation", "agentbox.dev/role="+role, probeImage, uniqueID("probe"), "abx-probe", what)
	}
	blocked := map[string][]string{
		"userns":  {"clone-newuser errno=EPERM"},
		"unshare": {"unshare-newuser errno=EPERM"},
		"setns":   {"setns errno=EPERM"},
		"clone3":  {"clone3 errno=ENOSYS"},
		"mount":   {"mount errno=EPERM"},
		"memfd":   {"memfd_create errno=EPERM"},
		"others": {"bpf errno=EPERM", "keyctl errno=EPERM", "userfaultfd errno=EPERM", "perf_event_open errno=EPERM",
			"ptrace errno=EPERM", "process_vm_readv errno=EPERM", "pivot_root errno=EPERM"},
	}
	for what, want := range blocked {
		r := probe("baseline", what)
		expectCode(t, r, 0, want...)
		if strings.Contains(r.stdout, "-ran") {
			t.Fatalf("%s: code the agent wrote ran: %v", what, r)
		}
	}
	// Threads (glibc's clone3 falls back to clone on ENOSYS) and fork work.
	expectCode(t, probe("baseline", "legit"), 0, "pthread_create ok", "fork ok")
	// /dev/shm is noexec (CRI's and ctr's alike).
	r := dev.runAgent(t, uniqueID("shm"), nil, "sh", "-c", `cp /bin/busybox /dev/shm/busybox; /dev/shm/busybox echo shm-exec-ran; echo "shm exec status $?"`)
	expectCode(t, r, 0, "shm exec status 126")
	// The twin: a role that allows the namespaces, mount and memfd classes.
	// The same probes then get through, so the refusals above are the
	// policy's doing, not the probe's.
	r = probe("e2e-ns", "userns")
	expectCode(t, r, 0, "clone-newuser ok", "child-mount ok", "userns-exec-ran")
	expectCode(t, probe("e2e-ns", "memfd"), 0, "memfd_create ok", "memfd-exec-ran")
	expectCode(t, probe("e2e-ns", "clone3"), 0, "clone3 ok")
}

// Class 5: host options are refused with the field named; a pod without
// them runs.
func TestBoundaryHostOptions(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	const node = 2 // CRI NamespaceMode NODE
	for name, tc := range map[string]struct {
		linux map[string]any
		want  string
	}{
		"host-network": {map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": node}}}, "no network namespace (host network)"},
		"host-pid":     {map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": node}}}, "no pid namespace (host PID)"},
		"host-ipc":     {map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"ipc": node}}}, "no ipc namespace (host IPC)"},
		"sysctl":       {map[string]any{"sysctls": map[string]string{"kernel.msgmax": "65536"}}, `linux.sysctl["kernel.msgmax"]: not a safe sysctl`},
	} {
		_, r := tryPodWith(t, name, "team", nil, tc.linux)
		if r.code == 0 || !strings.Contains(unescape(r.stderr), tc.want) {
			t.Errorf("%s: want the pod refused with %q, got %v", name, tc.want, r)
		}
	}
	// A safe sysctl is fine; a privileged container in that pod is not.
	p, r := tryPodWith(t, "safe", "team", nil, map[string]any{"sysctls": map[string]string{"net.ipv4.ping_group_range": "0 65535"}})
	if r.code != 0 {
		t.Fatalf("a pod with a safe sysctl must run: %v", r)
	}
	id := p.container(t, "ok", "sh", "-c", "echo pod-runs; sleep 600")
	if logs := waitLogs(t, id, "pod-runs"); !strings.Contains(logs.stdout, "pod-runs") {
		t.Fatalf("the legitimate container did not run: %v", logs)
	}
	// A privileged pod's sandbox (pause) carries nothing privileged; each
	// privileged container in it is refused.
	pp, r := tryPodWith(t, "priv", "team", nil, map[string]any{"security_context": map[string]any{"privileged": true}})
	if r.code != 0 {
		t.Fatalf("runp: %v", r)
	}
	pp.startFails(t, "priv", map[string]any{"linux": map[string]any{"security_context": map[string]any{"privileged": true}}}, "agentbox does not run privileged containers")
	// A device through ctr: one this machine has (ctr stats it first;
	// /dev/kvm is not on every VM).
	device := ""
	for _, d := range []string{"/dev/kvm", "/dev/fuse", "/dev/loop-control", "/dev/net/tun"} {
		if _, err := os.Stat(d); err == nil {
			device = d
			break
		}
	}
	if device == "" {
		t.Fatal("none of /dev/kvm, /dev/fuse, /dev/loop-control, /dev/net/tun on this machine to ask for")
	}
	r = dev.runAgent(t, uniqueID("dev"), []string{"--device", device}, "true")
	expectRefused(t, r, "device "+device+" is not allowed")
}

// Class 6: outside containerd's CRI namespace the CRI's annotations are
// anybody's: a ctr container claiming a pod namespace binds nothing.
func TestBoundaryBindingOutsideCRI(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := dev.runAgent(t, uniqueID("forge"), []string{"--annotation", "agentbox.dev/role=coder",
		"--annotation", "io.kubernetes.cri.container-type=sandbox", "--annotation", "io.kubernetes.cri.sandbox-namespace=agents"}, "echo", "should-not-run")
	if r.code == 0 || strings.Contains(r.stdout, "should-not-run") || !strings.Contains(r.stderr, `role "coder" is not bound to containerd namespace "default"`) {
		t.Fatalf("a forged pod namespace must not bind: %v", r)
	}
	// The real pod in namespace agents claims coder (TestEscapeUnboundRole
	// shows it running); here the ctr twin under baseline runs.
	expectCode(t, dev.runAgent(t, uniqueID("plain"), nil, "echo", "runs"), 0, "runs")
}

// The smaller items: an odd-cased agentbox key is refused, a container id
// can be reused (each run its own trail), and an editor's lock file in the
// policy directory does not stop anything.
func TestBoundarySmallerItems(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := dev.runAgent(t, uniqueID("case"), []string{"--annotation", "Agentbox.dev/role=researcher"}, "true")
	expectRefused(t, r, "annotation Agentbox.dev/role: agentbox reads agentbox.dev/* keys in lower case only")
	lock := filepath.Join(dev.dir, "agentbox", "policies", ".#zz-e2e.yaml")
	if err := os.Symlink("root@node.4242:1700000000", lock); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(lock)
	id := uniqueID("reuse")
	for i := 0; i < 2; i++ {
		expectCode(t, dev.runAgent(t, id, nil, "echo", "run"), 0, "run")
	}
	for _, f := range []string{id + ".jsonl", id + "@2.jsonl"} {
		if b, err := os.ReadFile(filepath.Join(dev.dir, "audit", f)); err != nil || !strings.Contains(string(b), "agentbox/sandbox_end") {
			t.Fatalf("trail %s of a reused id: %v", f, err)
		}
	}
	v := dev.run(30*time.Second, "agentbox", "audit", "verify", filepath.Join(dev.dir, "audit", id+".jsonl"), filepath.Join(dev.dir, "audit", id+"@2.jsonl"))
	if v.code != 0 || strings.Count(v.stdout, "OK") != 2 {
		t.Fatalf("both trails must verify: %v", v)
	}
}

// The clone3 ENOSYS rule needs a runsc that honours errnoRet: doctor boots
// a sandbox to check it (a stock runsc answers EPERM and glibc threads
// fail under the baseline policy).
func TestBoundaryDoctorChecksSeccompErrno(t *testing.T) {
	requireEnv(t)
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "agentbox-doctor-*"))
	r := dev.run(90*time.Second, "agentbox", "doctor", "--address", dev.sock, "--config", filepath.Join(dev.dir, "agentbox", "config.toml"))
	if !strings.Contains(r.stdout, "PASS  seccomp      runsc honours errnoRet") {
		t.Fatalf("doctor must find the shipped runsc honouring errnoRet: %v", r)
	}
	// Its test sandbox leaves nothing: no directory, no mount.
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "agentbox-doctor-*"))
	if len(after) > len(before) {
		t.Errorf("doctor left %d directories (%v)", len(after)-len(before), after)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, d := range after {
		if strings.Contains(string(mounts), d+"/") {
			t.Errorf("doctor left a mount under %s", d)
		}
	}
}

// TestBoundaryRecursiveReadOnly: the handler advertises "rro", so the CRI
// accepts a recursive read-only mount; the mount and a submount below it
// are read-only inside, and the pod's other files work.
func TestBoundaryRecursiveReadOnly(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	shared := filepath.Join(dev.dir, "shared")
	sub := filepath.Join(shared, "sub")
	os.MkdirAll(sub, 0o777)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", sub).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", sub).Run(); os.Remove(sub) })
	p := newPodIn(t, "rro", "team", map[string]string{"agentbox.dev/role": "e2e-volumes"})
	id := p.containerWith(t, "c", map[string]any{
		"command": []string{"sh", "-c", "cat /models/model.txt; echo x > /models/sub/f 2>/dev/null || echo sub-read-only; echo x > /models/f 2>/dev/null || echo top-read-only; sleep 600"},
		"mounts":  []map[string]any{{"container_path": "/models", "host_path": shared, "readonly": true, "recursive_read_only": true}},
	})
	logs := waitLogs(t, id, "top-read-only")
	for _, want := range []string{"weights", "sub-read-only", "top-read-only"} {
		if !strings.Contains(logs.stdout, want) {
			t.Fatalf("rro mount: %q missing: %v", want, logs)
		}
	}
	if _, err := os.Stat(filepath.Join(sub, "f")); err == nil {
		t.Fatal("a write reached the host through the recursive read-only mount")
	}
	// After the start the container's mounts are runsc's alone: an exec
	// still reads them, and the host can take its directory apart while
	// the pod runs (critest's rro spec does), which a mount the shim kept
	// in the host's namespace made EBUSY.
	if r := dev.crictl(30*time.Second, "exec", id, "cat", "/models/model.txt"); r.code != 0 || !strings.Contains(r.stdout, "weights") {
		t.Fatalf("exec after start: %v", r)
	}
	if out, err := exec.Command("umount", "-l", sub).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	if err := os.Remove(sub); err != nil {
		t.Fatalf("the host cannot remove the directory a running pod's mount was under: %v", err)
	}
}

// TestBoundaryMaskedPaths: runsc ignores linux.maskedPaths, so the shim
// mounts over them. A role's masked file reads empty and cannot be
// written, its masked directory lists nothing and takes no file, while
// their twins (/etc/group, /bin) read as before.
func TestBoundaryMaskedPaths(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	script := `echo "passwd=$(wc -c </etc/passwd)"; echo "group=$(wc -c </etc/group)"
echo "localbin=$(ls /usr/local/bin | wc -l)"; echo "binfiles=$(ls /bin | wc -l)"
if echo x >>/etc/passwd 2>/dev/null; then echo passwd-written; fi
if touch /usr/local/bin/new 2>/dev/null; then echo localbin-written; fi
grep -E ' /(etc/passwd|usr/local/bin) ' /proc/self/mounts | cut -d' ' -f2-4`
	r := dev.runAgent(t, uniqueID("mask"), []string{"--annotation", "agentbox.dev/role=e2e-masked"}, "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	t.Logf("masked:\n%s", r.stdout)
	for _, want := range []string{"passwd=0\n", "localbin=0\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("not masked: want %q in\n%s", want, r.stdout)
		}
	}
	for _, bad := range []string{"group=0\n", "binfiles=0\n", "passwd-written", "localbin-written"} {
		if strings.Contains(r.stdout, bad) {
			t.Errorf("%q in\n%s", bad, r.stdout)
		}
	}
	// The twin: the same container under baseline sees both.
	r = dev.runAgent(t, uniqueID("mask-twin"), nil, "sh", "-c", script)
	if r.code != 0 || strings.Contains(r.stdout, "passwd=0\n") || strings.Contains(r.stdout, "localbin=0\n") {
		t.Errorf("baseline hides them too:\n%v", r)
	}
}

// TestMaskedPathsGVisorTable checks the shim's table of what gVisor has
// at the paths runtimes mask or make read-only against a real sandbox: a
// gVisor upgrade that adds one must update the table (or a masked path
// would be left visible).
func TestMaskedPathsGVisorTable(t *testing.T) {
	requireEnv(t)
	paths := policy.GVisorPaths()
	script := `for p in "$@"; do if [ -d $p ]; then echo "$p dir"; elif [ -e $p ]; then echo "$p file"; else echo "$p absent"; fi; done`
	r := dev.runAgent(t, uniqueID("gvtable"), nil, append([]string{"sh", "-c", script, "sh"}, paths...)...)
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	for _, p := range paths {
		k, _ := policy.GVisorPathKind(p)
		want := fmt.Sprintf("%s %s\n", p, k)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("gVisor's %s is not what the table says (%q):\n%s", p, strings.TrimSpace(want), r.stdout)
		}
	}
}

// TestBoundaryCRIPathsFromThePodAuthor: the CRI lets a pod author name
// masked and read-only paths (the container's security context). A masked
// image file reads empty beside its readable twin; a read-only path in the
// read-only image holds, and one in writable scratch, which agentbox
// cannot make read-only, refuses the container naming the field.
func TestBoundaryCRIPathsFromThePodAuthor(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "paths", "team", map[string]string{"agentbox.dev/role": "baseline"})
	sc := func(masked, readonly []string) map[string]any {
		return map[string]any{"security_context": map[string]any{"masked_paths": masked, "readonly_paths": readonly}}
	}
	id := p.containerWith(t, "ok", map[string]any{
		"command": []string{"sh", "-c", `echo "passwd=$(wc -c </etc/passwd) group=$(wc -c </etc/group)"; echo x >/etc/x 2>/dev/null || echo etc-read-only; echo x >/tmp/x && echo tmp-writable; echo done; sleep 600`},
		"linux":   sc([]string{"/etc/passwd", "/proc/kcore"}, []string{"/etc", "/proc/sys"}),
	})
	logs := waitLogs(t, id, "done")
	for _, want := range []string{"passwd=0 ", "etc-read-only", "tmp-writable"} {
		if !strings.Contains(logs.stdout, want) {
			t.Errorf("%q missing:\n%s", want, logs.stdout)
		}
	}
	if strings.Contains(logs.stdout, "group=0\n") {
		t.Errorf("the twin /etc/group is hidden too:\n%s", logs.stdout)
	}
	p.startFails(t, "ro-scratch", map[string]any{"linux": sc(nil, []string{"/tmp/keep"})}, "linux.readonlyPaths[0]: /tmp/keep is in the writable mount /tmp")
}
