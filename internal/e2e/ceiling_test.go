//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// identityScript prints what a container runs with: its ids, capability
// sets, no_new_privs and seccomp mode as gVisor's kernel reports them,
// whether its root is mounted read-only (a user without write permission on
// / would get EACCES before EROFS: the mount says it) and /tmp writable, and whether syslog (allowed by
// the baseline syscall policy, denied by containerd's RuntimeDefault
// profile without CAP_SYSLOG) passes its seccomp filters.
const identityScript = `echo "ids $(id -u) $(id -g) [$(id -G)]"
grep -E '^(CapBnd|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
awk '$2 == "/" { split($4, o, ","); print "root=" (o[1] == "ro" ? "read-only" : "writable") " (" $3 ")" }' /proc/self/mounts
if echo x >/tmp/probe 2>/dev/null; then echo tmp=writable; else echo tmp=denied; fi
if dmesg >/dev/null 2>&1; then echo syslog=allowed; else echo syslog=denied; fi`

// runIdentity starts a container with the given CRI linux config, waits
// for it to exit and returns its output.
func (p *pod) runIdentity(t *testing.T, name string, linux map[string]any) string {
	t.Helper()
	id := p.containerWith(t, name, map[string]any{"command": []string{"sh", "-c", identityScript}, "linux": linux})
	if code := waitState(t, id, "CONTAINER_EXITED"); code != 0 {
		t.Fatalf("%s exited %d", name, code)
	}
	var logs result
	for i := 0; i < 50; i++ {
		if logs = dev.crictl(30*time.Second, "logs", id); strings.Contains(logs.stdout, "syslog=") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return logs.stdout
}

func expectLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: no %q in\n%s", what, w, out)
		}
	}
}

func sc(fields map[string]any) map[string]any { return map[string]any{"security_context": fields} }

// TestCeilingThroughCRI: the role bounds what a pod asks for. Under
// baseline, a pod asking for uid 1000, a read-only root, no capabilities,
// no_new_privs and containerd's RuntimeDefault seccomp profile gets
// exactly that (the profile's own denials apply on top of the role's);
// its twin that asks nothing gets the role's defaults. What exceeds the
// role is refused with the field named; within a narrower role, ids and
// capabilities are kept only inside it. Under an overlay role, a container
// asking for a read-only root gets one.
func TestCeilingThroughCRI(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p, r := tryPod(t, "ceiling", "default", nil)
	if r.code != 0 {
		t.Fatalf("runp: %v", r)
	}
	restricted := p.runIdentity(t, "restricted", sc(map[string]any{
		"run_as_user":         map[string]any{"value": 1000},
		"run_as_group":        map[string]any{"value": 1000},
		"supplemental_groups": []int{2000},
		"readonly_rootfs":     true,
		"no_new_privs":        true,
		"capabilities":        map[string]any{"drop_capabilities": []string{"ALL"}},
		"seccomp":             map[string]any{"profile_type": 0}, // RuntimeDefault
	}))
	expectLines(t, "restricted", restricted, "ids 1000 1000 [1000 2000]", "CapBnd:\t0000000000000000", "CapEff:\t0000000000000000",
		"NoNewPrivs:\t1", "Seccomp:\t2", "root=read-only", "tmp=writable", "syslog=denied")

	plain := p.runIdentity(t, "plain", nil)
	expectLines(t, "asks nothing", plain, "ids 65532 65532", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2",
		"root=read-only", "syslog=allowed")

	// A pod's in-place resize (the CRI's UpdateContainerResources) stays
	// under its role (baseline: 512Mi, one CPU): lower passes, above is
	// refused with the field named.
	resize := p.container(t, "resize", "sleep", "600")
	if r := dev.crictl(60*time.Second, "update", "--memory", fmt.Sprint(256<<20), resize); r.code != 0 {
		t.Errorf("a resize to 256Mi, under the role: %v", r)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory", fmt.Sprint(1 << 30)}, "linux.resources.memory.limit 1073741824"},
		{[]string{"--cpu-quota", "200000", "--cpu-period", "100000"}, "is 2000m"},
	} {
		r := dev.crictl(60*time.Second, append(append([]string{"update"}, tc.args...), resize)...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("a resize above the role (%v): %v, want %q", tc.args, r, tc.want)
		}
	}
	dev.crictl(30*time.Second, "rm", "-f", resize)

	// Beyond baseline: a capability outside the runtime's defaults, and a
	// privileged container.
	p.startFails(t, "net-admin", map[string]any{"linux": sc(map[string]any{"capabilities": map[string]any{"add_capabilities": []string{"NET_ADMIN"}}})},
		`process.capabilities: CAP_NET_ADMIN not granted by role "baseline"`)

	// A narrower role: ids and capabilities inside it are kept, outside
	// refused.
	np, r := tryPod(t, "narrow", "e2e-narrow", map[string]string{"agentbox.dev/role": "e2e-narrow"})
	if r.code != 0 {
		t.Fatalf("runp narrow: %v", r)
	}
	inside := np.runIdentity(t, "inside", sc(map[string]any{
		"run_as_user":         map[string]any{"value": 1500},
		"run_as_group":        map[string]any{"value": 2500},
		"supplemental_groups": []int{1000},
		"capabilities":        map[string]any{"drop_capabilities": []string{"NET_RAW"}},
	}))
	// CAP_NET_BIND_SERVICE is bit 10: the one runtime default the role grants.
	expectLines(t, "narrow, inside", inside, "ids 1500 2500 [2500 1000]", "CapBnd:\t0000000000000400", "CapEff:\t0000000000000400",
		"CapAmb:\t0000000000000400", "NoNewPrivs:\t1")
	np.startFails(t, "uid-outside", map[string]any{"linux": sc(map[string]any{"run_as_user": map[string]any{"value": 2500}})},
		`process.user.uid: uid 2500 is not allowed by role "e2e-narrow"`)
	np.startFails(t, "group-outside", map[string]any{"linux": sc(map[string]any{"run_as_user": map[string]any{"value": 1500}, "supplemental_groups": []int{5000}})},
		`process.user.additionalGids[1]: gid 5000 is not allowed by role "e2e-narrow"`)

	// researcher's rootfs is an in-memory overlay: writable unless the
	// container asks for a read-only root.
	rp, r := tryPod(t, "overlay", "research", map[string]string{"agentbox.dev/role": "researcher"})
	if r.code != 0 {
		t.Fatalf("runp research: %v", r)
	}
	expectLines(t, "overlay, asks read-only", rp.runIdentity(t, "ro", sc(map[string]any{"readonly_rootfs": true})), "root=read-only")
	expectLines(t, "overlay, asks nothing", rp.runIdentity(t, "rw", nil), "root=writable")
}
