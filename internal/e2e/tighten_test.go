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

// liveRole is the e2e-live role with hosts allowed on port 80 and a
// memory limit, and its binding.
func liveRole(memory string, hosts ...string) string {
	var allow []string
	for _, h := range hosts {
		allow = append(allow, fmt.Sprintf("{host: %s, ports: [80]}", h))
	}
	return fmt.Sprintf(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-live}
spec:
  inherits: baseline
  credentials:
    env: {allow: [PATH, "AGENT_*"]}
  limits: {memory: %s}
  network:
    egress: allowlist
    allow: [%s]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-live}
spec:
  role: e2e-live
  subjects: [{namespace: e2e-live}]
`, memory, strings.Join(allow, ", "))
}

// writePolicy replaces a policy file of the dev daemon's in one rename.
func writePolicy(t *testing.T, name, body string) {
	t.Helper()
	path := filepath.Join(dev.dir, "agentbox", "policies", name)
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// triesOf parses the agent's "== try NAME SECONDS: OUTPUT" lines ("== try
// SECONDS: OUTPUT" when name is ""): the output of each try of name at or
// after since.
func triesOf(out, name string, since time.Time) []string {
	var got []string
	for _, l := range strings.Split(out, "\n") {
		prefix := "== try "
		if name != "" {
			prefix += name + " "
		}
		rest, ok := strings.CutPrefix(l, prefix)
		if !ok {
			continue
		}
		at, res, _ := strings.Cut(rest, ": ")
		if s, err := strconv.ParseInt(at, 10, 64); err == nil && !time.Unix(s, 0).Before(since.Truncate(time.Second)) {
			got = append(got, res)
		}
	}
	return got
}

// TestRespondLiveTightening: a role edit that removes an allowed host cuts
// it from a running pod within seconds (the other host still works), and a
// later edit that would loosen the pod does not reach it; both are in its
// trail, and the pod's live digest moves from its start digest.
func TestRespondLiveTightening(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	const file = "zz-e2e-live.yaml"
	writePolicy(t, file, liveRole("512Mi", gwAllowA, gwAllowB))
	t.Cleanup(func() { os.Remove(filepath.Join(dev.dir, "agentbox", "policies", file)) })
	p := newPodIn(t, "live", "e2e-live", map[string]string{"agentbox.dev/role": "e2e-live"})
	try := func(name string) string {
		return fmt.Sprintf(`echo "== try %s $(date +%%s): $(abx-fetch -connect %s:80 http://%s/live 2>&1)"`, name, gwAddress, name)
	}
	script := fmt.Sprintf("while :; do %s; %s; sleep 0.3; done", try(gwAllowA), try(gwAllowB))
	id := p.containerWith(t, "c", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", script}})
	memLimit := func() string {
		r := dev.crictl(30*time.Second, "inspectp", "-o", "json", p.id)
		var st struct {
			Info struct {
				Pid int `json:"pid"`
			} `json:"info"`
		}
		json.Unmarshal([]byte(r.stdout), &st)
		if cg := procCgroup(st.Info.Pid, "memory"); cg != "" {
			v, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes"))
			return strings.TrimSpace(string(v))
		}
		return "no memory cgroup for pid " + fmt.Sprint(st.Info.Pid)
	}
	if got := memLimit(); got != fmt.Sprint(512<<20) {
		t.Fatalf("the sandbox's memory limit is %s, want 512Mi", got)
	}
	if r := waitLogs(t, id, "== try "+gwAllowB); len(triesOf(r.stdout, gwAllowB, time.Time{})) == 0 ||
		!strings.Contains(triesOf(r.stdout, gwAllowB, time.Time{})[0], "status=200") {
		t.Fatalf("before the edit, %s: %s", gwAllowB, clip(r.stdout))
	}
	// Tightened: b is cut within seconds, a still works.
	edited := time.Now()
	writePolicy(t, file, liveRole("256Mi", gwAllowA))
	var cut time.Time
	eventually(t, 15*time.Second, func() bool {
		if findRecord(trailSoFar(t, p.id), "agentbox/policy_tightened") != nil {
			cut = time.Now()
		}
		return !cut.IsZero()
	})
	if cut.IsZero() {
		t.Fatalf("no policy_tightened record within 15s of the edit")
	}
	t.Logf("tightened within %v of the edit", cut.Sub(edited).Round(10*time.Millisecond))
	time.Sleep(1500 * time.Millisecond)
	after := time.Now()
	time.Sleep(1500 * time.Millisecond)
	r := dev.crictl(30*time.Second, "logs", id)
	bTries, aTries := triesOf(r.stdout, gwAllowB, after), triesOf(r.stdout, gwAllowA, after)
	if len(bTries) == 0 || len(aTries) == 0 {
		t.Fatalf("no tries after the edit: %s", clip(r.stdout))
	}
	for _, b := range bTries {
		if !strings.Contains(b, "status=403") || !strings.Contains(b, "no host rule matches "+gwAllowB) {
			t.Errorf("after the edit, %s: %s", gwAllowB, b)
		}
	}
	for _, a := range aTries {
		if !strings.Contains(a, "status=200") {
			t.Errorf("after the edit, %s: %s", gwAllowA, a)
		}
	}
	recs := trailSoFar(t, p.id)
	tight := findRecord(recs, "agentbox/policy_tightened")
	if tight == nil || !strings.Contains(tight.Detail["applied"], "host b.gw.e2e.test ports [80] removed") || tight.Detail["new_digest"] == tight.Detail["start_digest"] ||
		!strings.Contains(tight.Detail["applied"], fmt.Sprintf("memory limit %d -> %d bytes", 512<<20, 256<<20)) {
		t.Errorf("tightened record %+v", tight)
	}
	if got := memLimit(); got != fmt.Sprint(256<<20) {
		t.Errorf("after the tightening, the sandbox's memory limit is %s, want 256Mi", got)
	}
	var sb control.Sandbox
	for _, s := range listSandboxes(t) {
		if s.ID == p.id {
			sb = s
		}
	}
	if tight != nil && (sb.LiveDigest != tight.Detail["new_digest"] || sb.StartDigest == sb.LiveDigest) {
		t.Errorf("sandbox list: start %s live %s, want live %s", sb.StartDigest, sb.LiveDigest, tight.Detail["new_digest"])
	}
	ex := agentbox("policy", "explain", "--config", filepath.Join(dev.dir, "agentbox", "config.toml"), "--role", "e2e-live", "--namespace", "e2e-live")
	if ex.code != 0 || !strings.Contains(ex.stdout, p.id[:12]+" e2e-live/live: ") || !strings.Contains(ex.stdout, "(tightened live") {
		t.Errorf("policy explain does not show the running sandbox's live digest: %v", ex)
	}
	// Loosened: b and another name back in the role; the running pod does
	// not take them, and says so.
	writePolicy(t, file, liveRole("1Gi", gwAllowA, gwAllowB, gwOther))
	var pending *record
	eventually(t, 15*time.Second, func() bool {
		pending = findRecord(trailSoFar(t, p.id), "agentbox/policy_pending")
		return pending != nil
	})
	if got := memLimit(); got != fmt.Sprint(256<<20) {
		t.Errorf("after the loosening edit, the sandbox's memory limit is %s, want 256Mi still", got)
	}
	if pending == nil || !strings.Contains(pending.Detail["pending"], "host b.gw.e2e.test ports [80] (loosens)") ||
		!strings.Contains(pending.Detail["pending"], "host other.gw.e2e.test ports [80] (loosens)") {
		t.Fatalf("pending record %+v", pending)
	}
	later := time.Now()
	time.Sleep(2 * time.Second)
	r = dev.crictl(30*time.Second, "logs", id)
	for _, b := range triesOf(r.stdout, gwAllowB, later) {
		if !strings.Contains(b, "status=403") {
			t.Errorf("after the loosening edit, %s reached: %s", gwAllowB, b)
		}
	}
	// A new pod under the same role takes the new version whole.
	p2 := newPodIn(t, "live2", "e2e-live", map[string]string{"agentbox.dev/role": "e2e-live"})
	id2 := p2.containerWith(t, "c", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", try(gwAllowB) + "; sleep 600"}})
	if r := waitLogs(t, id2, "== try "); !strings.Contains(r.stdout, "status=200") {
		t.Errorf("a new pod under the loosened role: %s", clip(r.stdout))
	}
}
