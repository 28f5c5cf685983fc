//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBenchmarkFork: a running agent holding 200 MiB forked into N copies
// (one checkpoint, the source running on, then N sandboxes restored from
// it at once), for N = 1, 4 and 10: from the fork to every copy answering,
// against N of the same agent booted cold at once, to every one answering
// (ctr containers, role baseline).
func TestBenchmarkFork(t *testing.T) {
	requireBench(t)
	requireRealAgentImage(t)
	rounds := benchRounds("AGENTBOX_BENCH_FORK_ROUNDS", 3)
	a := ckptAgents[1]
	var b strings.Builder
	fmt.Fprintf(&b, "fork of a running agent holding 200 MiB into N copies, to all answering (ctr containers, role baseline), median of %d rounds\n", rounds)
	for _, n := range []int{1, 4, 10} {
		var fork, frozen, cold []time.Duration
		for i := 0; i < rounds; i++ {
			src := uniqueID("bfork")
			if r := dev.ctr(60*time.Second, append([]string{"run", "-d", "--runtime", runtimeType, a.image, src}, a.argv...)...); r.code != 0 {
				t.Fatalf("ctr run: %v", r)
			}
			if _, err := ctrReady(src, time.Now()); err != nil {
				t.Fatal(err)
			}
			name := uniqueID("bench-fork")
			start := time.Now()
			if r := sandboxCLI("checkpoint", "--name", name, "--reason", "bench", src); r.code != 0 {
				t.Fatalf("checkpoint: %v", r)
			}
			took := time.Since(start)
			d, err := startAll(n, func(id string) []string {
				return append([]string{"run", "-d", "--runtime", runtimeType, "--annotation", "agentbox.dev/restore-from=" + name, a.image, id}, a.argv...)
			})
			if err != nil {
				t.Fatalf("%d copies: %v", n, err)
			}
			frozen, fork = append(frozen, took), append(fork, took+d)
			dev.removeContainer(src)
			sandboxCLI("checkpoints", "--remove", name)
			d, err = startAll(n, func(id string) []string {
				return append([]string{"run", "-d", "--runtime", runtimeType, a.image, id}, a.argv...)
			})
			if err != nil {
				t.Fatalf("%d cold: %v", n, err)
			}
			cold = append(cold, d)
		}
		f, c := median(fork), median(cold)
		fmt.Fprintf(&b, "  N=%-2d fork to all copies answering %v (the checkpoint %v of it), vs %d booted cold %v (%.2fx)\n",
			n, f.Round(time.Millisecond), median(frozen).Round(time.Millisecond), n, c.Round(time.Millisecond), float64(f)/float64(c))
	}
	report := strings.TrimRight(b.String(), "\n")
	t.Log("\n" + report)
	benchOut(t, report)
}

// startAll starts n ctr containers at once (argv: ctr's arguments for a
// container's id) and says how long until every one answered; it removes
// them.
func startAll(n int, argv func(id string) []string) (time.Duration, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = uniqueID("bfork-c")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := dev.ctr(120*time.Second, argv(ids[i])...); r.code != 0 {
				errs[i] = fmt.Errorf("ctr run: %v", r)
				return
			}
			_, errs[i] = ctrReady(ids[i], start)
		}()
	}
	wg.Wait()
	d := time.Since(start)
	for _, id := range ids {
		dev.removeContainer(id)
	}
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return d, nil
}
