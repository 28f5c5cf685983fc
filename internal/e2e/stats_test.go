//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestStatsReadInShim: a running container's stats (ctr task metrics; the
// CRI's stats collector asks the same of every container once a second)
// are read by the shim from its sandbox's control socket, not by running
// `runsc events --stats` for each call. The shim runs runsc through a
// wrapper that logs each command: after the container started, no
// `events` runs, however many times its metrics are asked. The figures are
// runsc's own: its processes and memory as `runsc events --stats` reports
// them, and CPU time no less than runsc reported just before.
func TestStatsReadInShim(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	cfg, calls := loggingRunsc(t)
	real := filepath.Join(cacheDir(), "bin", "runsc")
	id := uniqueID("stats")
	// It burns some CPU, then sleeps with its memory still held.
	script := "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; echo burned; exec sleep 600"
	if r := dev.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType, "--runtime-config-path", cfg, agentImage, id, "sh", "-c", script); r.code != 0 {
		t.Fatalf("run: %v", r)
	}
	defer dev.removeContainer(id)
	if !eventually(t, 30*time.Second, func() bool {
		return strings.Contains(dev.ctr(10*time.Second, "tasks", "ls").stdout, id)
	}) {
		t.Fatal("the container did not start")
	}
	root := filepath.Join(dev.runscRoot(), "default")
	// runsc events prints its figures under "data"; ctr tasks metrics
	// prints the cgroup v1 metrics themselves.
	type figures struct {
		CPU struct {
			Usage struct {
				Total uint64 `json:"total"`
			} `json:"usage"`
		} `json:"cpu"`
		Memory struct {
			Usage struct {
				Usage uint64 `json:"usage"`
			} `json:"usage"`
		} `json:"memory"`
		Pids struct {
			Current uint64 `json:"current"`
		} `json:"pids"`
	}
	type runscStats struct {
		Data figures `json:"data"`
	}
	before, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	var rs runscStats
	var m figures
	// Asked until the burn is over and its figures hold still (memory
	// and processes; CPU only grows).
	ok := eventually(t, 30*time.Second, func() bool {
		r := dev.run(30*time.Second, real, "--root", root, "events", "--stats", id)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rs) != nil {
			t.Logf("runsc events: %v", r)
			return false
		}
		r = dev.ctr(30*time.Second, "tasks", "metrics", "--format", "json", id)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &m) != nil {
			t.Logf("ctr tasks metrics: %v", r)
			return false
		}
		return rs.Data.Pids.Current == m.Pids.Current && rs.Data.Memory.Usage.Usage == m.Memory.Usage.Usage &&
			m.CPU.Usage.Total >= rs.Data.CPU.Usage.Total && rs.Data.CPU.Usage.Total > 0
	})
	if !ok {
		t.Fatalf("ctr tasks metrics %+v, runsc events --stats just before %+v: the processes and memory differ, or the CPU went back", m, rs.Data)
	}
	if m.Pids.Current == 0 || m.Memory.Usage.Usage == 0 {
		t.Fatalf("metrics without processes or memory: %+v", m)
	}
	for i := 0; i < 5; i++ {
		if r := dev.ctr(30*time.Second, "tasks", "metrics", "--format", "json", id); r.code != 0 {
			t.Fatalf("ctr tasks metrics: %v", r)
		}
	}
	after, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(after[len(before):]), "\n") {
		if strings.Contains(" "+l+" ", " events ") {
			t.Errorf("the shim ran runsc for a running container's stats: %s", l)
		}
	}
	runscCommands(t, calls) // the wrapper was the shim's runsc: it saw the start
}

// loggingRunsc writes a shim config whose runsc is a wrapper that logs each
// command's arguments, a line each, to the returned file.
func loggingRunsc(t *testing.T) (cfg, calls string) {
	t.Helper()
	calls = filepath.Join(t.TempDir(), "runsc-calls.log")
	return wrappedRunsc(t, logCommand(calls), ""), calls
}

// logCommand is the wrapper's line that appends its arguments to calls,
// a line each command, as runscCommands reads them.
func logCommand(calls string) string {
	return fmt.Sprintf("echo \"$*\" >>%s", calls)
}

// wrappedRunsc writes a shim config (the suite's policies, the audit
// trails in auditDir, or a directory of the test's own when "") whose
// runsc is a shell script: pre, then the real runsc with the same
// arguments.
func wrappedRunsc(t *testing.T, pre, auditDir string) (cfg string) {
	t.Helper()
	dir := t.TempDir()
	if auditDir == "" {
		auditDir = filepath.Join(dir, "audit")
	}
	wrapper := runscWrapper(t, dir, pre)
	cfg = filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("version = 1\n[runsc]\nbinary = %q\n[policy]\ndir = %q\nhandler = \"agentbox\"\n[audit]\ndir = %q\n",
		wrapper, filepath.Join(dev.dir, "agentbox", "policies"), auditDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runscWrapper writes dir/runsc, a shell script that runs pre, then the
// real runsc with the same arguments.
func runscWrapper(t *testing.T, dir, pre string) string {
	t.Helper()
	wrapper := filepath.Join(dir, "runsc")
	real := filepath.Join(cacheDir(), "bin", "runsc")
	if err := os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\n%s\nexec %s \"$@\"\n", pre, real)), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

// loggingHandler points the CRI handler's shim config at a runsc wrapper
// that logs each command, a line each, to the returned file, for the
// shims started until the test ends (the suite's tests run one at a
// time); the config is put back after the test's pods are gone.
func loggingHandler(t *testing.T) (calls string) {
	t.Helper()
	cfg := filepath.Join(dev.dir, "agentbox", "config.toml")
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	real := fmt.Sprintf("binary = %q", filepath.Join(cacheDir(), "bin", "runsc"))
	if strings.Count(string(orig), real) != 1 {
		t.Fatalf("the handler's config does not name runsc once as %s", real)
	}
	dir := t.TempDir()
	calls = filepath.Join(dir, "runsc-calls.log")
	wrapper := runscWrapper(t, dir, logCommand(calls))
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(orig), real, fmt.Sprintf("binary = %q", wrapper), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(cfg, orig, 0o644); err != nil {
			t.Errorf("putting the handler's config back: %v", err)
		}
	})
	return calls
}

// runscCommands are the runsc commands a logging wrapper saw (the word
// after runsc's global flags), from its log. It fails the test when they
// hold no start: then the wrapper was not the runsc the shim ran, and no
// command's absence proves anything.
func runscCommands(t *testing.T, calls string) []string {
	t.Helper()
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		for _, f := range strings.Fields(l) {
			if !strings.HasPrefix(f, "-") && !strings.Contains(f, "/") && !strings.Contains(f, "=") {
				cmds = append(cmds, f)
				break
			}
		}
	}
	if !slices.Contains(cmds, "start") {
		t.Fatalf("the wrapper logged no start: the test proves nothing (%q)", cmds)
	}
	return cmds
}

// TestStateAnsweredInShim: the State of a running container (containerd
// asks for it after every Start, ctr tasks ls for each task) is the
// shim's to answer, not a `runsc state` each. The twins: a paused
// container's State is runsc's, and says paused; a resumed one runs again.
func TestStateAnsweredInShim(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	cfg, calls := loggingRunsc(t)
	id := uniqueID("state")
	if r := dev.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType, "--runtime-config-path", cfg, agentImage, id, "sleep", "600"); r.code != 0 {
		t.Fatalf("run: %v", r)
	}
	defer dev.removeContainer(id)
	status := func() string {
		for _, l := range strings.Split(dev.ctr(10*time.Second, "tasks", "ls").stdout, "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == id {
				return f[2]
			}
		}
		return ""
	}
	for i := 0; i < 3; i++ {
		if st := status(); st != "RUNNING" {
			t.Fatalf("ctr tasks ls says %q, want RUNNING", st)
		}
	}
	if cmds := runscCommands(t, calls); slices.Contains(cmds, "state") {
		t.Errorf("runsc state ran for a running container: %q", cmds)
	}
	// Paused: its State is runsc's.
	if r := dev.ctr(30*time.Second, "tasks", "pause", id); r.code != 0 {
		t.Fatalf("pause: %v", r)
	}
	if st := status(); st != "PAUSED" {
		t.Errorf("a paused container's state is %q, want PAUSED", st)
	}
	if !slices.Contains(runscCommands(t, calls), "state") {
		t.Errorf("a paused container's state was not asked of runsc: %q", runscCommands(t, calls))
	}
	if r := dev.ctr(30*time.Second, "tasks", "resume", id); r.code != 0 {
		t.Fatalf("resume: %v", r)
	}
	if st := status(); st != "RUNNING" {
		t.Errorf("a resumed container's state is %q, want RUNNING", st)
	}
}

// TestCRIStartAsksNoState: a CRI pod's start runs no `runsc state`.
// containerd asks for the new container's State between its Create and its
// Start (the CRI's NRI adaptation reads the task), and for each container's
// after its Start; a created or a running container's State is the
// shim's. The twins: the container runs and reads RUNNING, and once
// stopped it reads EXITED with its status.
func TestCRIStartAsksNoState(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	calls := loggingHandler(t)
	p := newPod(t, "nostate", nil)
	id := p.container(t, "c", "sh", "-c", "trap 'exit 7' TERM; sleep 600 & wait")
	if st, _ := containerState(t, id); st != "CONTAINER_RUNNING" {
		t.Fatalf("the container is %s, want CONTAINER_RUNNING", st)
	}
	if cmds := runscCommands(t, calls); slices.Contains(cmds, "state") {
		t.Errorf("runsc state ran during the pod's start: %q", cmds)
	}
	if r := dev.crictl(60*time.Second, "stop", "-t", "10", id); r.code != 0 {
		t.Fatalf("crictl stop: %v", r)
	}
	if code := waitState(t, id, "CONTAINER_EXITED"); code != 7 {
		t.Errorf("the stopped container exited %d, want 7", code)
	}
}
