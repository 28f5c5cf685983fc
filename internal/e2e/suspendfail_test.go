//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fullStore mounts a 256 KiB tmpfs over the dev node's checkpoint store
// until the test ends: any image written into it runs out of space.
func fullStore(t *testing.T) {
	t.Helper()
	dir := filepath.Join(dev.dir, "checkpoints")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "agentbox-e2e-full", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a small store: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("unmounting the small store: %v: %s", err, out)
		}
	})
}

// TestSuspendIntoFullStore: a suspend whose image does not fit in the
// store fails with the reason, lists no image, and leaves the agent
// running with its memory (the counter goes on); the trail says why and
// records no exit. So does containerd's checkpoint with --exit.
func TestSuspendIntoFullStore(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	a, aID := counterPod(t, "cp-full", "")
	if r := waitLogsWithin(t, aID, "count 5\n", 30*time.Second); !strings.Contains(r.stdout, "count 5\n") {
		t.Fatalf("the agent did not count: %v", r)
	}
	fullStore(t)
	name := uniqueID("cp-full")
	r := sandboxCLI("suspend", "--name", name, "--reason", "e2e: a store with no room", "--pod", "e2e-cp/cp-full")
	if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "no space left on device") {
		t.Fatalf("suspend into a full store: %v", r)
	}
	t.Logf("refused: %s", strings.TrimSpace(r.stderr))
	for _, c := range storedCheckpoints(t) {
		if c.Name == name {
			t.Fatalf("a failed suspend listed an image: %+v", c)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(dev.dir, "checkpoints")); len(ents) != 0 {
		t.Errorf("the store holds %d entries after a failed suspend (want none): %v", len(ents), ents)
	}
	// The agent runs on, with its memory: its counter goes on from where
	// it was.
	before := counts(dev.crictl(30*time.Second, "logs", aID).stdout)
	want := before[len(before)-1] + 5
	if r := waitLogsWithin(t, aID, fmt.Sprintf("count %d\n", want), 30*time.Second); !strings.Contains(r.stdout, fmt.Sprintf("count %d\n", want)) {
		t.Fatalf("the agent stopped counting after a failed suspend (it was at %d): %v", want-5, r)
	}
	if st := dev.crictl(20*time.Second, "inspect", "-o", "go-template", "--template", "{{.status.state}}", aID); !strings.Contains(st.stdout, "CONTAINER_RUNNING") {
		t.Fatalf("the agent's state after a failed suspend: %v", st)
	}
	recs := trailSoFar(t, a.id)
	failed := findRecord(recs, "agentbox/checkpoint_failed")
	if failed == nil || failed.Detail["checkpoint"] != name || !strings.Contains(failed.Detail["error"], "no space left on device") ||
		!strings.Contains(failed.Message, "the agent runs on") || failed.Detail["reason"] != "e2e: a store with no room" {
		t.Fatalf("the failed suspend's record: %+v", failed)
	}
	if ex := findRecord(recs, "agentbox/container_exit"); ex != nil {
		t.Fatalf("a failed suspend recorded an exit: %+v", ex)
	}
	list := sandboxCLI("list", "-o", "json")
	var sbs []struct{ ID, State string }
	if err := json.Unmarshal([]byte(list.stdout), &sbs); list.code != 0 || err != nil {
		t.Fatalf("sandbox list: %v %v", err, list)
	}
	for _, sb := range sbs {
		if sb.ID == a.id && sb.State != "running" {
			t.Fatalf("the sandbox is %s after a failed suspend", sb.State)
		}
	}

	// containerd's task API: ctr task checkpoint --exit, into the same
	// full store, fails and leaves the task running.
	id := uniqueID("ckpt-full")
	script := `i=0; while :; do i=$((i+1)); echo "count $i" >/tmp/now; sleep 0.2; done`
	if r := dev.ctr(30*time.Second, "run", "-d", "--runtime", runtimeType, agentImage, id, "sh", "-c", script); r.code != 0 {
		t.Fatalf("ctr run: %v", r)
	}
	defer dev.removeContainer(id)
	time.Sleep(time.Second)
	if r := dev.ctr(60*time.Second, "task", "checkpoint", "--exit", id); r.code == 0 {
		t.Fatalf("ctr task checkpoint --exit into a full store succeeded: %v", r)
	}
	look := func() int {
		r := dev.ctr(20*time.Second, "task", "exec", "--exec-id", uniqueID("look"), id, "cat", "/tmp/now")
		c := counts(r.stdout)
		if r.code != 0 || len(c) != 1 {
			t.Fatalf("the task after a failed checkpoint --exit: %v", r)
		}
		return c[0]
	}
	first := look()
	if !eventually(t, 10*time.Second, func() bool { return look() > first }) {
		t.Fatal("the task stopped counting after a failed checkpoint --exit")
	}
}
