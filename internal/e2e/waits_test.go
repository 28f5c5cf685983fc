//go:build e2e

package e2e

import (
	"slices"
	"testing"
	"time"
)

// TestWaitAnsweredInShim: a container's exit is waited for in the shim,
// over its sandbox's control socket, not by a `runsc wait` process for
// each container as long as it runs; and the statuses are runsc wait's: a
// container that exits 3 ends 3, one killed by SIGKILL 137, and a
// short-lived one's status is not lost.
func TestWaitAnsweredInShim(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	cfg, calls := loggingRunsc(t)
	for _, c := range []struct {
		script string
		want   int
	}{
		{"sleep 1; exit 3", 3},
		{"exit 5", 5}, // gone before any wait could connect
		{"kill -9 $$", 137},
		{"true", 0},
	} {
		id := uniqueID("wait")
		r := dev.ctr(60*time.Second, "run", "--rm", "--runtime", runtimeType, "--runtime-config-path", cfg, agentImage, id, "sh", "-c", c.script)
		if r.code != c.want {
			t.Errorf("%q: ctr run ended %d, want %d (%s)", c.script, r.code, c.want, clip(r.stderr))
		}
	}
	if cmds := runscCommands(t, calls); slices.Contains(cmds, "wait") {
		t.Errorf("runsc wait ran: %q", cmds)
	}
}
