//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/cgroups"
)

// gatewayFigures are one pod's abx-fetch latencies, each request on a new
// connection: HTTP (through the gateway's forwarding) and HTTPS.
type gatewayFigures struct {
	httpP50, httpP90, tlsP50, tlsP90 float64 // ms
}

var fetchLine = regexp.MustCompile(`== (\w+): n=\d+ p50=([\d.]+)ms p90=([\d.]+)ms p99=[\d.]+ms bytes=(\d+) secs=([\d.]+)`)

// TestBenchmarkGateway compares egress by name through the gateway with
// the address allowlist it replaces (a CIDR rule for the same web host),
// from inside gVisor, in one run: per-request latency over HTTP and HTTPS
// (passthrough and inspected), pods interleaved; and the throughput of
// 64 MiB HTTPS downloads, by address, inspected and passthrough, taken in
// turns in one pod.
func TestBenchmarkGateway(t *testing.T) {
	requireBench(t)
	n := benchRounds("AGENTBOX_BENCH_GATEWAY_REQUESTS", 200)
	// connect: the address the client dials instead of looking the name
	// up ("" looks it up: the pod's hosts file names the gateway).
	measure := func(role string, connect string) gatewayFigures {
		t.Helper()
		// e2e-gw-inspect allows a.gw.e2e.test under /ok/ only (inspected).
		prefix := ""
		if role == "e2e-gw-inspect" {
			prefix = "/ok"
		}
		via := func(port int) string {
			if connect != "" {
				return fmt.Sprintf("-connect %s:%d ", connect, port)
			}
			return ""
		}
		p := newPodIn(t, "bench-"+role, role, map[string]string{"agentbox.dev/role": role})
		script := strings.Join([]string{
			gwStep("http", fmt.Sprintf("abx-fetch %s-n %d http://%s%s/small", via(80), n, gwAllowA, prefix)),
			gwStep("tls", fmt.Sprintf("abx-fetch %s-n %d https://%s%s/small", via(443), n, gwAllowA, prefix)),
			"echo probes-done", "sleep 600",
		}, "; ")
		logs := p.runProbes(t, script)
		p.remove()
		var f gatewayFigures
		got := 0
		for _, m := range fetchLine.FindAllStringSubmatch(logs.stdout, -1) {
			p50, _ := strconv.ParseFloat(m[2], 64)
			p90, _ := strconv.ParseFloat(m[3], 64)
			switch m[1] {
			case "http":
				f.httpP50, f.httpP90 = p50, p90
			case "tls":
				f.tlsP50, f.tlsP90 = p50, p90
			}
			got++
		}
		if got != 2 {
			t.Fatalf("%s: figures missing:\n%s\n%s", role, logs.stdout, logs.stderr)
		}
		return f
	}
	var gw, addr, insp, nolookup []gatewayFigures
	for round := 0; round < 2; round++ {
		addr = append(addr, measure("e2e-gw-cidr", webAddr))
		gw = append(gw, measure("e2e-gw", ""))
		insp = append(insp, measure("e2e-gw-inspect", ""))
		// The gateway without the client's lookup: what the gateway itself
		// adds, apart from the name the client resolves.
		nolookup = append(nolookup, measure("e2e-gw", gwAddress))
	}
	mean := func(fs []gatewayFigures, get func(gatewayFigures) float64) float64 {
		var s float64
		for _, f := range fs {
			s += get(f)
		}
		return s / float64(len(fs))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "egress gateway vs address allowlist (same web host, from inside gVisor; %d requests each, new connection each, 2 interleaved rounds):\n", n)
	for _, m := range []struct {
		name string
		from []gatewayFigures
		get  func(gatewayFigures) float64
	}{
		{"HTTP p50 (forwarded)", gw, func(f gatewayFigures) float64 { return f.httpP50 }},
		{"HTTP p90", gw, func(f gatewayFigures) float64 { return f.httpP90 }},
		{"HTTPS p50 (passthrough)", gw, func(f gatewayFigures) float64 { return f.tlsP50 }},
		{"HTTPS p90", gw, func(f gatewayFigures) float64 { return f.tlsP90 }},
		{"HTTPS p50 (inspected)", insp, func(f gatewayFigures) float64 { return f.tlsP50 }},
		{"HTTPS p90 (inspected)", insp, func(f gatewayFigures) float64 { return f.tlsP90 }},
		{"HTTP p50, no lookup", nolookup, func(f gatewayFigures) float64 { return f.httpP50 }},
		{"HTTPS p50, no lookup", nolookup, func(f gatewayFigures) float64 { return f.tlsP50 }},
	} {
		g, a := mean(m.from, m.get), mean(addr, m.get)
		fmt.Fprintf(&b, "  %-24s gateway %7.2f ms  address %7.2f ms  (%+.2f ms)\n", m.name, g, a, g-a)
	}
	b.WriteString(gatewayThroughput(t, benchRounds("AGENTBOX_BENCH_GATEWAY_DOWNLOADS", 8)))
	b.WriteString(gatewayCPU(t, benchRounds("AGENTBOX_BENCH_GATEWAY_CPU_DOWNLOADS", 6)))
	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

// downloadSize is one benchmark download: 64 MiB over HTTPS.
const downloadSize = 64 << 20

// downloadWays are the benchmark's ways to the same web host: by address
// (a CIDR rule), inspected (a.gw.e2e.test: the gateway decrypts and
// encrypts again), inspected and scanned (b.gw.e2e.test: a secret is
// injected, so the response is scanned for it) and passthrough
// (other.gw.e2e.test: spliced).
var downloadWays = []struct{ name, cmd string }{
	{"addr", fmt.Sprintf("abx-fetch -connect %s:443 -n 1 https://%s/bytes/%d", webAddr, gwAllowA, downloadSize)},
	{"inspected", fmt.Sprintf("abx-fetch -n 1 https://%s/bytes/%d", gwAllowA, downloadSize)},
	{"scanned", fmt.Sprintf("abx-fetch -n 1 https://%s/bytes/%d", gwAllowB, downloadSize)},
	{"passthrough", fmt.Sprintf("abx-fetch -n 1 https://%s/bytes/%d", gwOther, downloadSize)},
}

// gatewayThroughput downloads 64 MiB over HTTPS rounds times each way from
// one pod under e2e-gw-bench: by address (its CIDR rule), through the
// gateway inspected (a.gw.e2e.test: the gateway decrypts and encrypts
// again), inspected and scanned (b.gw.e2e.test: a secret is injected, so
// the response is scanned for it as it streams) and passthrough
// (other.gw.e2e.test: spliced), in turns, the order rotated each round. Each round's downloads share the pod, the moment and
// the machine's state, so the ratios are taken per round (their median is
// reported). The pod's shim runs the gateway: its CPU over the pod's life,
// per MiB the gateway carried, is what the gateway costs the node.
func gatewayThroughput(t *testing.T, rounds int) string {
	t.Helper()
	ways := downloadWays
	var steps []string
	for r := 0; r < rounds; r++ {
		for i := range ways {
			w := ways[(r+i)%len(ways)]
			steps = append(steps, gwStep(fmt.Sprintf("%s%d", w.name, r), w.cmd))
		}
	}
	p := newPodIn(t, "bench-gw-bulk", "e2e-gw-bench", map[string]string{"agentbox.dev/role": "e2e-gw-bench"})
	shim := shimPID(p.id)
	if shim == 0 {
		t.Fatalf("no shim serving %s", p.id)
	}
	before, _ := processCPU(shim)
	logs := p.runProbes(t, strings.Join(append(steps, "echo probes-done", "sleep 600"), "; "))
	after, _ := processCPU(shim)
	shimCPU := after - before
	p.remove()
	mbps := map[string]float64{}
	for _, m := range fetchLine.FindAllStringSubmatch(logs.stdout, -1) {
		bytes, _ := strconv.ParseFloat(m[4], 64)
		secs, _ := strconv.ParseFloat(m[5], 64)
		if bytes != downloadSize || secs <= 0 {
			t.Fatalf("download %s: %s bytes in %s s", m[1], m[4], m[5])
		}
		mbps[m[1]] = bytes / secs / 1e6
	}
	if len(mbps) != rounds*len(ways) {
		t.Fatalf("downloads missing: %d of %d:\n%s\n%s", len(mbps), rounds*len(ways), logs.stdout, logs.stderr)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  64 MiB HTTPS downloads from one pod, by address / inspected / inspected and scanned for a secret / passthrough in turns, %d rounds:\n", rounds)
	for _, w := range ways[1:] {
		var ratios []float64
		var g, a float64
		for r := 0; r < rounds; r++ {
			gr, ar := mbps[fmt.Sprintf("%s%d", w.name, r)], mbps[fmt.Sprintf("addr%d", r)]
			ratios = append(ratios, gr/ar)
			g, a = g+gr/float64(rounds), a+ar/float64(rounds)
		}
		sort.Float64s(ratios)
		fmt.Fprintf(&b, "  %-24s gateway %7.1f MB/s address %7.1f MB/s (%.2fx; per round median %.2fx, min %.2fx, max %.2fx)\n",
			"HTTPS "+w.name, g, a, g/a, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	}
	through := float64((len(ways)-1)*rounds*downloadSize) / (1 << 20)
	fmt.Fprintf(&b, "  %-24s %.2f ms per MiB through the gateway (%.2f s over the pod, %.0f MiB)\n", "shim CPU", float64(shimCPU.Microseconds())/1e3/through, shimCPU.Seconds(), through)
	return b.String()
}

// TestBenchmarkGatewayMemory reports what an idle pod costs with the
// gateway: pods under e2e-gw-inspect (resolver, gateway with inspected
// rules and an injected secret, the sandbox's CA) against baseline pods,
// 20 of each as TestBenchmarkPodMemory counts (a PSS shares the binaries'
// pages among the pods running: fewer pods, more each).
// The gateway lives in the shim, so the shim's share is what grows.
// AGENTBOX_BENCH=1 only.
func TestBenchmarkGatewayMemory(t *testing.T) {
	requireBench(t)
	gw := criVariant{"agentbox-gateway", "agentbox", "e2e-gw-inspect", map[string]string{"agentbox.dev/role": "e2e-gw-inspect"}}
	// The allowlist role without host rules has the resolver and the pod's
	// network stack but no gateway: the difference to it is the gateway's.
	none := idleCPU(t)
	report := podMemory(t, 20, gw, none) + podMemory(t, 20, criVariants[1], none) + podMemory(t, 20, criVariants[0], none)
	t.Log("\n" + report)
	benchOut(t, report)
}

// gatewayCPU says where a download's CPU goes, each way in a pod of its
// own: the sandbox's cgroup (held to its role's CPU limit, 1 CPU under
// baseline: what a download's speed comes to once the sandbox is the
// slowest part) and the shim (the gateway, outside that limit), per MiB.
func gatewayCPU(t *testing.T, downloads int) string {
	t.Helper()
	type use struct{ sandbox, shim float64 }
	got := map[string]use{}
	mib := float64(downloads*downloadSize) / (1 << 20)
	for _, w := range downloadWays {
		var steps []string
		for i := 0; i < downloads; i++ {
			steps = append(steps, gwStep(fmt.Sprintf("%s%d", w.name, i), w.cmd))
		}
		p := newPodIn(t, "bench-gw-cpu-"+w.name, "e2e-gw-bench", map[string]string{"agentbox.dev/role": "e2e-gw-bench"})
		shim, cg := shimPID(p.id), sandboxCgroup(p.id)
		if shim == 0 || cg == "" {
			t.Fatalf("pod %s: shim %d, sandbox cgroup %q", p.id, shim, cg)
		}
		u0, ok0 := cgroups.ReadUsage(cgroups.Root, cg)
		s0, _ := processCPU(shim)
		logs := p.runProbes(t, strings.Join(append(steps, "echo probes-done", "sleep 600"), "; "))
		u1, ok1 := cgroups.ReadUsage(cgroups.Root, cg)
		s1, _ := processCPU(shim)
		p.remove()
		// ReadUsage is ok with either memory or CPU read: the CPU must
		// have been, and grown.
		if n := len(fetchLine.FindAllString(logs.stdout, -1)); n != downloads || !ok0 || !ok1 || u1.CPU <= u0.CPU {
			t.Fatalf("%s: %d of %d downloads, cgroup %s read %v %v, CPU %v to %v:\n%s", w.name, n, downloads, cg, ok0, ok1, u0.CPU, u1.CPU, logs.stdout)
		}
		got[w.name] = use{msPerMiB(u1.CPU-u0.CPU, mib), msPerMiB(s1-s0, mib)}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  CPU per MiB downloaded, each way in a pod of its own (%d downloads): the sandbox (its role's limit: 1 CPU); the gateway (the shim, outside it):\n", downloads)
	a := got["addr"]
	fmt.Fprintf(&b, "  %-24s sandbox %5.2f ms  shim %5.2f ms\n", "by address", a.sandbox, a.shim)
	for _, w := range downloadWays[1:] {
		g := got[w.name]
		fmt.Fprintf(&b, "  %-24s sandbox %5.2f ms  shim %5.2f ms  (sandbox %.2fx the address's)\n", w.name, g.sandbox, g.shim, g.sandbox/a.sandbox)
	}
	return b.String()
}

func msPerMiB(d time.Duration, mib float64) float64 { return float64(d.Microseconds()) / 1e3 / mib }

// sandboxCgroup is the cgroup path (cgroupfs form) of pod id's sandbox
// process: its cpuacct hierarchy on cgroup v1, the unified one on v2.
func sandboxCgroup(id string) string {
	for _, pid := range pidsNaming(id) {
		if strings.Contains(cmdline(pid), "runsc-sandbox") {
			return procCgroup(pid, "cpuacct")
		}
	}
	return ""
}

// procCgroup is the cgroup path of process pid in controller's v1
// hierarchy, or its unified (v2) path where no v1 hierarchy has that
// controller; "" when pid has neither.
func procCgroup(pid int, controller string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	var unified string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if strings.Contains(","+f[1]+",", ","+controller+",") {
			return f[2]
		}
		if f[0] == "0" && f[1] == "" {
			unified = f[2]
		}
	}
	return unified
}
