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

// TestCancelledStartCanBeStopped: a sandbox whose start is cancelled while
// runsc starts it (a CRI caller's timeout under load) can still be stopped
// and deleted. gVisor's task service waits for a container only once its
// start succeeded, so such a root was never reported exited: every stop
// (`ctr tasks delete -f`, the CRI's StopPodSandbox) waited on it for good.
// runsc runs through a wrapper that holds the sandbox's first `start` past
// ctr's deadline; the start fails, the forced delete then completes, the
// sandbox process is gone and the trail says why the start failed. The
// twin: a start that is not held runs the same container to its exit.
func TestCancelledStartCanBeStopped(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	held := filepath.Join(t.TempDir(), "held")
	// Only the first start is held, and only while the marker's absence
	// says so: the twin below starts unheld. The trail is the suite's
	// (readTrail).
	cfg := wrappedRunsc(t, fmt.Sprintf(`case " $* " in *" start "*) if [ ! -e %[1]s ]; then : >%[1]s; sleep 8; fi;; esac`, held), filepath.Join(dev.dir, "audit"))
	id := uniqueID("startcancel")
	defer dev.removeContainer(id)
	r := dev.ctr(60*time.Second, "--timeout", "4s", "run", "-d", "--runtime", runtimeType, "--runtime-config-path", cfg, agentImage, id, "sleep", "600")
	if r.code == 0 {
		t.Fatalf("the held start did not fail: %v", r)
	}
	if _, err := os.Stat(held); err != nil {
		t.Fatalf("the wrapper held no start (%v): the test proves nothing; ctr: %v", err, r)
	}
	// The shim, the sandbox and the container are there, the start failed
	// (listed once the held start has ended: until then, the task's state
	// waits for it).
	if !eventually(t, 30*time.Second, func() bool {
		return strings.Contains(dev.ctr(10*time.Second, "tasks", "ls").stdout, id)
	}) {
		t.Fatalf("no task left after the failed start: the test proves nothing; ctr: %v", r)
	}
	// The stop kubelet and ctr make: kill, then wait for the exit.
	if r := dev.ctr(60*time.Second, "tasks", "delete", "-f", id); r.code != 0 {
		t.Fatalf("the forced delete of a sandbox whose start failed did not complete: %v", r)
	}
	if strings.Contains(dev.ctr(10*time.Second, "tasks", "ls").stdout, id) {
		t.Fatal("the task is still listed after its forced delete")
	}
	if r := dev.ctr(30*time.Second, "containers", "delete", id); r.code != 0 {
		t.Fatalf("containers delete: %v", r)
	}
	recs := readTrail(t, id)
	var failed bool
	for _, rec := range recs {
		if rec.Event == "agentbox/sandbox_failed" && rec.Status == "Failure" && strings.Contains(rec.Message, "could not start the sandbox") {
			failed = true
		}
	}
	if !failed {
		t.Errorf("the trail does not say the start failed: %+v", recs)
	}

	// The twin: the same runtime config, its start not held.
	twin := uniqueID("startcancel-twin")
	if r := dev.ctr(90*time.Second, "--timeout", "60s", "run", "--rm", "--runtime", runtimeType, "--runtime-config-path", cfg, agentImage, twin, "sh", "-c", "echo started"); r.code != 0 || !strings.Contains(r.stdout, "started") {
		dev.removeContainer(twin)
		t.Fatalf("an unheld start through the same wrapper: %v", r)
	}
}
