//go:build e2e

package e2e

// What a test leaves behind: network namespaces, cgroups, sockets,
// processes and mounts, compared before and after; and the trails' OCSF
// conformance, checked once the suite ends.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/cli"
	"agentbox.dev/agentbox/internal/mountguard"
)

// leaks lists what of d is still alive: shim and runsc processes, mounts
// under its directories, runsc container state, and network namespaces and
// container cgroups that were not there before.
func (d *daemon) leaks(netnsBefore, cgroupsBefore, socketsBefore map[string]bool) []string {
	var out []string
	for _, cmd := range cmdlines() {
		isShim := strings.Contains(cmd, "containerd-shim") && strings.Contains(cmd, d.sock)
		isRunsc := strings.HasPrefix(cmd, "runsc") && strings.Contains(cmd, d.runscRoot())
		if isShim || isRunsc {
			out = append(out, "process: "+clipLine(cmd))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		mp := f[1]
		inState := strings.HasPrefix(mp, filepath.Join(d.dir, "state")+"/")
		inRunsc := strings.HasPrefix(mp, d.runscRoot()+"/") && filepath.Base(mp) != "null-netns"
		if inState || inRunsc {
			out = append(out, "mount: "+mp)
		}
	}
	// runsc keeps one state file (and lock) per container under ROOT/NS.
	// null-netns is runsc's shared placeholder for containers without a
	// network namespace, not per-container state.
	state, _ := filepath.Glob(filepath.Join(d.runscRoot(), "*", "*"))
	for _, s := range state {
		if filepath.Base(s) != "null-netns" {
			out = append(out, "runsc state: "+s)
		}
	}
	for ns := range netnsSet() {
		if !netnsBefore[ns] {
			out = append(out, "netns: "+ns)
		}
	}
	for s := range socketSet() {
		if !socketsBefore[s] {
			out = append(out, "audit socket: "+s)
		}
	}
	for cg := range cgroupSet() {
		if !cgroupsBefore[cg] {
			out = append(out, "cgroup: "+cg)
		}
	}
	return out
}

// socketSet lists the audit and control sockets (shared by all daemons on
// the node).
func socketSet() map[string]bool {
	m := map[string]bool{}
	socks, _ := filepath.Glob("/run/agentbox/audit/*.sock")
	ctl, _ := filepath.Glob("/run/agentbox/control/*.sock")
	socks = append(socks, ctl...)
	for _, s := range socks {
		m[s] = true
	}
	return m
}

// cgroupSet lists the containerd-namespace cgroups of containers (the
// memory hierarchy stands for all of them).
func cgroupSet() map[string]bool {
	m := map[string]bool{}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/*/*/")
	for _, d := range dirs {
		if st, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil && !st.IsDir() {
			m[d] = true
		}
	}
	return m
}

// cmdlines returns the command lines of the processes running now, their
// arguments joined by spaces.
func cmdlines() []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func clipLine(s string) string {
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}

func netnsSet() map[string]bool {
	m := map[string]bool{}
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		m[e.Name()] = true
	}
	return m
}

// expectNoLeaks registers a cleanup, run after the test's own cleanups,
// that fails the test when anything of d outlives it.
func expectNoLeaks(t *testing.T, d *daemon) {
	t.Helper()
	before, cgBefore, sockBefore := netnsSet(), cgroupSet(), socketSet()
	t.Cleanup(func() {
		var left []string
		// Teardown is asynchronous in places (shim exit after delete).
		if eventually(t, 15*time.Second, func() bool {
			left = d.leaks(before, cgBefore, sockBefore)
			return len(left) == 0
		}) {
			return
		}
		t.Errorf("left behind after the test:\n  %s", strings.Join(left, "\n  "))
	})
}

// removeWithMounts removes dir and the mounts below it (runsc leaves its
// null-netns placeholder in its root), failing the test if anything stays.
func removeWithMounts(t *testing.T, dir string) {
	t.Helper()
	if err := mountguard.RemoveAll(dir); err != nil {
		t.Errorf("remove %s: %v", dir, err)
	}
}

// validateTrails checks every record of every trail the suite produced
// (each directory named audit under the suite's own) against the OCSF
// schema, and prints the count: the conformance figure of the run.
func validateTrails(dir string) int {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "audit" {
			dirs = append(dirs, p)
		}
		return nil
	})
	dirs = append(dirs, kubeAuditDirs()...)
	var res cli.ValidateResult
	if len(dirs) > 0 {
		var err error
		if res, err = cli.ValidateTrails(dirs...); err != nil && !strings.Contains(err.Error(), "no *.jsonl trail") {
			fmt.Fprintln(os.Stderr, "e2e: OCSF conformance:", err)
			return 1
		}
	}
	for _, p := range res.Problems {
		fmt.Fprintln(os.Stderr, "e2e: OCSF:", p)
	}
	ocsfMu.Lock()
	records, trails := res.Records+ocsfRecords, res.Trails+ocsfTrails
	ocsfMu.Unlock()
	fmt.Fprintf(os.Stderr, "e2e: OCSF conformance: %d of %d records in %d trails conform to OCSF %s (the suite's daemon and node, and the tests' own audit directories)\n",
		records-res.Bad, records, trails, audit.SchemaVersion)
	if res.Bad > 0 {
		return 1
	}
	return 0
}

// checkOCSF validates the trails of a test's own audit directory (gone
// when the test ends) and adds them to the suite's count.
func checkOCSF(t *testing.T, dirs ...string) {
	t.Helper()
	res, err := cli.ValidateTrails(dirs...)
	if err != nil {
		t.Fatalf("OCSF conformance of %v: %v", dirs, err)
	}
	for _, p := range res.Problems {
		t.Errorf("OCSF: %s", p)
	}
	ocsfMu.Lock()
	ocsfRecords += res.Records
	ocsfTrails += res.Trails
	ocsfMu.Unlock()
}
