//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// benchModelPy streams Messages calls from inside gVisor, alternating the
// model host rule (inspected, key injected) and the passthrough one, and
// prints one JSON line per call: time to first byte, each event's delay
// from the server's send (same clock: gVisor's is the host's), and a bulk
// stream's throughput.
const benchModelPy = `
import json, os, ssl, sys, time, urllib.request
ctx = ssl.create_default_context(cafile="/tmp/bundle.pem")
hosts = {"model-host": ("api.anthropic.com", os.environ["ANTHROPIC_API_KEY"]), "passthrough": ("models.gw.e2e.test", "pass-key")}
def call(which, model):
    host, key = hosts[which]
    body = json.dumps({"model": model, "stream": True, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}).encode()
    req = urllib.request.Request("https://%s/v1/messages" % host, data=body, headers={"x-api-key": key, "content-type": "application/json"})
    t0 = time.perf_counter_ns()
    ttfb, delays, n = None, [], 0
    with urllib.request.urlopen(req, context=ctx) as r:
        for line in r:
            if ttfb is None:
                ttfb = time.perf_counter_ns() - t0
            n += len(line)
            if model == "bench-events" and line.startswith(b"data: ") and b"text_delta" in line:
                sent = int(json.loads(line[6:])["delta"]["text"])
                delays.append(time.time_ns() - sent)
    total = time.perf_counter_ns() - t0
    delays.sort()
    out = {"via": which, "model": model, "ttfb_ms": ttfb / 1e6, "bytes": n, "total_ms": total / 1e6}
    if delays:
        out["event_delay_ms"] = delays[len(delays) // 2] / 1e6
    print(json.dumps(out), flush=True)
rounds = int(sys.argv[1])
# A warm-up (each kind once), then wait for the test to read the shim's
# memory.
for which in ("model-host", "passthrough"):
    call(which, "bench-events")
    call(which, "bench-bulk")
print("warmed", flush=True)
while not os.path.exists("/tmp/go"):
    time.sleep(0.1)
for i in range(rounds):
    order = ["model-host", "passthrough"] if i % 2 == 0 else ["passthrough", "model-host"]
    for which in order:
        call(which, "bench-events")
for i in range(max(2, rounds // 2)):
    for which in (["model-host", "passthrough"] if i % 2 == 0 else ["passthrough", "model-host"]):
        call(which, "bench-bulk")
`

// TestBenchmarkModelCalls: the model-call path (a host rule with api:, its
// TLS terminated, its key injected, its stream read on the side) against
// a passthrough rule to the same scripted server, from inside gVisor, in
// one pod, interleaved: time to first byte, each streamed event's delay
// from the server's send, a 16 MiB stream's throughput, and the pod
// shim's PSS after a warm-up round and after the measured ones. AGENTBOX_BENCH=1 only (hack/bench.sh).
func TestBenchmarkModelCalls(t *testing.T) {
	requireBench(t)
	requireRealAgentImage(t)
	rounds := benchRounds("AGENTBOX_BENCH_MODEL_ROUNDS", 10)
	p := newPodIn(t, "modelbench", "e2e-model-bench", map[string]string{"agentbox.dev/role": "e2e-model-bench"})
	defer p.remove()
	script := fmt.Sprintf(`cat "$SSL_CERT_FILE" > /tmp/bundle.pem && printf '%%s\n' "$AGENT_CA_PEM" >> /tmp/bundle.pem && sleep 2 && echo ready && python3 -c "$AGENT_BENCH_PY" %d && echo probes-done; sleep 600`, rounds)
	id := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", script},
		"envs":    []map[string]string{{"key": "AGENT_BENCH_PY", "value": benchModelPy}, {"key": "AGENT_CA_PEM", "value": web.caPEM}},
		"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	waitLogsWithin(t, id, "warmed", 2*time.Minute)
	shimPSS := func() uint64 {
		for _, pid := range pidsNaming(p.id) {
			if strings.Contains(cmdline(pid), "containerd-shim-agentbox-v1") {
				return smapsRollup(pid, "Pss:")
			}
		}
		return 0
	}
	before := shimPSS()
	if r := dev.crictl(30*time.Second, "exec", id, "touch", "/tmp/go"); r.code != 0 {
		t.Fatalf("crictl exec: %v", r)
	}
	logs := waitLogsWithin(t, id, "probes-done", 10*time.Minute)
	after := shimPSS()
	type line struct {
		Via, Model string
		TTFB       float64 `json:"ttfb_ms"`
		Delay      float64 `json:"event_delay_ms"`
		Bytes      int64
		Total      float64 `json:"total_ms"`
	}
	by := map[string][]line{}
	_, measured, _ := strings.Cut(logs.stdout, "warmed")
	for _, l := range strings.Split(measured, "\n") {
		var x line
		if json.Unmarshal([]byte(l), &x) == nil && x.Via != "" {
			by[x.Via+" "+x.Model] = append(by[x.Via+" "+x.Model], x)
		}
	}
	median := func(ls []line, f func(line) float64) float64 {
		var v []float64
		for _, l := range ls {
			v = append(v, f(l))
		}
		if len(v) == 0 {
			return 0
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	for _, k := range []string{"model-host bench-events", "passthrough bench-events", "model-host bench-bulk", "passthrough bench-bulk"} {
		if len(by[k]) == 0 {
			t.Fatalf("no %s calls:\n%s\n%s", k, clip(logs.stdout), clip(logs.stderr))
		}
	}
	ttfb := func(k string) float64 { return median(by[k], func(l line) float64 { return l.TTFB }) }
	delay := func(k string) float64 { return median(by[k], func(l line) float64 { return l.Delay }) }
	mibs := func(k string) float64 {
		return median(by[k], func(l line) float64 { return float64(l.Bytes) / (1 << 20) / (l.Total / 1000) })
	}
	var b strings.Builder
	fmt.Fprintf(&b, "model calls from inside gVisor, a model host rule (inspected, key injected, stream read) vs passthrough to the same server (%d interleaved rounds; medians):\n", rounds)
	fmt.Fprintf(&b, "  time to first byte:       model host %.2f ms, passthrough %.2f ms (%+.2f ms)\n", ttfb("model-host bench-events"), ttfb("passthrough bench-events"), ttfb("model-host bench-events")-ttfb("passthrough bench-events"))
	fmt.Fprintf(&b, "  streamed event's delay:   model host %.2f ms, passthrough %.2f ms (%+.2f ms per event)\n", delay("model-host bench-events"), delay("passthrough bench-events"), delay("model-host bench-events")-delay("passthrough bench-events"))
	fmt.Fprintf(&b, "  16 MiB stream:            model host %.1f MiB/s, passthrough %.1f MiB/s (%.2fx)\n", mibs("model-host bench-bulk"), mibs("passthrough bench-bulk"), mibs("model-host bench-bulk")/mibs("passthrough bench-bulk"))
	fmt.Fprintf(&b, "  the pod shim's PSS:       %d KiB after a warm-up, %d KiB after (%+d KiB)\n", before, after, int64(after)-int64(before))
	t.Log(b.String())
	benchOut(t, b.String())
}
