//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/control"
)

// sandboxCLI runs `agentbox sandbox CMD ARGS` against the dev daemon's
// control sockets (a sandbox id goes last: flags stop at it).
func sandboxCLI(cmd string, args ...string) result {
	return agentbox(append([]string{"sandbox", cmd, "--config", filepath.Join(dev.dir, "agentbox", "config.toml")}, args...)...)
}

// listSandboxes is `agentbox sandbox list -o json`.
func listSandboxes(t *testing.T) []control.Sandbox {
	t.Helper()
	r := sandboxCLI("list", "-o", "json")
	if r.code != 0 {
		t.Fatalf("sandbox list: %v", r)
	}
	var out []control.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("sandbox list: %v: %s", err, r.stdout)
	}
	return out
}

// trailSoFar reads a running sandbox's trail as it stands.
func trailSoFar(t *testing.T, sandbox string) []record {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dev.dir, "audit", sandbox+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return parseTrail(t, b)
}

// findRecord is the first record of event in recs (nil if none).
func findRecord(recs []record, event string) *record {
	for i := range recs {
		if recs[i].Event == event {
			return &recs[i]
		}
	}
	return nil
}

// progress is one "progress MS BYTES" line abx-fetch printed.
type progress struct {
	at    time.Time
	bytes int64
}

// progressLines parses abx-fetch -progress output.
func progressLines(out string) (lines []progress, ended string) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && (f[0] == "progress" || f[0] == "progress-end") {
			ms, err1 := strconv.ParseInt(f[1], 10, 64)
			n, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			lines = append(lines, progress{time.UnixMilli(ms), n})
			if f[0] == "progress-end" {
				ended = strings.Join(f[3:], " ")
			}
		}
	}
	return lines, ended
}

// lastGrowth is when the bytes received last grew.
func lastGrowth(lines []progress) time.Time {
	var at time.Time
	for i := 1; i < len(lines); i++ {
		if lines[i].bytes > lines[i-1].bytes {
			at = lines[i].at
		}
	}
	return at
}

// TestRespondQuarantine: an agent downloading from an allowed host is
// quarantined mid-transfer, through the gateway (a host rule) and straight
// through the pod's interface (a CIDR rule). The transfer stops within a
// second, its next connections fail, the agent keeps running, the trail
// says who asked and why; released, the same fetch works again.
func TestRespondQuarantine(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	type agent struct {
		name, ns, role, url, try string
		p                        *pod
		id                       string
		sandbox                  control.Sandbox
		quarantined              time.Time
	}
	agents := []*agent{
		// Through the gateway by name; the tries dial the gateway's address,
		// so that a failed lookup is not what fails them.
		{name: "quarantine-gw", ns: "e2e-gw", role: "e2e-gw", url: "http://" + gwAllowA + "/slow/60", try: "-connect " + gwAddress + ":80 http://" + gwAllowA + "/ping"},
		{name: "quarantine-cidr", ns: "e2e-gw-cidr", role: "e2e-gw-cidr", url: "http://" + webAddr + "/slow/60", try: "http://" + webAddr + "/ping"},
	}
	for _, a := range agents {
		a.p = newPodIn(t, a.name, a.ns, map[string]string{"agentbox.dev/role": a.role})
		// The download (given up once stalled for a second), then a new
		// connection after another, each answered or timed out (8 s).
		script := fmt.Sprintf(`abx-fetch -progress 100ms -stall 1s %s; while :; do echo "== try $(date +%%s): $(abx-fetch %s 2>&1)"; sleep 0.2; done`, a.url, a.try)
		a.id = a.p.containerWith(t, "c", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", script}})
	}
	// list shows both, by pod, with their role and trail.
	listed := listSandboxes(t)
	for _, a := range agents {
		for _, sb := range listed {
			if sb.Pod == a.ns+"/"+a.name {
				a.sandbox = sb
			}
		}
		if a.sandbox.ID != a.p.id || a.sandbox.Role != a.role || a.sandbox.State != "running" || a.sandbox.Quarantined ||
			a.sandbox.StartDigest == "" || a.sandbox.Egress != "allowlist" || !strings.HasSuffix(a.sandbox.Trail, a.p.id+".jsonl") {
			t.Fatalf("%s: sandbox list gives %+v (all: %+v)", a.name, a.sandbox, listed)
		}
	}
	for _, a := range agents {
		if r := waitLogs(t, a.id, "progress "); !strings.Contains(r.stdout, "progress ") {
			t.Fatalf("%s: the download did not start: %v", a.name, r)
		}
		time.Sleep(500 * time.Millisecond)
		r := sandboxCLI("quarantine", "--pod", a.ns+"/"+a.name, "--reason", "e2e: exfiltration suspected")
		a.quarantined = time.Now()
		if r.code != 0 || !strings.Contains(r.stdout, "quarantined in") {
			t.Fatalf("%s: quarantine: %v", a.name, r)
		}
		t.Logf("%s: %s", a.name, strings.TrimSpace(r.stdout))
	}
	for _, a := range agents {
		// The download ends (cut by the gateway, or stalled), then a new
		// connection is tried, and times out.
		out := waitLogsWithin(t, a.id, "== try ", 30*time.Second)
		lines, ended := progressLines(out.stdout)
		last := lastGrowth(lines)
		if len(lines) < 3 || last.IsZero() {
			t.Fatalf("%s: no download progress: %s", a.name, clip(out.stdout))
		}
		if d := last.Sub(a.quarantined); d > time.Second {
			t.Errorf("%s: the download still grew %v after the quarantine", a.name, d)
		} else {
			t.Logf("%s: the download's bytes last grew %v after the quarantine returned (%d bytes); it ended: %q", a.name, d.Round(time.Millisecond), lines[len(lines)-1].bytes, ended)
		}
		var tries []string
		for _, l := range strings.Split(out.stdout, "\n") {
			if rest, ok := strings.CutPrefix(l, "== try "); ok {
				tries = append(tries, rest)
			}
		}
		if len(tries) == 0 || !strings.Contains(tries[0], "error:") {
			t.Errorf("%s: a new connection while quarantined: %q", a.name, tries)
		}
		if st, _ := containerState(t, a.id); st != "CONTAINER_RUNNING" {
			t.Errorf("%s: the agent is %s, want running", a.name, st)
		}
		recs := trailSoFar(t, a.p.id)
		q := findRecord(recs, "agentbox/quarantined")
		if q == nil || q.Status != "Success" || q.Detail["reason"] != "e2e: exfiltration suspected" || q.Detail["requested_by_uid"] != "0" ||
			!strings.Contains(q.Detail["egress_before"], "allowlist") || !strings.HasPrefix(q.Detail["egress_after"], "none") {
			t.Errorf("%s: quarantine record %+v", a.name, q)
		}
		want := "every packet dropped on eth0 and agentbox-dns"
		if a.role == "e2e-gw" {
			want += "; resolver answers nothing; gateway refuses every connection (1 open closed)"
		}
		if q != nil && !strings.HasPrefix(q.Detail["cut"], want) {
			t.Errorf("%s: cut %q, want %q", a.name, q.Detail["cut"], want)
		}
	}
	if listed := listSandboxes(t); len(listed) > 0 {
		for _, sb := range listed {
			if (sb.ID == agents[0].p.id || sb.ID == agents[1].p.id) && (!sb.Quarantined || sb.EgressNow != "none (quarantined)") {
				t.Errorf("sandbox list during the quarantine: %+v", sb)
			}
		}
	}
	before := web.count(gwAllowA) + web.count(webAddr)
	// Released, the role's egress is back: the next connection goes through.
	for _, a := range agents {
		if r := sandboxCLI("quarantine", "--release", a.p.id[:12]); r.code != 0 || !strings.Contains(r.stdout, "released after") {
			t.Fatalf("%s: release: %v", a.name, r)
		}
	}
	for _, a := range agents {
		r := waitLogsWithin(t, a.id, "status=200 body=site=", 30*time.Second)
		if !strings.Contains(r.stdout, "status=200 body=site=") {
			t.Errorf("%s: no connection went through after the release: %s", a.name, clip(r.stdout))
		}
		if rel := findRecord(trailSoFar(t, a.p.id), "agentbox/released"); rel == nil || rel.Detail["quarantine_reason"] != "e2e: exfiltration suspected" {
			t.Errorf("%s: release record %+v", a.name, rel)
		}
	}
	if web.count(gwAllowA)+web.count(webAddr) <= before {
		t.Error("the web host saw no request after the release")
	}
	// A request the shim cannot apply is refused with its reason.
	if r := sandboxCLI("quarantine", "--release", agents[0].p.id); r.code == 0 || !strings.Contains(r.stderr, "not quarantined") {
		t.Errorf("a second release: %v", r)
	}
}

// cpuUsage is the CPU time of the processes in the cgroup at cgroupsPath
// (cgroup v1 cpuacct).
func cpuUsage(t *testing.T, cgroupsPath string) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", cgroupsPath, "cpuacct.usage"))
	if err != nil {
		t.Fatalf("cpu usage: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(n)
}

// TestRespondFreezeAndStop: freezing a sandbox stops a CPU spinner (its
// CPU time does not grow) and holds its wall clock; thawing resumes it;
// stop kills it (137) with the reason in its trail. A ctr container: every
// sandbox has a control socket, not only pods.
func TestRespondFreezeAndStop(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("freeze")
	cg := "/agentbox-e2e/" + id
	r := dev.ctr(30*time.Second, "run", "-d", "--runtime", runtimeType, "--cgroup", cg,
		agentImage, id, "sh", "-c", "while :; do :; done")
	if r.code != 0 {
		t.Fatalf("ctr run: %v", r)
	}
	defer dev.removeContainer(id)
	time.Sleep(time.Second)
	c0 := cpuUsage(t, cg)
	time.Sleep(time.Second)
	c1 := cpuUsage(t, cg)
	if c1-c0 < 300*time.Millisecond {
		t.Fatalf("the spinner used %v of CPU in a second: not spinning", c1-c0)
	}
	if r := sandboxCLI("freeze", "--reason", "e2e: look before it acts", id); r.code != 0 || !strings.Contains(r.stdout, "frozen") {
		t.Fatalf("freeze: %v", r)
	}
	var sb control.Sandbox
	for _, s := range listSandboxes(t) {
		if s.ID == id {
			sb = s
		}
	}
	if sb.State != "frozen" {
		t.Errorf("sandbox list while frozen: %+v", sb)
	}
	time.Sleep(200 * time.Millisecond)
	f0 := cpuUsage(t, cg)
	time.Sleep(2 * time.Second)
	f1 := cpuUsage(t, cg)
	if f1-f0 > 50*time.Millisecond {
		t.Errorf("frozen, the spinner still used %v of CPU in 2s", f1-f0)
	}
	t.Logf("CPU in a second: %v running; in two seconds: %v frozen", c1-c0, f1-f0)
	if r := sandboxCLI("thaw", id); r.code != 0 || !strings.Contains(r.stdout, "thawed after") {
		t.Fatalf("thaw: %v", r)
	}
	t0 := cpuUsage(t, cg)
	time.Sleep(time.Second)
	if t1 := cpuUsage(t, cg); t1-t0 < 300*time.Millisecond {
		t.Errorf("thawed, the spinner used only %v of CPU in a second", t1-t0)
	}
	if r := sandboxCLI("thaw", id); r.code == 0 || !strings.Contains(r.stderr, "not frozen") {
		t.Errorf("thawing a running sandbox: %v", r)
	}
	// containerd's task API freezes and thaws it as an admin does: the
	// sandbox's state and its trail know.
	if r := dev.ctr(30*time.Second, "task", "pause", id); r.code != 0 {
		t.Fatalf("ctr task pause: %v", r)
	}
	if sb := findSandbox(t, id); sb == nil || sb.State != "frozen" {
		t.Errorf("after ctr task pause: %+v", sb)
	}
	if r := dev.ctr(30*time.Second, "task", "resume", id); r.code != 0 {
		t.Fatalf("ctr task resume: %v", r)
	}
	if sb := findSandbox(t, id); sb == nil || sb.State != "running" {
		t.Errorf("after ctr task resume: %+v", sb)
	}
	if r := dev.ctr(30*time.Second, "task", "resume", id); r.code == 0 {
		t.Errorf("ctr task resume of a running sandbox: %v", r)
	}
	// Frozen again, then stopped: the kill reaches it.
	if r := sandboxCLI("freeze", "--reason", "again", id); r.code != 0 {
		t.Fatalf("freeze: %v", r)
	}
	if r := sandboxCLI("stop", "--reason", "e2e: enough", id); r.code != 0 || !strings.Contains(r.stdout, "stopping 1 container") {
		t.Fatalf("stop: %v", r)
	}
	eventually(t, 20*time.Second, func() bool {
		w := dev.ctr(30*time.Second, "task", "ls")
		return !strings.Contains(w.stdout, id) || !strings.Contains(w.stdout, "RUNNING")
	})
	dev.ctr(30*time.Second, "task", "delete", id)
	recs := readTrail(t, id)
	var events []string
	for _, r := range recs {
		if strings.HasPrefix(r.Event, "agentbox/") {
			events = append(events, r.Event)
		}
	}
	got := strings.Join(events, " ")
	for _, want := range []string{"agentbox/frozen agentbox/thawed agentbox/frozen agentbox/stopped agentbox/thawed", "agentbox/container_exit"} {
		if !strings.Contains(got, want) {
			t.Errorf("trail events %s lack %s", got, want)
		}
	}
	byTaskAPI := false
	for _, r := range recs {
		byTaskAPI = byTaskAPI || r.Event == "agentbox/frozen" && strings.Contains(r.Detail["requested_by"], "task API")
	}
	if !byTaskAPI {
		t.Error("no frozen record says containerd's task API asked")
	}
	if st := findRecord(recs, "agentbox/stopped"); st == nil || st.Detail["reason"] != "e2e: enough" || st.Detail["requested_by_uid"] != "0" {
		t.Errorf("stop record %+v", st)
	}
	if ex := findRecord(recs, "agentbox/container_exit"); ex == nil || ex.Detail["exit_status"] != "137" {
		t.Errorf("exit record %+v", ex)
	}
}

// TestBenchmarkQuarantineLatency reports how long a quarantine and a
// release take, from the CLI's request to its answer (the rules replaced,
// the resolver and gateway suspended), over 20 rounds on one pod: idle, and
// while the pod's other container floods its audit trail (ls in a loop).
func TestBenchmarkQuarantineLatency(t *testing.T) {
	if os.Getenv("AGENTBOX_BENCH") != "1" {
		t.Skip("AGENTBOX_BENCH=1 runs the benchmarks")
	}
	requireEnv(t)
	p := newPodIn(t, "quarantine-bench", "e2e-gw", map[string]string{"agentbox.dev/role": "e2e-gw"})
	p.containerWith(t, "c", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sleep", "600"}})
	pct := func(d []time.Duration, f float64) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(f*float64(len(s)-1))].Round(100 * time.Microsecond)
	}
	rounds := func(label string) string {
		var q, rel, shim []time.Duration
		for i := 0; i < 20; i++ {
			t0 := time.Now()
			r := sandboxCLI("quarantine", "--reason", "bench", "-o", "json", p.id)
			q = append(q, time.Since(t0))
			var resp control.Response
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &resp) != nil {
				t.Fatalf("quarantine: %v", r)
			}
			shim = append(shim, time.Duration(resp.Micros)*time.Microsecond)
			t0 = time.Now()
			if r := sandboxCLI("quarantine", "--release", p.id); r.code != 0 {
				t.Fatalf("release: %v", r)
			}
			rel = append(rel, time.Since(t0))
		}
		return fmt.Sprintf("quarantine latency, %s (20 runs; agentbox sandbox quarantine, CLI start to answer): p50 %v p99 %v (in the shim p50 %v p99 %v); release p50 %v p99 %v\n",
			label, pct(q, 0.5), pct(q, 0.99), pct(shim, 0.5), pct(shim, 0.99), pct(rel, 0.5), pct(rel, 0.99))
	}
	report := rounds("idle pod")
	p.containerWith(t, "storm", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"sh", "-c", "while :; do ls -la /bin /usr/bin >/dev/null; done"}})
	time.Sleep(2 * time.Second)
	report += rounds("the pod flooding its audit trail")
	fmt.Print(report)
	benchOut(t, report)
}
