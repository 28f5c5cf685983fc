//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// counterScript is an agent with state only in memory: a counter it keeps
// incrementing, printed and written through a file it holds open; every
// fifth count it fetches from the web host on the port its role allows,
// and, in the background, on one it does not.
const counterScript = `i=0; exec 3>>/tmp/state; while :; do i=$((i+1)); echo "count $i"; echo "count $i" >&3; ` +
	`if [ $((i % 5)) = 0 ]; then echo "allowed $(abx-fetch http://198.51.100.10/ping 2>&1) at $i"; (abx-fetch http://198.51.100.10:443/ping >/dev/null 2>&1 &); fi; sleep 0.2; done`

// counts are the counter values in a container's logs, in order.
func counts(out string) []int {
	var n []int
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "count "); ok {
			if v, err := strconv.Atoi(rest); err == nil {
				n = append(n, v)
			}
		}
	}
	return n
}

// storedCheckpoint is a row of `agentbox sandbox checkpoints -o json`.
type storedCheckpoint struct {
	Name      string `json:"name"`
	SandboxID string `json:"sandboxId"`
	Role      string `json:"role"`
	Suspended bool   `json:"suspended"`
	Bytes     int64  `json:"bytes"`
	Check     string `json:"check"`
}

func storedCheckpoints(t *testing.T) []storedCheckpoint {
	t.Helper()
	r := sandboxCLI("checkpoints", "-o", "json")
	if r.code != 0 {
		t.Fatalf("sandbox checkpoints: %v", r)
	}
	var out []storedCheckpoint
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("sandbox checkpoints: %v: %s", err, r.stdout)
	}
	return out
}

// TestCheckpointSuspendRestore: an agent with in-memory state is
// suspended, its pod deleted, and a new pod restores it: its counter goes
// on from where it was, through the same open file; its role's egress
// holds on the new pod's network; its trail verifies across both pods'
// files. A tampered image, a looser role and a path are refused.
func TestCheckpointSuspendRestore(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	ann := map[string]string{"agentbox.dev/role": "e2e-cp"}
	agent := map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", counterScript}}
	a := newPodIn(t, "cp-agent", "e2e-cp", ann)
	aID := a.containerWith(t, "agent", agent)
	if r := waitLogsWithin(t, aID, "allowed status=200", 30*time.Second); !strings.Contains(r.stdout, "allowed status=200") {
		t.Fatalf("the agent did not reach the web host: %v", r)
	}
	name := uniqueID("cp")
	r := sandboxCLI("suspend", "--name", name, "--reason", "e2e: waiting for review", "--pod", "e2e-cp/cp-agent")
	if r.code != 0 || !strings.Contains(r.stdout, "suspended into") {
		t.Fatalf("suspend: %v", r)
	}
	t.Logf("%s", strings.TrimSpace(r.stdout))
	waitState(t, aID, "CONTAINER_EXITED")
	before := counts(dev.crictl(30*time.Second, "logs", aID).stdout)
	if len(before) < 5 {
		t.Fatalf("the agent counted %v before its suspend", before)
	}
	last := before[len(before)-1]
	cp := findRecord(trailSoFar(t, a.id), "agentbox/checkpointed")
	if cp == nil || cp.Detail["checkpoint"] != name || cp.Detail["suspended"] != "true" || cp.Detail["reason"] != "e2e: waiting for review" {
		t.Fatalf("checkpointed record: %+v", cp)
	}
	var stored *storedCheckpoint
	for _, c := range storedCheckpoints(t) {
		if c.Name == name {
			stored = &c
		}
	}
	if stored == nil || stored.SandboxID != a.id || stored.Role != "e2e-cp" || !stored.Suspended || stored.Check != "ok" || stored.Bytes == 0 {
		t.Fatalf("the store's checkpoint: %+v", stored)
	}
	dir := filepath.Join(dev.dir, "checkpoints", name)
	for _, f := range []string{dir, filepath.Join(dir, "pages.img")} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s: %v %v: the image holds the agent's memory and must be root's alone", f, st.Mode(), err)
		}
	}
	// The suspended pod is deleted; a new one restores it.
	dev.crictl(60*time.Second, "stopp", a.id)
	dev.crictl(60*time.Second, "rmp", "-f", a.id)
	a.released = true
	restoreAnn := map[string]string{"agentbox.dev/role": "e2e-cp", "agentbox.dev/restore-from": name}
	b := newPodIn(t, "cp-agent-restored", "e2e-cp", restoreAnn)
	bID := b.containerWith(t, "agent", agent)
	r = waitLogsWithin(t, bID, fmt.Sprintf("count %d\n", last+3), 30*time.Second)
	after := counts(r.stdout)
	if len(after) == 0 || after[0] != last+1 {
		t.Fatalf("the counter did not go on: it was at %d, and the restored agent printed %v", last, after[:min(len(after), 5)])
	}
	t.Logf("suspended at count %d; the restored agent went on at %d", last, after[0])
	// The file it held open goes on too: one line per count, none lost.
	ex := dev.crictl(30*time.Second, "exec", bID, "sh", "-c", "head -1 /tmp/state; wc -l < /tmp/state")
	lines := strings.Fields(ex.stdout)
	if ex.code != 0 || len(lines) < 3 || lines[0]+" "+lines[1] != "count 1" {
		t.Fatalf("the agent's open file after the restore: %v", ex)
	}
	if n, _ := strconv.Atoi(lines[2]); n <= last {
		t.Fatalf("the agent's file has %d lines, and it had counted %d before the suspend", n, last)
	}
	// Egress: the role's rules hold on the new pod's network.
	if r := waitLogsWithin(t, bID, "allowed status=200 body=site=", 30*time.Second); !strings.Contains(r.stdout, "allowed status=200") {
		t.Fatalf("the restored agent does not reach the allowed port: %s", clip(r.stdout))
	}
	var denied *record
	for deadline := time.Now().Add(30 * time.Second); denied == nil && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		for _, rec := range trailSoFar(t, b.id) {
			if rec.Event == "agentbox/egress_denied" && rec.Dst != nil && rec.Dst.Port == 443 {
				denied = &rec
				break
			}
		}
	}
	if denied == nil {
		t.Error("no egress_denied record for port 443 in the restored pod's trail")
	}
	// The trail: the restored pod's begins with the link to the suspended
	// pod's checkpoint record, and verify follows it.
	recs := trailSoFar(t, b.id)
	if recs[0].Event != "agentbox/restored" || recs[0].Detail["previous_sandbox"] != a.id || recs[0].Detail["checkpoint"] != name {
		t.Fatalf("the restored trail begins with %+v", recs[0])
	}
	v := agentbox("audit", "verify", "--open", filepath.Join(dev.dir, "audit", a.id+".jsonl"), filepath.Join(dev.dir, "audit", b.id+".jsonl"))
	if v.code != 0 || !strings.Contains(v.stdout, "LINK  "+b.id+": restored from checkpoint "+name) || !strings.Contains(v.stdout, "(linked:") {
		t.Fatalf("audit verify across the suspend: %v", v)
	}
	// Refused: a looser role, a path, a name not in the store, then an
	// altered image.
	for _, tc := range []struct {
		name, role, from, want string
	}{
		{"cp-loose", "e2e-cp-loose", name, "is looser than role e2e-cp"},
		{"cp-path", "e2e-cp", "../../etc", "never a path"},
		{"cp-missing", "e2e-cp", "no-such-checkpoint", "not in the node's store"},
	} {
		_, r := tryPod(t, tc.name, "e2e-cp", map[string]string{"agentbox.dev/role": tc.role, "agentbox.dev/restore-from": tc.from})
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: want a refusal with %q, got %v", tc.name, tc.want, r)
		}
	}
	pages := filepath.Join(dir, "pages.img")
	data, err := os.ReadFile(pages)
	if err != nil || len(data) == 0 {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(pages, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, r = tryPod(t, "cp-tampered", "e2e-cp", restoreAnn)
	if r.code == 0 || !strings.Contains(r.stderr, "does not match its manifest") {
		t.Errorf("an altered image: want a refusal, got %v", r)
	}
	for _, c := range storedCheckpoints(t) {
		if c.Name == name && !strings.Contains(c.Check, "does not match its manifest") {
			t.Errorf("sandbox checkpoints shows the altered image as %q", c.Check)
		}
	}
}

// TestCheckpointCtr: containerd's task API (ctr task checkpoint) takes a
// snapshot the sandbox keeps running after; containerd's checkpoint image
// holds the signed pointer, the memory stays in the node's store; a ctr
// container restores from it and counts on.
func TestCheckpointCtr(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("ckpt")
	// The counter, as the agent holds it now, in a file exec reads.
	script := `i=0; while :; do i=$((i+1)); echo "count $i" >/tmp/now; sleep 0.2; done`
	now := func(id string) int {
		t.Helper()
		r := dev.ctr(20*time.Second, "task", "exec", "--exec-id", uniqueID("look"), id, "cat", "/tmp/now")
		c := counts(r.stdout)
		if r.code != 0 || len(c) != 1 {
			t.Fatalf("reading %s's counter: %v", id, r)
		}
		return c[0]
	}
	r := dev.ctr(30*time.Second, "run", "-d", "--runtime", runtimeType, agentImage, id, "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("ctr run: %v", r)
	}
	defer dev.removeContainer(id)
	time.Sleep(2 * time.Second)
	r = dev.ctr(60*time.Second, "task", "checkpoint", id)
	if r.code != 0 || !strings.Contains(r.stdout, "containerd.io/checkpoint/"+id) {
		t.Fatalf("ctr task checkpoint: %v", r)
	}
	taken := now(id)
	var name string
	for _, c := range storedCheckpoints(t) {
		if c.SandboxID == id {
			name = c.Name
			if c.Suspended || c.Check != "ok" {
				t.Fatalf("a snapshot: %+v", c)
			}
		}
	}
	if name == "" {
		t.Fatal("ctr task checkpoint left no image in the node's store")
	}
	// A snapshot: the agent goes on.
	time.Sleep(time.Second)
	if later := now(id); later <= taken {
		t.Fatalf("the agent stopped counting after a snapshot: %d, then %d", taken, later)
	}
	rid := uniqueID("ckpt-restored")
	r = dev.ctr(30*time.Second, "run", "-d", "--runtime", runtimeType, "--annotation", "agentbox.dev/restore-from="+name,
		agentImage, rid, "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("ctr run restoring %s: %v", name, r)
	}
	defer dev.removeContainer(rid)
	got := now(rid)
	if got < 5 || got > taken+5 {
		t.Fatalf("the restored agent is at %d; the snapshot was taken when the original was at about %d", got, taken)
	}
	t.Logf("snapshot taken at about count %d; the restored agent is at %d", taken, got)
}

// regexpRunning says whether ctr task ls lists id as RUNNING.
func regexpRunning(ls, id string) bool {
	for _, l := range strings.Split(ls, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == id {
			return f[2] == "RUNNING"
		}
	}
	return false
}
