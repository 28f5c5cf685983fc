//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestForkCopies: a running agent forked into three copies. A checkpoint
// of the counter agent is taken while it runs (it goes on counting), and
// three pods restore it at once: each goes on from the count it was
// forked at, as its own sandbox: its own filesystem (a file one copy
// writes, the others never see), its own egress rules on its own network
// (its refused connection is in its trail, not the source's or another
// copy's), and its own trail, which begins by linking to the source's
// record of the fork, and which audit verify follows.
func TestForkCopies(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	src, srcID := counterPod(t, "fork-src", "")
	if r := waitLogsWithin(t, srcID, "count 6\n", 30*time.Second); !strings.Contains(r.stdout, "count 6\n") {
		t.Fatalf("the source did not count: %v", r)
	}
	name := uniqueID("fork")
	r := sandboxCLI("checkpoint", "--name", name, "--reason", "e2e: fork", "--pod", "e2e-cp/fork-src")
	if r.code != 0 {
		t.Fatalf("checkpoint: %v", r)
	}
	cp := findRecord(trailSoFar(t, src.id), "agentbox/checkpointed")
	if cp == nil || cp.Detail["checkpoint"] != name || cp.Detail["suspended"] != "false" {
		t.Fatalf("the source's record of the fork: %+v", cp)
	}
	// The copies start together.
	const n = 3
	copies, ids := make([]*pod, n), make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			copies[i], ids[i] = counterPod(t, fmt.Sprintf("fork-copy-%d", i), name)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// The source goes on; each copy goes on from the fork.
	at := 0
	for i, id := range ids {
		r := waitLogsWithin(t, id, "allowed status=200", 30*time.Second)
		c := counts(r.stdout)
		if len(c) == 0 || c[0] < 7 {
			t.Fatalf("copy %d: counted %v, want to go on from the source's count", i, c[:min(len(c), 5)])
		}
		if at == 0 {
			at = c[0]
		}
		if c[0] != at {
			t.Errorf("copy %d went on from %d, copy 0 from %d: one image, one count", i, c[0], at)
		}
	}
	if r := waitLogsWithin(t, srcID, fmt.Sprintf("count %d\n", at+10), 30*time.Second); !strings.Contains(r.stdout, fmt.Sprintf("count %d\n", at+10)) {
		t.Errorf("the source stopped after the fork: %s", clip(r.stdout))
	}
	t.Logf("forked at count %d; %d copies went on from it, and the source went on", at-1, n)
	// Each copy's filesystem is its own.
	if ex := dev.crictl(30*time.Second, "exec", ids[0], "sh", "-c", "echo mine > /tmp/only-copy-0 && echo written"); ex.code != 0 {
		t.Fatalf("copy 0: %v", ex)
	}
	for _, id := range append([]string{srcID}, ids[1:]...) {
		if ex := dev.crictl(30*time.Second, "exec", id, "sh", "-c", "test -e /tmp/only-copy-0 && echo shared || echo own"); strings.TrimSpace(ex.stdout) != "own" {
			t.Errorf("%s sees copy 0's file: %v", id, ex)
		}
	}
	// Each trail is its own: it begins with the link to the fork, and
	// holds its own refused connection.
	var links []string
	for i, p := range copies {
		var recs []record
		eventually(t, 30*time.Second, func() bool {
			recs = trailSoFar(t, p.id)
			return findRecord(recs, "agentbox/egress_denied") != nil
		})
		if len(recs) == 0 {
			t.Errorf("copy %d: no trail", i)
			continue
		}
		if recs[0].Event != "agentbox/restored" || recs[0].Detail["previous_sandbox"] != src.id ||
			recs[0].Detail["checkpoint"] != name || recs[0].Detail["previous_hash"] == "" {
			t.Errorf("copy %d's trail begins with %+v", i, recs[0])
		}
		if links = append(links, recs[0].Detail["previous_seq"]+" "+recs[0].Detail["previous_hash"]); links[i] != links[0] {
			t.Errorf("copy %d links to %s, copy 0 to %s: one fork, one record", i, links[i], links[0])
		}
		if findRecord(recs, "agentbox/egress_denied") == nil {
			t.Errorf("copy %d: no egress_denied record of its own", i)
		}
		v := agentbox("audit", "verify", "--open", filepath.Join(dev.dir, "audit", src.id+".jsonl"), filepath.Join(dev.dir, "audit", p.id+".jsonl"))
		if v.code != 0 || !strings.Contains(v.stdout, "LINK  "+p.id+": restored from checkpoint "+name) || !strings.Contains(v.stdout, "(linked:") {
			t.Errorf("copy %d: audit verify: %v", i, v)
		}
	}
	for _, p := range copies {
		p.remove()
	}
	src.remove()
	sandboxCLI("checkpoints", "--remove", name)
}
