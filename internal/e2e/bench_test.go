//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/shim"
)

// runtimeUnderTest is one way of running a container with ctr.
type runtimeUnderTest struct {
	name string
	args func(d *daemon) []string
}

var benchRuntimes = []runtimeUnderTest{
	{"agentbox", func(d *daemon) []string { return []string{"--runtime", runtimeType} }},
	// gVisor's own task service (see hack/stock-gvisor-shim), given the CRI
	// annotation without which it hangs in Create.
	{"gvisor-stock", func(d *daemon) []string {
		return []string{"--runtime", "io.containerd.runsc.v1",
			"--runtime-config-path", filepath.Join(d.dir, "runsc-stock", "config.toml"),
			"--annotation", "io.kubernetes.cri.container-type=sandbox"}
	}},
	{"runc", func(d *daemon) []string { return []string{"--runtime", "io.containerd.runc.v2"} }},
}

// TestBenchmarkStartToExit measures start-to-exit latency of `ctr run --rm
// IMAGE ID /bin/true` for agentbox, the stock gVisor shim and runc,
// interleaved round by round so drift hits all three alike, and reports
// medians and ratios. It runs only with AGENTBOX_BENCH=1 (hack/bench.sh);
// it asserts no timing, only that every run succeeded.
func TestBenchmarkStartToExit(t *testing.T) {
	requireBench(t)
	rounds := benchRounds("AGENTBOX_BENCH_ROUNDS", 30)
	samples := map[string][]time.Duration{}
	// One warm-up run each: page cache, first shim exec.
	for _, rt := range benchRuntimes {
		benchRun(t, rt, "warm")
	}
	for i := 0; i < rounds; i++ {
		order := benchRuntimes
		if i%2 == 1 { // alternate the order to cancel position effects
			order = []runtimeUnderTest{benchRuntimes[2], benchRuntimes[1], benchRuntimes[0]}
		}
		for _, rt := range order {
			samples[rt.name] = append(samples[rt.name], benchRun(t, rt, strconv.Itoa(i)))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "start-to-exit latency of `ctr run --rm IMAGE ID /bin/true`, %d interleaved rounds\n", rounds)
	fmt.Fprintf(&b, "%-14s %10s %10s %10s %10s\n", "runtime", "median", "mean", "p90", "min")
	for _, rt := range benchRuntimes {
		s := stats(samples[rt.name])
		fmt.Fprintf(&b, "%-14s %10s %10s %10s %10s\n", rt.name, ms(s.median), ms(s.mean), ms(s.p90), ms(s.min))
	}
	med := func(n string) float64 { return float64(stats(samples[n]).median) }
	fmt.Fprintf(&b, "ratio agentbox/gvisor-stock (median): %.3fx  (goal <= 1.05x)\n", med("agentbox")/med("gvisor-stock"))
	fmt.Fprintf(&b, "ratio agentbox/runc         (median): %.3fx\n", med("agentbox")/med("runc"))
	fmt.Fprintf(&b, "ratio gvisor-stock/runc     (median): %.3fx\n", med("gvisor-stock")/med("runc"))
	b.WriteString(phaseTable(t, "bench-agentbox-"))
	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

func benchRun(t *testing.T, rt runtimeUnderTest, round string) time.Duration {
	t.Helper()
	id := uniqueID("bench-" + rt.name + "-" + round)
	args := append([]string{"run", "--rm"}, rt.args(dev)...)
	args = append(args, agentImage, id, "/bin/true")
	start := time.Now()
	r := dev.ctr(60*time.Second, args...)
	d := time.Since(start)
	// The stock shim loses the exit status of short-lived containers (128);
	// the benchmark measures time, so only a hang or a failed start counts.
	if r.timedOut || (r.code != 0 && !(rt.name == "gvisor-stock" && r.code == 128)) {
		t.Fatalf("%s: %v", rt.name, r)
	}
	return d
}

type summary struct{ median, mean, p90, min time.Duration }

func stats(s []time.Duration) summary {
	c := append([]time.Duration(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	var sum time.Duration
	for _, d := range c {
		sum += d
	}
	return summary{median: c[len(c)/2], mean: sum / time.Duration(len(c)), p90: percentile(c, .9), min: c[0]}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// auditWorkloads are file-heavy loops: the find/stat loop the goal is set
// for, and a mixed one whose `ls -la` opens /etc/localtime once per file
// listed (static glibc), an event storm.
var auditWorkloads = []struct{ name, script string }{
	{"find-stat", `i=0; while [ $i -lt 60 ]; do find / -xdev >/dev/null 2>&1; find /bin /etc -name 'p*' -exec stat {} + >/dev/null; i=$((i+1)); done`},
	// mutate: the file operations agentbox's runsc patch adds points for.
	{"mutate", `i=0; while [ $i -lt 200 ]; do mkdir -p /tmp/w/d; echo x > /tmp/w/d/f; mv /tmp/w/d/f /tmp/w/d/g; ln -s g /tmp/w/d/l; chmod 600 /tmp/w/d/g; rm -rf /tmp/w; i=$((i+1)); done`},
	{"mixed", `i=0; while [ $i -lt 100 ]; do find /bin /etc -name 'p*' >/dev/null; stat /etc/passwd /bin/sh >/dev/null; cat /etc/passwd /etc/group >/dev/null; ls -la /bin >/dev/null; i=$((i+1)); done`},
}

// TestBenchmarkAuditOverhead runs each workload under baseline (auditing
// process, file and network events) and under a role that audits none of
// them, interleaved, and reports the ratio of medians. It checks that the
// audited runs dropped no event. AGENTBOX_BENCH=1 only (hack/bench.sh).
func TestBenchmarkAuditOverhead(t *testing.T) {
	requireBench(t)
	rounds := benchRounds("AGENTBOX_BENCH_AUDIT_ROUNDS", 7)
	shimPeak := map[string]uint64{}
	var b strings.Builder
	fmt.Fprintf(&b, "audit overhead, %d interleaved rounds per workload (on: baseline audits process, file, network; off: no event points)\n", rounds)
	only := os.Getenv("AGENTBOX_BENCH_AUDIT_WORKLOADS") // e.g. "mixed" or "find-stat,mixed"
	for _, w := range auditWorkloads {
		if only != "" && !slices.Contains(strings.Split(only, ","), w.name) {
			continue
		}
		samples := map[string][]time.Duration{}
		shimCPU := map[string][]time.Duration{}
		var events, written, dropped, lost int
		for i := 0; i < rounds; i++ {
			for _, role := range []string{"baseline", "e2e-audit-off"} {
				id := uniqueID("auditbench-" + w.name)
				stop := make(chan struct{})
				usage := make(chan shimUsage)
				go func() { usage <- shimSample(id, stop) }()
				start := time.Now()
				r := dev.runAgent(t, id, []string{"--annotation", "agentbox.dev/role=" + role}, "sh", "-c", w.script)
				samples[role] = append(samples[role], time.Since(start))
				close(stop)
				u := <-usage
				if role == "baseline" && u.peakKiB > shimPeak[w.name] {
					shimPeak[w.name] = u.peakKiB
				}
				shimCPU[role] = append(shimCPU[role], u.cpu)
				t.Logf("%s/%s: %s, shim CPU %s, peak RSS %d KiB", w.name, role, ms(samples[role][len(samples[role])-1]), ms(u.cpu), u.peakKiB)
				if r.code != 0 {
					t.Fatalf("%s/%s: %v", w.name, role, r)
				}
				if role == "baseline" {
					recs := readTrail(t, id)
					end := recs[len(recs)-1]
					events += end.Counts["received"]
					written += end.Counts["written"]
					dropped += end.Counts["sentry_dropped"]
					lost += end.Counts["lost"]
				}
			}
		}
		on, off := stats(samples["baseline"]).median, stats(samples["e2e-audit-off"]).median
		fmt.Fprintf(&b, "%-10s on %9s  off %9s  ratio %.3fx  (%d events/run, %d dropped, %d lost; shim peak RSS %.1f MiB)\n",
			w.name, ms(on), ms(off), float64(on)/float64(off), events/rounds, dropped, lost, float64(shimPeak[w.name])/1024)
		// The shim's CPU for auditing: its CPU time on minus off (both
		// start, serve and end a container), per event received.
		cpuOn, cpuOff := stats(shimCPU["baseline"]).median, stats(shimCPU["e2e-audit-off"]).median
		if events > 0 {
			fmt.Fprintf(&b, "%-10s shim CPU per run: on %s, off %s; %.1fµs per event\n", "", ms(cpuOn), ms(cpuOff),
				float64(cpuOn-cpuOff)/float64(time.Microsecond)/float64(events/rounds))
		}
		if dropped != 0 || lost != 0 {
			t.Errorf("%s: events were dropped (%d) or lost (%d) at default settings", w.name, dropped, lost)
		}
	}
	fmt.Fprintf(&b, "goal: both ratios <= 1.15x with zero dropped events\n")
	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

// TestBenchmarkEgress compares an allowlist role (nftables default deny
// with one allowed address) with open egress: per-connection cycle time
// (nc spawn, connect, close; measured between the server's accepts) and bulk
// throughput (bytes from first to last at the sink), interleaved; and a name
// lookup through the pod's resolver (a role with host rules) against one
// straight to the DNS server. Host rules' traffic goes through the egress
// gateway, which decides TLS and HTTP only (no raw nc): TestBenchmarkGateway
// measures it. AGENTBOX_BENCH=1 only (hack/bench.sh).
func TestBenchmarkEgress(t *testing.T) {
	requireBench(t)
	const conns, mib, lookups = 40, 256, 40
	// A CIDR rule, host rules (lookups only), and open egress; the same
	// servers.
	roles := []struct{ role, ns, host string }{{"e2e-allow", "e2e-allow", egress.gateway}, {"e2e-dns", "e2e-dns", ""}, {"e2e-open", "e2e-net", egress.gateway}}
	cycle := map[string][]time.Duration{}
	tput := map[string][]float64{}
	lookup := map[string][]time.Duration{}
	const rounds = 5
	for round := 0; round < rounds; round++ {
		for _, r := range roles {
			p := newPodIn(t, "bench", r.ns, map[string]string{"agentbox.dev/role": r.role})
			start, sinkRuns := len(egress.allowed.snapshot()), egress.sink.count()
			// Lookups: through the pod's resolver (allowlist) or straight to
			// the test DNS server (open).
			server := ""
			if r.role == "e2e-open" {
				server = egress.other
			}
			script := fmt.Sprintf(`time -p sh -c 'i=0; while [ $i -lt %d ]; do nslookup %s %s >/dev/null || echo lookup-failed; i=$((i+1)); done' 2>&1 | sed -n 's/^real /lookups /p'; `,
				lookups, dnsAllowed, server)
			if r.host != "" {
				script += fmt.Sprintf(`i=0; while [ $i -lt %d ]; do nc -w 2 %s %d </dev/null >/dev/null; i=$((i+1)); done; `+
					`dd if=/dev/zero bs=64k count=%d 2>/dev/null | nc -w 5 %s %d; `,
					conns, r.host, egress.allowed.port, mib*16, r.host, egress.sink.port)
			}
			script += "echo bench-done; sleep 600"
			id := p.container(t, "c", "sh", "-c", script)
			logs := waitLogs(t, id, "bench-done")
			var secs float64
			at := strings.Index(logs.stdout, "lookups ")
			if at < 0 || strings.Contains(logs.stdout, "lookup-failed") {
				t.Fatalf("%s: lookups:\n%s", r.role, logs.stdout)
			}
			if _, err := fmt.Sscanf(logs.stdout[at:], "lookups %f", &secs); err != nil {
				t.Fatalf("%s: lookups: %v\n%s", r.role, err, logs.stdout)
			}
			lookup[r.role] = append(lookup[r.role], time.Duration(secs*float64(time.Second))/lookups)
			if r.host == "" {
				p.remove()
				continue
			}
			acc := egress.allowed.snapshot()[start:]
			if len(acc) != conns {
				t.Fatalf("%s: %d of %d connections accepted", r.role, len(acc), conns)
			}
			cycle[r.role] = append(cycle[r.role], acc[len(acc)-1].Sub(acc[0])/time.Duration(conns-1))
			run := egress.sink.run(sinkRuns)
			if run.bytes != mib<<20 {
				t.Fatalf("%s: sink got %d bytes, want %d", r.role, run.bytes, mib<<20)
			}
			tput[r.role] = append(tput[r.role], float64(run.bytes)/(1<<20)/run.took.Seconds())
			p.remove()
		}
	}
	med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	cy := func(role string) time.Duration { return stats(cycle[role]).median }
	var b strings.Builder
	fmt.Fprintf(&b, "egress: allowlist by CIDR and open; lookups under host rules; %d interleaved rounds\n", rounds)
	fmt.Fprintf(&b, "connection cycle (nc, connect, close): cidr %s, open %s; ratio to open %.3fx\n",
		ms(cy("e2e-allow")), ms(cy("e2e-open")), float64(cy("e2e-allow"))/float64(cy("e2e-open")))
	a, o := med(tput["e2e-allow"]), med(tput["e2e-open"])
	fmt.Fprintf(&b, "bulk throughput (%d MiB): cidr %.0f MiB/s, open %.0f MiB/s; ratio to open %.3fx  (goal >= 0.95x)\n", mib, a, o, a/o)
	fmt.Fprintf(&b, "  per round, MiB/s: cidr %.0f, open %.0f\n", tput["e2e-allow"], tput["e2e-open"])
	lk := func(role string) time.Duration { return stats(lookup[role]).median }
	fmt.Fprintf(&b, "name lookup (busybox nslookup, A+AAAA): through the pod's resolver %s, straight to the DNS server (open) %s, ratio %.2fx\n",
		ms(lk("e2e-dns")), ms(lk("e2e-open")), float64(lk("e2e-dns"))/float64(lk("e2e-open")))
	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

// phaseTable reads the shims' phase trace (shim.PhaseTraceEnv) for the
// containers whose id starts with prefix and prints each phase's median, in
// the order the shim runs them: where agentbox's Create and Start spend
// their time.
func phaseTable(t *testing.T, prefix string) string {
	t.Helper()
	data, err := os.ReadFile(os.Getenv(shim.PhaseTraceEnv))
	if err != nil {
		return fmt.Sprintf("no phase trace: %v\n", err)
	}
	samples := map[string][]time.Duration{}
	var order []string
	add := func(key string, ms float64) {
		if _, ok := samples[key]; !ok {
			order = append(order, key)
		}
		samples[key] = append(samples[key], time.Duration(ms*float64(time.Millisecond)))
	}
	for _, raw := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var l shim.PhaseTrace
		if json.Unmarshal([]byte(raw), &l) != nil || !strings.HasPrefix(l.ID, prefix) || strings.Contains(l.ID, "warm") {
			continue
		}
		for _, p := range l.Phases {
			add(l.Op+" "+p.Name, p.MS)
		}
		add(l.Op+" total", l.TotalMS)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "agentbox shim phases (median over %d runs; runsc_* are gVisor's own work, the rest agentbox's):\n", len(samples["create total"]))
	for _, k := range order {
		fmt.Fprintf(&b, "  %-28s %9s\n", k, ms(stats(samples[k]).median))
	}
	return b.String()
}

// shimUsage is what shimSample saw of one shim: its peak resident set
// (KiB) and the CPU time it had used when last seen.
type shimUsage struct {
	peakKiB uint64
	cpu     time.Duration
}

// shimPID is the shim serving the sandbox or container id (0 if none is
// running): not the short-lived `... start` process that spawns it.
func shimPID(id string) int {
	for _, pid := range pidsNaming(id) {
		if c := strings.TrimSpace(cmdline(pid)); strings.Contains(c, "containerd-shim-agentbox-v1") && !strings.HasSuffix(c, " start") {
			return pid
		}
	}
	return 0
}

// shimSample samples the shim serving container id every 50ms until stop.
// It looks for the shim among all processes only until it has found it:
// reading every process's command line takes each one's memory-map lock,
// the sandbox's too, and doing that every 50ms slowed the audited runs it
// measured (mixed 1.41x with it, 1.20x without, same binaries).
func shimSample(id string, stop <-chan struct{}) shimUsage {
	var u shimUsage
	shim := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if shim == 0 {
			shim = shimPID(id)
		}
		if shim != 0 {
			if kb := smapsRollup(shim, "Rss:"); kb > u.peakKiB {
				u.peakKiB = kb
			}
			if cpu, ok := processCPU(shim); ok {
				u.cpu = cpu
			}
		}
		select {
		case <-stop:
			return u
		case <-tick.C:
		}
	}
}

// processCPU is the user and system time pid has used (clock ticks of
// 10ms).
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; count from after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, true
}

// benchOut appends a benchmark's report to AGENTBOX_BENCH_OUT (hack/bench.sh
// empties it first), so that one run's figures are in one file.
func benchOut(t *testing.T, report string) {
	t.Helper()
	out := os.Getenv("AGENTBOX_BENCH_OUT")
	if out == "" {
		return
	}
	f, err := os.OpenFile(out, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(report + "\n"); err != nil {
		t.Error(err)
	}
}

// requireBench skips a benchmark unless AGENTBOX_BENCH=1 (hack/bench.sh):
// they take minutes and assert no timing.
// benchRounds is a benchmark's number of rounds: env's value when it is a
// positive number, else def.
func benchRounds(env string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(env)); err == nil && v > 0 {
		return v
	}
	return def
}

func requireBench(t *testing.T) {
	t.Helper()
	requireEnv(t)
	if os.Getenv("AGENTBOX_BENCH") != "1" {
		t.Skip("benchmark: set AGENTBOX_BENCH=1 (hack/bench.sh)")
	}
}
