//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/control"
)

// ckptAgent is an agent the checkpoint benchmark suspends and restores:
// its command writes /tmp/ready once it holds what it holds.
type ckptAgent struct {
	name, image string
	argv        []string
}

var ckptAgents = []ckptAgent{
	{"idle", agentImage, []string{"sh", "-c", "echo up >/tmp/ready; sleep 3600"}},
	{"200MiB resident", realAgentImage, []string{"python3", "-c",
		"b = bytearray(b'\\x01') * (200 << 20)\nopen('/tmp/ready', 'w').write('up')\nimport time\ntime.sleep(3600)"}},
}

// ctrReady waits until the ctr container answers an exec finding
// /tmp/ready, and says how long that took.
func ctrReady(id string, start time.Time) (time.Duration, error) {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r := dev.ctr(20*time.Second, "task", "exec", "--exec-id", uniqueID("ready"), id, "test", "-f", "/tmp/ready"); r.code == 0 {
			return time.Since(start), nil
		}
	}
	return 0, fmt.Errorf("%s did not get ready in 60s", id)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestBenchmarkCheckpoint: for an idle agent and one holding 200 MiB,
// how long a checkpoint takes, how large the image is, and how long a
// restore into a new sandbox takes until the agent answers, against the
// same agent booted cold; and the shared store's part: writing the image
// there, encrypted, and a restore on a node whose store lacks it.
func TestBenchmarkCheckpoint(t *testing.T) {
	requireBench(t)
	requireRealAgentImage(t)
	rounds := benchRounds("AGENTBOX_BENCH_CKPT_ROUNDS", 3)
	var b strings.Builder
	fmt.Fprintf(&b, "checkpoint and restore (ctr containers, role baseline), median of %d rounds\n", rounds)
	for _, a := range ckptAgents {
		var cold, ckpt, ckptWall, restore, shared, remote []time.Duration
		var bytes []int64
		for i := 0; i < rounds; i++ {
			id := uniqueID("bckpt")
			start := time.Now()
			if r := dev.ctr(60*time.Second, append([]string{"run", "-d", "--runtime", runtimeType, a.image, id}, a.argv...)...); r.code != 0 {
				t.Fatalf("ctr run: %v", r)
			}
			d, err := ctrReady(id, start)
			if err != nil {
				t.Fatal(err)
			}
			cold = append(cold, d)
			name := uniqueID("bench-cp")
			start = time.Now()
			r := sandboxCLI("suspend", "--name", name, "--reason", "bench", "-o", "json", id)
			ckptWall = append(ckptWall, time.Since(start))
			var resp control.Response
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &resp) != nil || resp.Checkpoint == nil {
				t.Fatalf("suspend: %v", r)
			}
			ckpt = append(ckpt, time.Duration(resp.Checkpoint.Millis)*time.Millisecond)
			bytes = append(bytes, resp.Checkpoint.Bytes)
			dev.removeContainer(id)
			rid := uniqueID("bckpt-r")
			start = time.Now()
			if r := dev.ctr(60*time.Second, append([]string{"run", "-d", "--runtime", runtimeType, "--annotation", "agentbox.dev/restore-from=" + name, a.image, rid}, a.argv...)...); r.code != 0 {
				t.Fatalf("ctr run restoring: %v", r)
			}
			d, err = ctrReady(rid, start)
			if err != nil {
				t.Fatal(err)
			}
			restore = append(restore, d)
			dev.removeContainer(rid)
			// On another node: its store lacks the image, which the
			// restore takes (decrypts, checks, signs) from the shared store.
			shared = append(shared, time.Duration(resp.Checkpoint.SharedMillis)*time.Millisecond)
			if r := sandboxCLI("checkpoints", "--remove", name); r.code != 0 {
				t.Fatalf("removing the node's image: %v", r)
			}
			rid = uniqueID("bckpt-s")
			start = time.Now()
			if r := dev.ctr(60*time.Second, append([]string{"run", "-d", "--runtime", runtimeType, "--annotation", "agentbox.dev/restore-from=" + name, a.image, rid}, a.argv...)...); r.code != 0 {
				t.Fatalf("ctr run restoring from the shared store: %v", r)
			}
			if d, err = ctrReady(rid, start); err != nil {
				t.Fatal(err)
			}
			remote = append(remote, d)
			dev.removeContainer(rid)
			sandboxCLI("checkpoints", "--remove", name)
		}
		sort.Slice(bytes, func(i, j int) bool { return bytes[i] < bytes[j] })
		fmt.Fprintf(&b, "  %-16s checkpoint (gVisor) %v, suspend request %v, image %.1f MiB; restore to an answering agent %v, vs booted cold %v (%.2fx)\n",
			a.name, median(ckpt), median(ckptWall).Round(time.Millisecond), float64(bytes[len(bytes)/2])/(1<<20),
			median(restore).Round(time.Millisecond), median(cold).Round(time.Millisecond), float64(median(restore))/float64(median(cold)))
		fmt.Fprintf(&b, "  %-16s shared store (encrypted): written in %v after the suspend; restore on a node without the image %v (%.2fx the local restore)\n",
			"", median(shared), median(remote).Round(time.Millisecond), float64(median(remote))/float64(median(restore)))
	}
	report := strings.TrimRight(b.String(), "\n")
	t.Log("\n" + report)
	benchOut(t, report)
}

// TestBenchmarkTemplateStart: the CRI pod start, from RunPodSandbox to the
// agent's first output, of a Python agent that imports a heavy module set:
// booted cold under agentbox, restored from its role's template, and under
// runc, in interleaved rounds.
func TestBenchmarkTemplateStart(t *testing.T) {
	requireBench(t)
	requireRealAgentImage(t)
	makePyTemplate(t)
	rounds := benchRounds("AGENTBOX_BENCH_CRI_ROUNDS", 15) / 2
	if rounds < 3 {
		rounds = 3
	}
	variants := []struct{ name, handler, ns, role string }{
		{"agentbox cold", "agentbox", "e2e-py", "e2e-py"},
		{"agentbox template", "agentbox", "e2e-py-warm", "e2e-py-warm"},
		{"runc", "runc", "bench", ""},
	}
	got := map[string][]time.Duration{}
	for i := 0; i < rounds; i++ {
		for _, v := range variants {
			ann := map[string]string{}
			if v.role != "" {
				ann["agentbox.dev/role"] = v.role
			}
			p, _, d, err := pyAgentPod(v.handler, v.ns, fmt.Sprintf("tmpl-%d", i), ann)
			removePod(p)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			got[v.name] = append(got[v.name], d)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Python agent (heavy imports) through the CRI, RunPodSandbox to its first output, median of %d interleaved rounds\n", rounds)
	runc := median(got["runc"])
	for _, v := range variants {
		m := median(got[v.name])
		fmt.Fprintf(&b, "  %-18s %v (%.2fx runc)\n", v.name, m.Round(time.Millisecond), float64(m)/float64(runc))
	}
	report := strings.TrimRight(b.String(), "\n")
	t.Log("\n" + report)
	benchOut(t, report)
}
