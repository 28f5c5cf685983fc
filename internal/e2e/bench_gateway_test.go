//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gatewayFigures are one pod's abx-fetch results: latency of requests
// each on a new connection (HTTP through the gateway's forwarding, HTTPS
// spliced), and a download's throughput.
type gatewayFigures struct {
	httpP50, httpP90, tlsP50, tlsP90 float64 // ms
	mbps                             float64
}

var fetchLine = regexp.MustCompile(`== (\w+): n=\d+ p50=([\d.]+)ms p90=([\d.]+)ms p99=[\d.]+ms bytes=(\d+) secs=([\d.]+)`)

// TestBenchmarkGateway compares egress by name through the gateway with
// the address allowlist it replaces (a CIDR rule for the same web host),
// from inside gVisor, interleaved in one run: per-request latency over HTTP
// and HTTPS (passthrough), and a 64 MiB HTTPS download.
func TestBenchmarkGateway(t *testing.T) {
	requireBench(t)
	n := benchRounds("AGENTBOX_BENCH_GATEWAY_REQUESTS", 200)
	const size = 64 << 20
	// connect: the address the client dials instead of looking the name
	// up ("" looks it up at the pod's resolver).
	measure := func(role string, connect string) gatewayFigures {
		t.Helper()
		// e2e-gw-inspect allows a.gw.e2e.test under /ok/ only (inspected).
		prefix := ""
		if role == "e2e-gw-inspect" {
			prefix = "/ok"
		}
		t.Helper()
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
			gwStep("bulk", fmt.Sprintf("abx-fetch %s-n 3 https://%s%s/bytes/%d", via(443), gwAllowA, prefix, size)),
			"echo probes-done", "sleep 600",
		}, "; ")
		logs := p.runProbes(t, script)
		dev.crictl(60*time.Second, "stopp", p.id)
		dev.crictl(60*time.Second, "rmp", p.id)
		p.released = true
		var f gatewayFigures
		got := 0
		for _, m := range fetchLine.FindAllStringSubmatch(logs.stdout, -1) {
			p50, _ := strconv.ParseFloat(m[2], 64)
			p90, _ := strconv.ParseFloat(m[3], 64)
			bytes, _ := strconv.ParseFloat(m[4], 64)
			secs, _ := strconv.ParseFloat(m[5], 64)
			switch m[1] {
			case "http":
				f.httpP50, f.httpP90 = p50, p90
			case "tls":
				f.tlsP50, f.tlsP90 = p50, p90
			case "bulk":
				f.mbps = bytes / secs / 1e6
			}
			got++
		}
		if got != 3 {
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
		get  func(gatewayFigures) float64
	}{
		{"HTTP p50 (forwarded)", func(f gatewayFigures) float64 { return f.httpP50 }},
		{"HTTP p90", func(f gatewayFigures) float64 { return f.httpP90 }},
		{"HTTPS p50 (passthrough)", func(f gatewayFigures) float64 { return f.tlsP50 }},
		{"HTTPS p90", func(f gatewayFigures) float64 { return f.tlsP90 }},
	} {
		g, a := mean(gw, m.get), mean(addr, m.get)
		fmt.Fprintf(&b, "  %-24s gateway %7.2f ms  address %7.2f ms  (%+.2f ms)\n", m.name, g, a, g-a)
	}
	for _, m := range []struct {
		name string
		from []gatewayFigures
		get  func(gatewayFigures) float64
	}{
		{"HTTPS p50 (inspected)", insp, func(f gatewayFigures) float64 { return f.tlsP50 }},
		{"HTTPS p90 (inspected)", insp, func(f gatewayFigures) float64 { return f.tlsP90 }},
		{"HTTP p50, no lookup", nolookup, func(f gatewayFigures) float64 { return f.httpP50 }},
		{"HTTPS p50, no lookup", nolookup, func(f gatewayFigures) float64 { return f.tlsP50 }},
	} {
		g, a := mean(m.from, m.get), mean(addr, m.get)
		fmt.Fprintf(&b, "  %-24s gateway %7.2f ms  address %7.2f ms  (%+.2f ms)\n", m.name, g, a, g-a)
	}
	g, a := mean(gw, func(f gatewayFigures) float64 { return f.mbps }), mean(addr, func(f gatewayFigures) float64 { return f.mbps })
	fmt.Fprintf(&b, "  %-24s gateway %7.1f MB/s address %7.1f MB/s (%.2fx)\n", "HTTPS 64 MiB download", g, a, g/a)
	gi := mean(insp, func(f gatewayFigures) float64 { return f.mbps })
	fmt.Fprintf(&b, "  %-24s gateway %7.1f MB/s address %7.1f MB/s (%.2fx)\n", "  inspected", gi, a, gi/a)
	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

// TestBenchmarkGatewayMemory reports what an idle pod costs with the
// gateway: pods under e2e-gw-inspect (resolver, gateway with inspected
// rules and an injected secret, the sandbox's CA) against baseline pods.
// The gateway lives in the shim, so the shim's share is what grows.
// AGENTBOX_BENCH=1 only.
func TestBenchmarkGatewayMemory(t *testing.T) {
	requireBench(t)
	gw := criVariant{"agentbox-gateway", "agentbox", "e2e-gw-inspect", map[string]string{"agentbox.dev/role": "e2e-gw-inspect"}}
	// The allowlist role without host rules has the resolver and the pod's
	// network stack but no gateway: the difference to it is the gateway's.
	report := podMemory(t, 10, gw) + podMemory(t, 10, criVariants[1]) + podMemory(t, 10, criVariants[0])
	t.Log("\n" + report)
	benchOut(t, report)
}
