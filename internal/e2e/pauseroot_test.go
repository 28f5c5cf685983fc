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

// setPauseImages turns the node's pause images on or off (off:
// runsc.pause_image_dir = "none", the pause served by a gofer as gVisor
// does). The shim reads its config at each create.
func setPauseImages(t *testing.T, on bool) {
	t.Helper()
	path := filepath.Join(dev.dir, "agentbox", "config.toml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const off = "[runsc]\npause_image_dir = \"none\"\n"
	s := strings.Replace(string(b), off, "[runsc]\n", 1)
	if !on {
		s = strings.Replace(s, "[runsc]\n", off, 1)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// suspendCounter suspends the counter pod p (e2e-cp/podName) into a new
// checkpoint, removes the pod, and returns the checkpoint's name and the
// last count before it.
func suspendCounter(t *testing.T, p *pod, podName, cid string) (string, int) {
	t.Helper()
	name := uniqueID("pr")
	if r := sandboxCLI("suspend", "--name", name, "--reason", "e2e: pause roots", "--pod", "e2e-cp/"+podName); r.code != 0 {
		t.Fatalf("suspend: %v", r)
	}
	waitState(t, cid, "CONTAINER_EXITED")
	before := counts(dev.crictl(30*time.Second, "logs", cid).stdout)
	if len(before) == 0 {
		t.Fatal("the agent counted nothing before its suspend")
	}
	p.remove()
	return name, before[len(before)-1]
}

// TestPauseRootAcrossCheckpoints: gVisor restores a container only with
// the mounts it was checkpointed with, so a restored pod's pause container
// is served as its checkpoint's was, whatever the node's setting now. One
// taken with the pause on a gofer (as every checkpoint taken before pause
// images) restores on a node that serves pauses from images, and one taken
// from an image restores on a node set to "none"; the counter goes on each
// time.
func TestPauseRootAcrossCheckpoints(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	t.Cleanup(func() { setPauseImages(t, true) })
	for _, c := range []struct {
		name          string
		before, after bool // the node's setting at the checkpoint and at the restore
		// pauseGofers: the checkpointed pod's, and so the restored one's.
		pauseGofers int
	}{
		{"gofer", false, true, 1},
		{"image", true, false, 0},
	} {
		setPauseImages(t, c.before)
		a, aID := counterPod(t, "pr-"+c.name, "")
		waitLogsWithin(t, aID, "count 3\n", 30*time.Second)
		if n, want := countGofers(a.id), c.pauseGofers; n != want {
			t.Fatalf("%s: the pause has %d gofers, want %d", c.name, n, want)
		}
		name, last := suspendCounter(t, a, "pr-"+c.name, aID)
		setPauseImages(t, c.after)
		b, bID := counterPod(t, "pr-"+c.name+"-restored", name)
		after := counts(waitLogsWithin(t, bID, fmt.Sprintf("count %d\n", last+2), 30*time.Second).stdout)
		if len(after) == 0 || after[0] != last+1 {
			t.Fatalf("%s: it was at %d, and the restored agent went on with %v", c.name, last, after)
		}
		if n := countGofers(b.id); n != c.pauseGofers {
			t.Errorf("%s: the restored pod's pause has %d gofers, want %d, as its checkpoint's", c.name, n, c.pauseGofers)
		}
		b.remove()
	}
}
