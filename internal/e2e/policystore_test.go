//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/config"
)

// storeRole is a role whose environment filter shows which version of it
// a container ran under: the two versions differ in one byte.
const storeRole = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-store}
spec:
  inherits: baseline
  credentials: {env: {allow: [PATH, "STORE_%s*"]}}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-store}
spec: {role: e2e-store, subjects: [{containerdNamespace: default}]}
`

// TestPolicyStoreNeverStale: each container's shim is a fresh process
// that takes the policy set from the node's store when the files' bytes
// are the ones it was stored for. A role edited in one byte, with the
// file's size and modification time put back as they were, runs as
// edited in the next container, and the store then holds the new
// version's entry beside the old one's.
func TestPolicyStoreNeverStale(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	store := (&config.Config{Shim: config.Shim{ControlDir: config.DefaultControlDir}}).PolicyStoreDir()
	path := filepath.Join(dev.dir, "agentbox", "policies", "zz-e2e-store.yaml")
	t.Cleanup(func() { os.Remove(path) })
	env := []string{"--env", "STORE_A=from-a", "--env", "STORE_B=from-b"}

	if err := os.WriteFile(path, []byte(strings.ReplaceAll(storeRole, "%s", "A")), 0o644); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	os.Chtimes(path, at, at)
	run := func(want, not string) {
		t.Helper()
		for i := 0; i < 2; i++ { // the second from the store
			r := dev.runAgent(t, uniqueID("store"), append(env, "--annotation", "agentbox.dev/role=e2e-store"), "env")
			expectCode(t, r, 0, want)
			if strings.Contains(r.stdout, not) {
				t.Fatalf("the container ran under the other version of the role (%s): %v", not, r)
			}
		}
	}
	run("STORE_A=from-a", "STORE_B")
	before, _ := filepath.Glob(filepath.Join(store, "*.set"))
	if len(before) == 0 {
		t.Fatalf("no entry in the node's policy store %s", store)
	}

	if err := os.WriteFile(path, []byte(strings.ReplaceAll(storeRole, "%s", "B")), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, at, at)
	run("STORE_B=from-b", "STORE_A")
	after, _ := filepath.Glob(filepath.Join(store, "*.set"))
	if !slices.ContainsFunc(after, func(a string) bool { return !slices.Contains(before, a) }) {
		t.Fatalf("the edited role's set was not stored: %v then %v", before, after)
	}
}
