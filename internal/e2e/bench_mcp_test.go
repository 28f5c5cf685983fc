//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// benchMCPPy calls the scripted MCP server's get_issue from inside gVisor,
// alternating the MCP rule (inspected, read, key injected) and a
// passthrough rule to the same server, and prints one JSON line per call:
// the whole call (a JSON answer), and for a streamed answer the progress
// event's delay from the server's send (same clock: gVisor's is the
// host's) and the whole call.
const benchMCPPy = `
import json, os, ssl, sys, time, urllib.request
ctx = ssl.create_default_context(cafile="/tmp/bundle.pem")
hosts = {"mcp-rule": "mcp.gw.e2e.test", "passthrough": "mcp-pass.gw.e2e.test"}
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_issue", "arguments": {"n": 1}}}).encode()
def call(which, accept):
    req = urllib.request.Request("https://%s/mcp" % hosts[which], data=body, headers={"content-type": "application/json", "accept": accept, "mcp-session-id": "bench"})
    t0 = time.perf_counter_ns()
    first = None
    with urllib.request.urlopen(req, context=ctx) as r:
        for line in r:
            if first is None and line.startswith(b"data: ") and b"progress" in line:
                sent = json.loads(line[6:])["params"]["progress"]
                first = (time.time_ns() - sent) / 1e6
    out = {"via": which, "kind": "events" if "event-stream" in accept else "json", "total_ms": (time.perf_counter_ns() - t0) / 1e6}
    if first is not None:
        out["first_event_ms"] = first
    print(json.dumps(out), flush=True)
for which in hosts:
    call(which, "application/json")
    call(which, "text/event-stream")
print("warmed", flush=True)
for i in range(int(sys.argv[1])):
    order = list(hosts) if i % 2 == 0 else list(reversed(list(hosts)))
    for which in order:
        call(which, "application/json")
        call(which, "text/event-stream")
`

// TestBenchmarkMCP: an MCP tools/call through an api: mcp rule (TLS
// terminated, every message read and decided, tools/list filtered, key
// injected) against a passthrough rule to the same scripted server, from
// inside gVisor, in one pod, interleaved: the whole call answered as JSON,
// and a streamed answer's first event delay and whole call.
// AGENTBOX_BENCH=1 only (hack/bench.sh).
func TestBenchmarkMCP(t *testing.T) {
	requireBench(t)
	requireRealAgentImage(t)
	rounds := benchRounds("AGENTBOX_BENCH_MCP_ROUNDS", 40)
	p := newPodIn(t, "mcpbench", "e2e-mcp-bench", map[string]string{"agentbox.dev/role": "e2e-mcp-bench"})
	defer p.remove()
	script := fmt.Sprintf(`cat "$SSL_CERT_FILE" > /tmp/bundle.pem && printf '%%s\n' "$MCP_CA_PEM" >> /tmp/bundle.pem && python3 -c "$MCP_BENCH_PY" %d && echo probes-done; sleep 600`, rounds)
	id := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", script},
		"envs":    []map[string]string{{"key": "MCP_BENCH_PY", "value": benchMCPPy}, {"key": "MCP_CA_PEM", "value": web.caPEM}},
		"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	logs := waitLogsWithin(t, id, "probes-done", 5*time.Minute)
	type line struct {
		Via, Kind string
		Total     float64 `json:"total_ms"`
		First     float64 `json:"first_event_ms"`
	}
	by := map[string][]time.Duration{}
	_, measured, _ := strings.Cut(logs.stdout, "warmed")
	for _, l := range strings.Split(measured, "\n") {
		var x line
		if json.Unmarshal([]byte(l), &x) != nil || x.Via == "" {
			continue
		}
		by[x.Via+" "+x.Kind] = append(by[x.Via+" "+x.Kind], time.Duration(x.Total*float64(time.Millisecond)))
		if x.Kind == "events" {
			by[x.Via+" first"] = append(by[x.Via+" first"], time.Duration(x.First*float64(time.Millisecond)))
		}
	}
	for _, k := range []string{"mcp-rule json", "passthrough json", "mcp-rule events", "passthrough events"} {
		if len(by[k]) < rounds {
			t.Fatalf("%d %s calls:\n%s\n%s", len(by[k]), k, clip(logs.stdout), clip(logs.stderr))
		}
	}
	row := func(what, k string) string {
		a, b := stats(by["mcp-rule "+k]), stats(by["passthrough "+k])
		return fmt.Sprintf("  %-34s MCP rule %s (p90 %s), passthrough %s (p90 %s): %+.2f ms\n", what, ms(a.median), ms(a.p90), ms(b.median), ms(b.p90),
			float64(a.median-b.median)/float64(time.Millisecond))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "MCP tools/call from inside gVisor, an api: mcp rule (inspected, read, key injected) vs passthrough to the same server (%d interleaved rounds; median):\n", rounds)
	b.WriteString(row("a call answered as JSON:", "json"))
	b.WriteString(row("a streamed answer's first event:", "first"))
	b.WriteString(row("a streamed answer, whole:", "events"))
	t.Log(b.String())
	benchOut(t, b.String())
}
