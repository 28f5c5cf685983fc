//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCtrRunsUnderGVisor: a plain `ctr run` (no CRI annotations) runs under
// gVisor's kernel, not the host's, and does not hang in Create.
func TestCtrRunsUnderGVisor(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := dev.runAgent(t, uniqueID("dmesg"), nil, "dmesg")
	if r.timedOut {
		t.Fatalf("ctr run hung (unannotated container must be its own sandbox root): %v", r)
	}
	if r.code != 0 || !strings.Contains(r.stdout, "Starting gVisor") {
		t.Fatalf("want gVisor's dmesg, got %v", r)
	}
	host, _ := os.ReadFile("/proc/version")
	if r2 := dev.runAgent(t, uniqueID("uname"), nil, "cat", "/proc/version"); strings.TrimSpace(r2.stdout) == strings.TrimSpace(string(host)) {
		t.Fatalf("container sees the host kernel's /proc/version: %q", r2.stdout)
	}
}

// TestCtrExitCodes: exit statuses arrive exactly, every time, also for
// commands that exit at once (the stock gVisor shim reports 128 for most).
func TestCtrExitCodes(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	const rounds = 20
	cases := []struct {
		name string
		argv []string
		want int
	}{
		{"exit7", []string{"sh", "-c", "exit 7"}, 7},
		{"exit0", []string{"sh", "-c", "exit 0"}, 0},
		{"exit1", []string{"sh", "-c", "exit 1"}, 1},
		{"true", []string{"/bin/true"}, 0},
		{"false", []string{"/bin/false"}, 1},
		{"selfkill", []string{"sh", "-c", "kill -KILL $$"}, 137},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			for i := 0; i < rounds; i++ {
				r := dev.runAgent(t, uniqueID(tc.name), nil, tc.argv...)
				if r.timedOut {
					t.Fatalf("round %d hung: %v", i, r)
				}
				got = append(got, r.code)
			}
			for i, c := range got {
				if c != tc.want {
					t.Fatalf("%v: want %d in all %d rounds, round %d gave %d (all: %v)", tc.argv, tc.want, rounds, i, c, got)
				}
			}
		})
	}
}

// TestCtrKillGives137: `ctr task kill -s KILL` of a running container makes
// `ctr run` return 137, every time.
func TestCtrKillGives137(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	for i := 0; i < 20; i++ {
		id := uniqueID("kill")
		done := make(chan result, 1)
		go func() { done <- dev.runAgent(t, id, nil, "sleep", "600") }()
		if err := waitRunning(id, 60*time.Second); err != nil {
			dev.removeContainer(id)
			t.Fatal(err)
		}
		if r := dev.ctr(30*time.Second, "tasks", "kill", "-s", "KILL", id); r.code != 0 {
			t.Fatalf("kill: %v", r)
		}
		r := <-done
		if r.code != 137 {
			t.Fatalf("round %d: want 137 after SIGKILL, got %v", i, r)
		}
	}
}

func waitRunning(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		r := dev.ctr(10*time.Second, "tasks", "ls")
		for _, line := range strings.Split(r.stdout, "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("task %s not RUNNING after %v", id, timeout)
}

// TestCtrOutputComplete: 2000 lines each on stdout and stderr arrive
// complete, in order, each on its own stream.
func TestCtrOutputComplete(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	const n = 2000
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; exit 3`, n)
	r := dev.runAgent(t, uniqueID("lines"), nil, "sh", "-c", script)
	if r.code != 3 {
		t.Fatalf("want exit 3, got %v", r)
	}
	checkLines(t, "stdout", r.stdout, "out", n)
	checkLines(t, "stderr", filterCtrNoise(r.stderr), "err", n)
}

// filterCtrNoise drops ctr's own warnings (cgroup v1 deprecation) from its
// stderr; every other line is the container's.
func filterCtrNoise(s string) string {
	var keep []string
	for _, l := range strings.SplitAfter(s, "\n") {
		if strings.Contains(l, "level=warning") && strings.Contains(l, "DEPRECATION") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "")
}

func checkLines(t *testing.T, stream, got, prefix string, n int) {
	t.Helper()
	var want strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&want, "%s %d\n", prefix, i)
	}
	if got != want.String() {
		lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
		t.Fatalf("%s: want %d lines %q..%q exactly, got %d lines (first %q, last %q)", stream, n, prefix+" 0", fmt.Sprintf("%s %d", prefix, n-1), len(lines), lines[0], lines[len(lines)-1])
	}
}

// TestCtrExec: `ctr task exec` runs in the container's sandbox and returns
// the exec'd process's status and output.
func TestCtrExec(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("exec")
	r := dev.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType, agentImage, id, "sh", "-c", "echo marker > /tmp/m; sleep 600")
	if r.code != 0 {
		t.Fatalf("run -d: %v", r)
	}
	defer dev.removeContainer(id)
	if err := waitRunning(id, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	var e result
	for i := 0; i < 50; i++ { // the marker is written right after start
		e = dev.ctr(60*time.Second, "tasks", "exec", "--exec-id", fmt.Sprintf("x%d", i), id, "sh", "-c", "cat /tmp/m && dmesg | head -1; exit 5")
		if e.code != 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if e.code != 5 || !strings.Contains(e.stdout, "marker") || !strings.Contains(e.stdout, "gVisor") {
		t.Fatalf("exec: want exit 5 with the container's file and gVisor's dmesg, got %v", e)
	}
}

// TestConfigPathErrors: a config file that is named but missing or malformed
// fails the container's start with a message that names the problem.
func TestConfigPathErrors(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	bad := filepath.Join(dev.dir, "bad-config.toml")
	if err := os.WriteFile(bad, []byte("version = 1\n[runsc]\nbinary = \"runsc\"\nflavour = \"x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path string
		want       []string
	}{
		{"missing", filepath.Join(dev.dir, "no-such-config.toml"), []string{"no-such-config.toml", "no such file"}},
		{"malformed", bad, []string{"bad-config.toml", "line 4", "unknown key \"runsc.flavour\""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := uniqueID("cfg")
			defer dev.removeContainer(id)
			r := dev.runAgent(t, id, []string{"--runtime-config-path", tc.path}, "true")
			if r.code == 0 || r.timedOut {
				t.Fatalf("want a failed start, got %v", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("error does not mention %q: %v", w, r)
				}
			}
		})
	}
	// The same container starts with a good config.
	good := filepath.Join(dev.dir, "agentbox", "config.toml")
	if r := dev.runAgent(t, uniqueID("cfg"), []string{"--runtime-config-path", good}, "sh", "-c", "exit 4"); r.code != 4 {
		t.Fatalf("good config: want exit 4, got %v", r)
	}
}

// TestTwoContainerdInstances: two containerd daemons on one machine run a
// container with the same namespace and id at the same time; their runsc
// state does not collide.
func TestTwoContainerdInstances(t *testing.T) {
	requireEnv(t)
	dir, err := os.MkdirTemp("", "abx-e2e2-")
	if err != nil {
		t.Fatal(err)
	}
	other, err := startDaemon(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := other.stop(); err != nil {
			t.Error(err)
		}
	}()
	expectNoLeaks(t, dev)
	expectNoLeaks(t, other)
	if dev.runscRoot() == other.runscRoot() {
		t.Fatalf("both instances use runsc root %s", dev.runscRoot())
	}
	const id = "same-id"
	for _, d := range []*daemon{dev, other} {
		if r := d.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType, agentImage, id, "sleep", "600"); r.code != 0 {
			t.Fatalf("run -d on %s: %v", d.sock, r)
		}
		defer d.removeContainer(id)
	}
	for i, d := range []*daemon{dev, other} {
		r := d.ctr(60*time.Second, "tasks", "exec", "--exec-id", "probe", id, "sh", "-c", fmt.Sprintf("exit %d", 20+i))
		if r.code != 20+i {
			t.Fatalf("exec on instance %d: want %d, got %v", i, 20+i, r)
		}
	}
}

// TestCtrNoErrorLogs: a clean short-lived container leaves no error-level
// line in containerd's log. Before hack/patches/runsc-wait-root-status.patch
// every one did ("Failed to wait for container ... sandbox no longer running
// and its exit status is unavailable"), while its exit code was right.
func TestCtrNoErrorLogs(t *testing.T) {
	requireEnv(t)
	logPath := filepath.Join(dev.dir, "logs", "containerd.log")
	before, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 10; i++ {
		id := uniqueID("quiet")
		ids = append(ids, id)
		if r := dev.runAgent(t, id, nil, "sh", "-c", fmt.Sprintf("exit %d", i)); r.code != i {
			t.Fatalf("exit %d: %v", i, r)
		}
	}
	after, _ := os.ReadFile(logPath)
	var bad []string
	for _, line := range strings.Split(string(after[len(before):]), "\n") {
		if !strings.Contains(line, "level=error") {
			continue
		}
		for _, id := range ids {
			if strings.Contains(line, id) {
				bad = append(bad, line)
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d error-level lines for 10 clean containers:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}
