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

	"agentbox.dev/agentbox/internal/control"
)

// counterScript is an agent with state only in memory: a counter it keeps
// incrementing, printed and written through a file it holds open; every
// fifth count it fetches from the web host on the port its role allows,
// and, in the background, on one it does not.
const counterScript = `i=0; exec 3>>/tmp/state; while :; do i=$((i+1)); echo "count $i"; echo "count $i" >&3; ` +
	`if [ $((i % 5)) = 0 ]; then echo "allowed $(abx-fetch http://198.51.100.10/ping 2>&1) at $i"; (abx-fetch http://198.51.100.10:443/ping >/dev/null 2>&1 &); fi; sleep 0.2; done`

// counterPod runs the counter agent in a pod of namespace e2e-cp under
// role e2e-cp, restored from checkpoint from unless it is "", and returns
// the pod and the agent's container.
func counterPod(t *testing.T, name, from string) (*pod, string) {
	t.Helper()
	ann := map[string]string{"agentbox.dev/role": "e2e-cp"}
	if from != "" {
		ann["agentbox.dev/restore-from"] = from
	}
	p := newPodIn(t, name, "e2e-cp", ann)
	return p, p.containerWith(t, "agent", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", counterScript}})
}

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
	a, aID := counterPod(t, "cp-agent", "")
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
	b, bID := counterPod(t, "cp-agent-restored", name)
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
	eventually(t, 30*time.Second, func() bool {
		for _, rec := range trailSoFar(t, b.id) {
			if rec.Event == "agentbox/egress_denied" && rec.Dst != nil && rec.Dst.Port == 443 {
				denied = &rec
				return true
			}
		}
		return false
	})
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
		// Another namespace's pod, under a role no looser (baseline has no
		// egress at all), does not get the agent's memory.
		{"cp-other-ns", "baseline", name, "restored only where it was taken"},
	} {
		ns := "e2e-cp"
		if tc.name == "cp-other-ns" {
			ns = "agents"
		}
		_, r := tryPod(t, tc.name, ns, map[string]string{"agentbox.dev/role": tc.role, "agentbox.dev/restore-from": tc.from})
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
	_, r = tryPod(t, "cp-tampered", "e2e-cp", map[string]string{"agentbox.dev/role": "e2e-cp", "agentbox.dev/restore-from": name})
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

// pyAgentScript is a Python agent that imports a heavy module set, then
// works (a numbered line every 50 ms).
const pyAgentScript = `import time
import asyncio, email.parser, http.client, json, sqlite3, xml.etree.ElementTree, unittest, argparse, urllib.request
import ssl, decimal, logging, subprocess, multiprocessing, concurrent.futures, csv, zipfile, tarfile, pydoc, difflib
import inspect, typing, dataclasses, statistics, fractions, shutil, tempfile, pathlib, hashlib, hmac, secrets, uuid
n = 0
while True:
    n += 1
    print("agent", n, flush=True)
    time.sleep(0.05)
`

// pyAgent is the Python agent's container.
var pyAgent = map[string]any{
	"metadata": map[string]any{"name": "agent"}, "image": map[string]any{"image": realAgentImage},
	"command": []string{"python3", "-c", pyAgentScript}, "log_path": "agent.log",
	"linux": map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
}

// pyAgentPod starts the Python agent in a pod through the CRI, as the
// kubelet does, and returns the pod, its container and how long it took
// from RunPodSandbox to the agent's first line in its log.
func pyAgentPod(handler, namespace, name string, annotations map[string]string) (*pod, string, time.Duration, error) {
	start := time.Now()
	p, _, err := criPod(criVariant{name, handler, namespace, annotations}, name, pyAgent)
	if err != nil {
		return p, "", 0, err
	}
	logFile := filepath.Join(p.logDir, "agent.log")
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(logFile); err == nil && strings.Contains(string(b), " agent ") {
			return p, p.containers[0], time.Since(start), nil
		}
	}
	b, _ := os.ReadFile(logFile)
	return p, p.containers[0], 0, fmt.Errorf("no output from the agent in 60s: %q", clip(string(b)))
}

// makePyTemplate boots the Python agent under e2e-py and suspends it as
// the checkpoint e2e-py-warm names: the template of role e2e-py-warm.
func makePyTemplate(t *testing.T) time.Duration {
	t.Helper()
	os.RemoveAll(filepath.Join(dev.dir, "checkpoints", "e2e-py-warm"))
	p, _, cold, err := pyAgentPod("agentbox", "e2e-py", "py-template", map[string]string{"agentbox.dev/role": "e2e-py"})
	defer removePod(p)
	if err != nil {
		t.Fatalf("the template's agent: %v", err)
	}
	r := sandboxCLI("suspend", "--name", "e2e-py-warm", "--reason", "e2e: the template of role e2e-py-warm", p.id)
	if r.code != 0 {
		t.Fatalf("suspend: %v", r)
	}
	return cold
}

// TestCheckpointTemplate: a role that names a template checkpoint starts
// its pods from it: a Python agent with its imports done is working in the
// new pod without booting; its trail says which template, and its wall
// clock starts afresh.
func TestCheckpointTemplate(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	cold := makePyTemplate(t)
	p, cid, warm, err := pyAgentPod("agentbox", "e2e-py-warm", "py-warm", map[string]string{"agentbox.dev/role": "e2e-py-warm"})
	defer removePod(p)
	if err != nil {
		t.Fatalf("a pod under the template's role: %v", err)
	}
	t.Logf("the agent's first output: %v booted cold, %v from the template", cold.Round(time.Millisecond), warm.Round(time.Millisecond))
	recs := trailSoFar(t, p.id)
	rs := findRecord(recs, "agentbox/restored")
	if rs == nil || rs.Detail["checkpoint"] != "e2e-py-warm" || rs.Detail["template"] != "true" || rs.Detail["wall_clock_used"] != "0s" {
		t.Fatalf("restored record: %+v", rs)
	}
	// The restored agent goes on counting where the template stopped: it
	// did not boot (a booted one starts at 1).
	out := waitLogsWithin(t, cid, "agent ", 20*time.Second).stdout
	first := strings.Fields(strings.SplitN(strings.TrimSpace(out), "\n", 2)[0])
	if len(first) != 2 || first[0] != "agent" || first[1] == "1" {
		t.Fatalf("the agent's first line in the new pod: %q", first)
	}
	if sb := findSandbox(t, p.id); sb == nil || sb.WallClockLeft == "" || !strings.HasPrefix(sb.WallClockLeft, "14m") && !strings.HasPrefix(sb.WallClockLeft, "15m") {
		t.Fatalf("the template-started sandbox's wall clock: %+v", sb)
	}
}

// findSandbox is the sandbox list's entry for id.
func findSandbox(t *testing.T, id string) *control.Sandbox {
	t.Helper()
	for _, sb := range listSandboxes(t) {
		if sb.ID == id {
			return &sb
		}
	}
	return nil
}

// TestCheckpointCRI: the CRI's CheckpointContainer (what the kubelet's
// checkpoint API calls) reaches the shim: the agent keeps running, the
// archive containerd writes holds the signed pointer, not the memory, and
// a new pod in the same namespace restores the checkpoint it names.
func TestCheckpointCRI(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	a, aID := counterPod(t, "cri-cp", "")
	waitLogsWithin(t, aID, "count 5\n", 30*time.Second)
	archive := filepath.Join(t.TempDir(), "checkpoint.tar")
	if r := dev.crictl(2*time.Minute, "checkpoint", "--export="+archive, aID); r.code != 0 {
		t.Fatalf("crictl checkpoint: %v", r)
	}
	if st, _ := containerState(t, aID); st != "CONTAINER_RUNNING" {
		t.Fatalf("the agent is %s after the kubelet's checkpoint, want running", st)
	}
	r := runCommand(30*time.Second, nil, nil, "tar", "-xOf", archive, "checkpoint/agentbox-checkpoint.json")
	var ptr struct {
		Manifest struct {
			Name      string `json:"name"`
			SandboxID string `json:"sandboxId"`
			Files     []struct {
				Size int64 `json:"size"`
			} `json:"files"`
		} `json:"manifest"`
		MAC string `json:"mac"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ptr) != nil || ptr.Manifest.SandboxID != a.id || len(ptr.MAC) != 64 {
		t.Fatalf("the archive's pointer: %v", r)
	}
	if ls := runCommand(30*time.Second, nil, nil, "tar", "-tvf", archive); strings.Contains(ls.stdout, "pages") {
		t.Fatalf("the archive holds the agent's memory:\n%s", ls.stdout)
	}
	_, bID := counterPod(t, "cri-cp-restored", ptr.Manifest.Name)
	got := counts(waitLogsWithin(t, bID, "count ", 30*time.Second).stdout)
	if len(got) == 0 || got[0] < 6 {
		t.Fatalf("the restored agent counted %v: it did not go on from the checkpoint", got)
	}
	t.Logf("checkpointed through the CRI as %s; the restored agent went on at %d", ptr.Manifest.Name, got[0])
}

// TestRestoreFailedAtStartEnds: a checkpoint that passes every check of
// agentbox's can still be refused by runsc at Start (here: the new
// container's argv is not the one checkpointed). The container then ends,
// reported, and `ctr task delete -f` removes it at once: runsc had left the
// sandbox process waiting and gVisor's task service never learned of an
// exit, so the delete waited forever and the sandbox and its gofer
// outlived it. The legitimate twin, the same argv, restores (above,
// TestCheckpointCtr).
func TestRestoreFailedAtStartEnds(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("rsfail")
	if r := dev.ctr(30*time.Second, "run", "-d", "--runtime", runtimeType, agentImage, id, "sh", "-c", "while :; do sleep 1; done"); r.code != 0 {
		t.Fatalf("ctr run: %v", r)
	}
	defer dev.removeContainer(id)
	if r := dev.ctr(60*time.Second, "task", "checkpoint", id); r.code != 0 {
		t.Fatalf("ctr task checkpoint: %v", r)
	}
	var name string
	for _, c := range storedCheckpoints(t) {
		if c.SandboxID == id {
			name = c.Name
		}
	}
	if name == "" {
		t.Fatal("no image in the node's store")
	}
	rid := uniqueID("rsfail-restored")
	r := dev.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType, "--annotation", "agentbox.dev/restore-from="+name,
		agentImage, rid, "sh", "-c", "sleep 1000")
	if r.code == 0 || !strings.Contains(r.stderr, `"Args" does not match`) {
		t.Fatalf("a restore with another argv: want runsc's refusal, got %v", r)
	}
	defer dev.removeContainer(rid)
	if r := dev.ctr(30*time.Second, "task", "delete", "-f", rid); r.code != 0 || r.timedOut {
		t.Fatalf("ctr task delete -f of the refused restore: %v", r)
	}
	if r := dev.ctr(10*time.Second, "task", "ls"); strings.Contains(r.stdout, rid) {
		t.Errorf("the refused restore's task is still listed:\n%s", r.stdout)
	}
	recs := readTrail(t, rid)
	var failed, stopped bool
	for _, rec := range recs {
		failed = failed || rec.Event == "agentbox/sandbox_failed" && strings.Contains(rec.Message, "from checkpoint "+name) && strings.Contains(rec.Message, "does not match")
		stopped = stopped || rec.Event == "agentbox/container_exit" && strings.Contains(rec.Message, "its restore from checkpoint "+name+" failed")
	}
	if !failed || !stopped {
		t.Errorf("the trail should say the restore failed (%v) and why the container stopped (%v)", failed, stopped)
		for _, rec := range recs {
			t.Logf("%s %s", rec.Event, rec.Message)
		}
	}
}
