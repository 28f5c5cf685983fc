//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"
)

// boundBudget is e2e-model-bound's limits.model.tokens.
const boundBudget = 1200

// boundCalls defines the callers in each sandbox's script: curl as agents
// use it, toward the three vendors' names (the keys are placeholders).
const boundCalls = `
oa() { curl -sS -N -w ' http=%{http_code}' "https://api.openai.com/v1/$1" -H "Authorization: Bearer $OPENAI_API_KEY" -H 'content-type: application/json' -d "$2"; }
an() { curl -sS -N -w ' http=%{http_code}' "https://api.anthropic.com/v1/$1" -H "x-api-key: $ANTHROPIC_API_KEY" -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' -d "$2"; }
`

// boundScenarios: each a sandbox of e2e-model-bound, a hostile agent's way
// past the budget (or the honest twin), its calls made one after another
// until the budget stops them.
var boundScenarios = []struct {
	name, model string
	// call is one call, its output cut to its start.
	call string
	// admitted: how many calls the budget lets go.
	admitted int
	// exact: the gateway charged just what the vendor billed.
	exact bool
}{
	// The twin: a stream with its usage, charged its final usage.
	{"honest", "bill-honest", `oa chat/completions '{"model":"bill-honest","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}' | tail -c 500`, 2, true},
	// No usage in the stream (the API's default), and no cap: the cap of
	// 400 is set, and the call is charged its reservation.
	{"nousage", "bill-nousage", `oa chat/completions '{"model":"bill-nousage","stream":true,"messages":[{"role":"user","content":"hi"}]}' | tail -c 500`, 2, false},
	// Streams the agent closes after their first events.
	{"cut-messages", "bill-cut-msg", `an messages '{"model":"bill-cut-msg","max_tokens":400,"stream":true,"messages":[{"role":"user","content":"hi"}]}' | head -c 600`, 2, false},
	{"cut-responses", "bill-cut-resp", `oa responses '{"model":"bill-cut-resp","max_output_tokens":400,"stream":true,"input":"hi"}' | head -c 600`, 2, false},
}

// TestModelBudgetBound (issue 47): from inside gVisor, an agent under a
// budget of 1200 tokens tries each way past it that was found: streams
// without usage, streams cut short, 20 calls at once, endpoints whose
// usage the gateway did not read. The vendor's own bill (the billing model
// server's) is compared with what the gateway charged: the vendor never
// bills more than the budget, and the gateway never charges less than the
// vendor billed; the honest twin is charged exactly its bill.
func TestModelBudgetBound(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	type run struct {
		p  *pod
		id string
	}
	start := func(name, script string) run {
		p := newPodIn(t, "bound-"+name, "e2e-model-bound", map[string]string{"agentbox.dev/role": "e2e-model-bound"})
		id := p.containerWith(t, "agent", map[string]any{
			"image":   map[string]any{"image": realAgentImage},
			"command": []string{"bash", "-c", boundCalls + script + "\necho probes-done; sleep 600"},
			"envs":    []map[string]string{{"key": "HOME", "value": "/workspace"}},
			"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
		})
		return run{p, id}
	}
	runs := map[string]run{}
	for _, sc := range boundScenarios {
		var steps []string
		for i := 1; i <= sc.admitted+1; i++ {
			steps = append(steps, gwStep(sc.name+"-"+string(rune('0'+i)), sc.call))
		}
		runs[sc.name] = start(sc.name, strings.Join(steps, "\n"))
	}
	// 20 calls at once, none answered before all are sent (the vendor
	// answers after a second): two fit in the budget.
	runs["parallel"] = start("parallel", `d=$(mktemp -d)
for i in $(seq 20); do an messages '{"model":"bill-parallel","max_tokens":400,"messages":[{"role":"user","content":"hi"}]}' > $d/$i 2>&1 & done; wait
echo "== parallel: $(cat $d/* | grep -o 'http=[0-9]*' | sort | uniq -c | tr -s ' \n' '  ')"
echo "== parallel-refusal: $(grep -h 'http=429' $d/* | head -1)"`)
	// Other endpoints: embeddings are charged their usage; a batch is
	// refused (its results would come later, as a file).
	runs["endpoints"] = start("endpoints", strings.Join([]string{
		gwStep("embeddings", `oa embeddings '{"model":"bill-embed","input":"hi"}'`),
		gwStep("batch", `an messages/batches '{"requests":[{"custom_id":"a","params":{"model":"bill-b","max_tokens":400,"messages":[{"role":"user","content":"hi"}]}}]}'`),
		gwStep("openai-batch", `oa batches '{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}'`),
	}, "\n"))
	lines := map[string]string{}
	for _, r := range runs {
		logs := waitLogsWithin(t, r.id, "probes-done", 3*time.Minute)
		for k, v := range stepLines(logs.stdout) {
			lines[k] = v
		}
	}
	refusal := "agentbox: this call would pass this sandbox's model budget"
	for _, sc := range boundScenarios {
		for i := 1; i <= sc.admitted; i++ {
			step := sc.name + "-" + string(rune('0'+i))
			if got := lines[step]; strings.Contains(got, "http=4") || strings.Contains(got, "agentbox") {
				t.Errorf("%s: %q, want the call to go", step, got)
			}
		}
		last := sc.name + "-" + string(rune('0'+sc.admitted+1))
		if got := lines[last]; !strings.Contains(got, refusal) || !strings.Contains(got, "http=429") {
			t.Errorf("%s: %q, want %q", last, got, refusal)
		}
	}
	if got := lines["parallel"]; !strings.Contains(got, "2 http=200") || !strings.Contains(got, "18 http=429") {
		t.Errorf("20 at once: %q, want 2 admitted, 18 refused", got)
	}
	if got := lines["parallel-refusal"]; !strings.Contains(got, "reserved by calls in flight") {
		t.Errorf("20 at once: the refusal %q", got)
	}
	if got := lines["embeddings"]; !strings.Contains(got, `"prompt_tokens":8`) || !strings.Contains(got, "http=200") {
		t.Errorf("embeddings: %q", got)
	}
	for _, step := range []string{"batch", "openai-batch"} {
		if got := lines[step]; !strings.Contains(got, "is not served under a token budget") || !strings.Contains(got, "http=403") {
			t.Errorf("%s: %q", step, got)
		}
	}
	if n := bill.reached(anthropicHost, "/v1/messages/batches") + bill.reached(openaiHost, "/v1/batches"); n != 0 || bill.of("bill-batch") != 0 {
		t.Errorf("a batch reached the vendor %d times", n)
	}
	if t.Failed() {
		t.Fatalf("steps: %q", lines)
	}

	// The bills against the charges, sandbox by sandbox, from the trail.
	models := map[string][]string{"parallel": {"bill-parallel"}, "endpoints": {"bill-embed"}}
	exact := map[string]bool{"endpoints": true, "parallel": true}
	for _, sc := range boundScenarios {
		models[sc.name], exact[sc.name] = []string{sc.model}, sc.exact
	}
	var totalBilled, totalCharged int64
	for name, r := range runs {
		r.p.remove()
		var charged int64
		var capSet bool
		for _, rec := range readTrail(t, r.p.id) {
			if rec.Event != "agentbox/model_call" || rec.Model == nil {
				continue
			}
			b := rec.Model.Budget
			if b == nil {
				t.Errorf("%s: a call without its budget: %+v", name, rec.Model)
				continue
			}
			charged += b.Charged
			capSet = capSet || b.CapSet == 400
			if !exact[name] && b.Charged != b.Reserved {
				t.Errorf("%s: a call whose usage could not be read was charged %d, not its reservation %d", name, b.Charged, b.Reserved)
			}
		}
		var billed int64
		for _, m := range models[name] {
			billed += bill.of(m)
		}
		t.Logf("%s: the vendor billed %d tokens, the gateway charged %d, of a budget of %d", name, billed, charged, boundBudget)
		switch {
		case billed > boundBudget:
			t.Errorf("%s: the vendor billed %d tokens, past the budget of %d", name, billed, boundBudget)
		case exact[name] && charged != billed:
			t.Errorf("%s: charged %d, the vendor billed %d", name, charged, billed)
		case charged < billed:
			t.Errorf("%s: charged %d, less than the vendor billed (%d)", name, charged, billed)
		}
		if name == "nousage" && !capSet {
			t.Errorf("nousage: no call had the cap of 400 set")
		}
		totalBilled, totalCharged = totalBilled+billed, totalCharged+charged
	}
	t.Logf("in all: the vendor billed %d tokens, the gateway charged %d, over %d sandboxes of %d each", totalBilled, totalCharged, len(runs), boundBudget)
}
