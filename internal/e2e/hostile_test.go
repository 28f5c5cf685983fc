//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A hostile agent cannot blind, forge or flood: the resolver, private
// answers, the audit trail's readers and storage.

// configVariant writes a copy of the private containerd's shim config with
// old replaced by new (once), for --runtime-config-path, and fails the test
// if old is not there.
func configVariant(t *testing.T, old, new string) string {
	t.Helper()
	base, err := os.ReadFile(filepath.Join(dev.dir, "agentbox", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(base), old) {
		t.Fatalf("the shim config has no %q to change", old)
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(strings.Replace(string(base), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// shimRSS is the resident set of the shim serving a sandbox, in KiB.
func shimRSS(t *testing.T, sandboxID string) int {
	t.Helper()
	if pid := shimPID(sandboxID); pid != 0 {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
	}
	t.Fatalf("no shim process for sandbox %s", sandboxID)
	return 0
}

// TestHostileResolverFlood: an agent that opens hundreds of TCP connections
// to its pod's resolver, each announcing a 64 KiB frame, does not grow the
// shim (memory outside the pod's cgroup), and the resolver keeps answering.
func TestHostileResolverFlood(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "flood", "e2e-dns", map[string]string{"agentbox.dev/role": "e2e-dns"})
	before := shimRSS(t, p.id)
	id := p.containerWith(t, "flooder", map[string]any{
		"image": map[string]any{"image": probeImage},
		"command": []string{"sh", "-c", "abx-probe dnsflood 800 20 & sleep 4; nslookup " + dnsAllowed + " >/dev/null 2>&1; echo lookup-during-flood rc=$?; " +
			"echo flooding; wait; echo flood-over; sleep 600"},
	})
	logs := waitLogs(t, id, "flooding")
	during := shimRSS(t, p.id)
	out := logs.stdout
	t.Logf("shim RSS: %d KiB before, %d KiB during the flood (%s)", before, during, strings.TrimSpace(strings.Split(out, "\n")[0]))
	if !strings.Contains(out, "dnsflood opened") || !strings.Contains(out, "lookup-during-flood rc=0") {
		t.Fatalf("flood or lookup: %v", logs)
	}
	if during-before > 32<<10 {
		t.Errorf("the shim grew by %d KiB under the flood", during-before)
	}
	p.remove()
	for _, r := range readTrail(t, p.id) {
		if r.Event == "agentbox/resolver_stopped" {
			if n, _ := strconv.Atoi(r.Detail["tcp_connections_rejected"]); n < 100 {
				t.Errorf("the resolver rejected %d connections, want most of 800: %v", n, r.Detail)
			}
			return
		}
	}
	t.Error("no resolver_stopped record")
}

// TestHostileAuditFlood: a flooder and a victim share a small audit
// filesystem. The flooder fills its quota, is held back, then stopped with
// the reason in its trail; the victim's records are complete. A sandbox
// whose trail cannot reserve its space does not start.
func TestHostileAuditFlood(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	fsDir := filepath.Join(t.TempDir(), "auditfs")
	os.MkdirAll(fsDir, 0o755)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", fsDir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", fsDir).Run() })
	cfg := configVariant(t, "[audit]\ndir = \""+filepath.Join(dev.dir, "audit")+"\"",
		"[audit]\ndir = \""+fsDir+"\"\nmax_sandbox_bytes = 4194304\nmin_free_bytes = 8388608\nreserve_bytes = 1048576\non_full = \"stop\"\nfull_grace_seconds = 2")
	rt := []string{"--runtime-config-path", cfg}

	flooder := uniqueID("flooder")
	r := dev.ctr(60*time.Second, append(append([]string{"run", "-d", "--runtime", runtimeType}, rt...), agentImage, flooder,
		"sh", "-c", `i=0; while :; do true 2>/dev/null </nope$i; i=$((i+1)); done`)...)
	if r.code != 0 {
		t.Fatalf("flooder: %v", r)
	}
	defer dev.removeContainer(flooder)
	time.Sleep(time.Second)
	// The victim runs beside it and does 200 known things.
	victim := uniqueID("victim")
	v := dev.ctr(90*time.Second, append(append([]string{"run", "--rm", "--runtime", runtimeType}, rt...), agentImage, victim,
		"sh", "-c", `for i in $(seq 1 200); do true 2>/dev/null </victim-$i; done; echo victim-done`)...)
	expectCode(t, v, 0, "victim-done")
	trail, _ := os.ReadFile(filepath.Join(fsDir, victim+".jsonl"))
	for i := 1; i <= 200; i++ {
		if !strings.Contains(string(trail), fmt.Sprintf(`"path":"/victim-%d"`, i)) {
			t.Fatalf("the victim's open of /victim-%d is missing from its trail", i)
		}
	}
	if vr := dev.run(30*time.Second, "agentbox", "audit", "verify", filepath.Join(fsDir, victim+".jsonl")); vr.code != 0 || !strings.HasPrefix(vr.stdout, "OK") {
		t.Fatalf("the victim's trail must verify complete: %v", vr)
	}
	// The flooder is stopped (137), with the reason in its trail.
	var ftrail []byte
	eventually(t, 60*time.Second, func() bool {
		ftrail, _ = os.ReadFile(filepath.Join(fsDir, flooder+".jsonl"))
		return strings.Contains(string(ftrail), `"exit_status":"137"`)
	})
	for _, want := range []string{`"event_code":"agentbox/audit_full"`, `"limit":"audit"`, "the sandbox's quota", `"event_code":"agentbox/container_exit"`, `"exit_status":"137"`} {
		if !strings.Contains(string(ftrail), want) {
			t.Errorf("the flooder's trail lacks %s", want)
		}
	}
	st, _ := os.Stat(filepath.Join(fsDir, flooder+".jsonl"))
	t.Logf("flooder's trail: %d bytes (quota 4 MiB)", st.Size())
	if st.Size() > 5<<20 {
		t.Errorf("the flooder's trail passed its quota: %d bytes", st.Size())
	}
	dev.removeContainer(flooder)
	fr := dev.run(30*time.Second, "agentbox", "audit", "verify", filepath.Join(fsDir, flooder+".jsonl"))
	t.Logf("verify: %s", strings.TrimSpace(fr.stdout))
	if strings.HasPrefix(fr.stdout, "FAIL") {
		t.Errorf("the flooder's chain must stay intact: %v", fr)
	}
	checkOCSF(t, fsDir)

	// Filled by something else, the filesystem cannot hold a new trail's
	// reserve beyond what is kept free: the sandbox does not start.
	var sfs unix.Statfs_t
	unix.Statfs(fsDir, &sfs)
	free := int64(sfs.Bavail) * int64(sfs.Bsize)
	filler := filepath.Join(fsDir, "filler")
	if err := os.WriteFile(filler, make([]byte, free-8<<20-512<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	r = dev.ctr(60*time.Second, append(append([]string{"run", "--rm", "--runtime", runtimeType}, rt...), agentImage, uniqueID("late"), "echo", "should-not-run")...)
	expectRefused(t, r, "min_free_bytes")
	os.Remove(filler)
	expectCode(t, dev.ctr(60*time.Second, append(append([]string{"run", "--rm", "--runtime", runtimeType}, rt...), agentImage, uniqueID("late"), "echo", "runs")...), 0, "runs")
}

// TestHostileEventRate: past max_events_per_second a sandbox is slowed,
// not its events dropped: all 10000 of its failing opens are in the trail,
// with no gap. The slowdown is logged (measured, not asserted).
func TestHostileEventRate(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	limited := configVariant(t, "[audit]\n", "[audit]\nmax_events_per_second = 4000\n")
	const opens = 10000
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do true 2>/dev/null </rate-$i; i=$((i+1)); done; echo opens-done`, opens)
	run := func(extra ...string) (time.Duration, string) {
		id := uniqueID("rate")
		start := time.Now()
		r := dev.ctr(180*time.Second, append(append([]string{"run", "--rm", "--runtime", runtimeType}, extra...), agentImage, id, "sh", "-c", script)...)
		took := time.Since(start)
		expectCode(t, r, 0, "opens-done")
		return took, id
	}
	free, _ := run()
	slow, id := run("--runtime-config-path", limited)
	trail := filepath.Join(dev.dir, "audit", id+".jsonl")
	b, _ := os.ReadFile(trail)
	if n := strings.Count(string(b), `"path":"/rate-`); n != opens {
		t.Errorf("%d of %d opens recorded under the rate bound", n, opens)
	}
	v := dev.run(30*time.Second, "agentbox", "audit", "verify", trail)
	if v.code != 0 || !strings.HasPrefix(v.stdout, "OK") {
		t.Errorf("a rate-bound trail must be complete: %v", v)
	}
	t.Logf("%d events: %v unbounded, %v at 4000/s (%.2fx)", opens, free.Round(time.Millisecond), slow.Round(time.Millisecond), float64(slow)/float64(free))
}

// TestHostileFileNamesInTail: a file name with a newline and a forged
// record in it stays one line in `agentbox audit tail`; -o json is exact.
func TestHostileFileNamesInTail(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("names")
	forged := "x\n09:00:00.000 " + id + " #99 agentbox/sandbox_end role=baseline Success"
	r := dev.runAgent(t, id, nil, "sh", "-c", `true 2>/dev/null <"/tmp/$(printf 'x\n09:00:00.000 `+id+` #99 agentbox/sandbox_end role=baseline Success')"; echo named`)
	expectCode(t, r, 0, "named")
	trail := filepath.Join(dev.dir, "audit", id+".jsonl")
	tail := dev.run(30*time.Second, "agentbox", "audit", "tail", "--class", "file", trail)
	if tail.code != 0 {
		t.Fatalf("tail: %v", tail)
	}
	for _, l := range strings.Split(tail.stdout, "\n") {
		if strings.HasPrefix(l, "09:00:00.000") {
			t.Fatalf("a file name forged a record line:\n%s", tail.stdout)
		}
	}
	if !strings.Contains(tail.stdout, `path="/tmp/x\n09:00:00.000 `) {
		t.Fatalf("the hostile name must be shown quoted:\n%s", tail.stdout)
	}
	js := dev.run(30*time.Second, "agentbox", "audit", "tail", "--class", "file", "-o", "json", trail)
	if !strings.Contains(js.stdout, `"path":"/tmp/`+strings.ReplaceAll(forged, "\n", `\n`)+`"`) {
		t.Fatalf("-o json must keep the name exactly:\n%s", js.stdout)
	}
}

// TestHostileAdminFlags: a config whose [runsc.flags] would undo a role is
// refused with the reason; a tuning flag is fine.
func TestHostileAdminFlags(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	withFlags := func(flags string) string { return configVariant(t, "[shim]\n", "[runsc.flags]\n"+flags+"\n[shim]\n") }
	r := dev.runAgent(t, uniqueID("flags"), []string{"--runtime-config-path", withFlags(`ignore-cgroups = "true"`)}, "echo", "should-not-run")
	expectRefused(t, r, "runsc.flags.ignore-cgroups: would weaken what a role enforces")
	r = dev.runAgent(t, uniqueID("flags"), []string{"--runtime-config-path", withFlags(`platform = "systrap"`)}, "echo", "tuned")
	expectCode(t, r, 0, "tuned")
}
