//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/checkpoint"
)

// TestCheckpointSharedStore: a suspend's image is also written to the
// cluster's shared store (checkpoint.shared_dir), encrypted with the
// cluster's key: the agent's memory is in the node's image and nowhere in
// the shared one. A node whose store lacks the image (here: it was removed)
// takes it from the shared store for a restore, and the agent's counter
// goes on. An image altered in the shared store is refused.
func TestCheckpointSharedStore(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	a, aID := counterPod(t, "cp-shared", "")
	if r := waitLogsWithin(t, aID, "count 5\n", 30*time.Second); !strings.Contains(r.stdout, "count 5\n") {
		t.Fatalf("the agent did not count: %v", r)
	}
	name := uniqueID("cp-shared")
	if r := sandboxCLI("suspend", "--name", name, "--reason", "e2e: to resume on another node", "--pod", "e2e-cp/cp-shared"); r.code != 0 {
		t.Fatalf("suspend: %v", r)
	}
	waitState(t, aID, "CONTAINER_EXITED")
	before := counts(dev.crictl(30*time.Second, "logs", aID).stdout)
	last := before[len(before)-1]
	shared := findRecord(trailSoFar(t, a.id), "agentbox/checkpoint_shared")
	if shared == nil || shared.Status != "Success" || shared.Detail["checkpoint"] != name || shared.Detail["bytes"] == "" {
		t.Fatalf("the shared store's record: %+v", shared)
	}
	t.Logf("%s", shared.Message)

	// The agent's memory (its script, which the shell holds) is in the
	// node's image, and in no file of the shared one.
	marker := []byte("198.51.100.10/ping")
	local, err := os.ReadFile(filepath.Join(dev.dir, "checkpoints", name, "pages.img"))
	if err != nil || !bytes.Contains(local, marker) {
		t.Fatalf("the node's image does not hold the agent's script (%v): the check below would prove nothing", err)
	}
	sharedDir := filepath.Join(dev.dir, "shared-checkpoints", name)
	ents, err := os.ReadDir(sharedDir)
	if err != nil || len(ents) < 2 {
		t.Fatalf("the shared store's image: %v %v", ents, err)
	}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(sharedDir, e.Name()))
		if e.Name() == checkpoint.DataKeyFile {
			// The image's own data key, wrapped by the key every node
			// holds here (one trust domain: ctr).
			if w, err := checkpoint.ParseWrappedKey(b); err != nil || w.Checkpoint != name || w.Scheme != checkpoint.SchemeAESGCM {
				t.Errorf("shared %s: %+v %v", e.Name(), w, err)
			}
			continue
		}
		if !strings.HasSuffix(e.Name(), ".enc") || bytes.Contains(b, marker) || bytes.Contains(b, []byte(a.id)) {
			t.Errorf("shared %s holds plaintext", e.Name())
		}
	}

	// Another node: its store has no such image, and the restore takes
	// it from the shared store.
	if r := sandboxCLI("checkpoints", "--remove", name); r.code != 0 {
		t.Fatalf("removing the node's image: %v", r)
	}
	dev.crictl(60*time.Second, "stopp", a.id)
	dev.crictl(60*time.Second, "rmp", "-f", a.id)
	a.released = true
	b, bID := counterPod(t, "cp-shared-resumed", name)
	after := counts(waitLogsWithin(t, bID, fmt.Sprintf("count %d\n", last+3), 30*time.Second).stdout)
	if len(after) == 0 || after[0] != last+1 {
		t.Fatalf("the counter did not go on: it was at %d, and the resumed agent printed %v", last, after[:min(len(after), 5)])
	}
	restored := findRecord(trailSoFar(t, b.id), "agentbox/restored")
	if restored == nil || !strings.Contains(restored.Detail["shared_store"], "taken from the shared store") {
		t.Fatalf("the restored record does not say the image came from the shared store: %+v", restored)
	}
	t.Logf("suspended at count %d; resumed from the shared store at %d (%s)", last, after[0], restored.Detail["shared_store"])

	// Altered in the shared store: refused, and nothing is kept.
	if r := sandboxCLI("checkpoints", "--remove", name); r.code != 0 {
		t.Fatalf("removing the node's image: %v", r)
	}
	p := filepath.Join(sharedDir, "pages.img.enc")
	enc, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	enc[len(enc)/2] ^= 1
	if err := os.WriteFile(p, enc, 0o600); err != nil {
		t.Fatal(err)
	}
	_, r := tryPod(t, "cp-shared-altered", "e2e-cp", map[string]string{"agentbox.dev/role": "e2e-cp", "agentbox.dev/restore-from": name})
	if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "does not decrypt") {
		t.Fatalf("a restore from an altered shared image: %v", r)
	}
	if _, err := os.Stat(filepath.Join(dev.dir, "checkpoints", name)); err == nil {
		t.Error("the altered image is in the node's store")
	}
}
