//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/report"
	"agentbox.dev/agentbox/internal/toollink"
)

// modelScript calls each model API from inside gVisor as agents' clients
// do (curl, glibc; Node's fetch), with the placeholders agentbox put in
// the usual variables: a streamed Messages call, a Responses call, a
// streamed Gemini call and a streamed Chat Completions call.
const modelScript = `
step() { name=$1; shift; out=$( ( "$@" ) 2>&1 ); rc=$?; echo "== $name: rc=$rc $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-1500)"; }
cd /workspace
step keys sh -c 'for v in "$ANTHROPIC_API_KEY" "$OPENAI_API_KEY" "$GEMINI_API_KEY"; do case "$v" in agentbox-placeholder-*) echo -n "placeholder ";; *) echo -n "NOT-A-PLACEHOLDER ";; esac; done'
step anthropic curl -sS -N -A e2e-agent/1.0 https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-version: 2023-06-01" -H "content-type: application/json" \
  -d '{"model":"claude-e2e","max_tokens":200,"stream":true,"messages":[{"role":"user","content":"make model.txt"}]}'
step openai curl -sS -A e2e-agent/1.0 https://api.openai.com/v1/responses -H "Authorization: Bearer $OPENAI_API_KEY" -H "content-type: application/json" \
  -d '{"model":"gpt-e2e","input":"make model.txt"}'
step gemini curl -sS -N -A e2e-agent/1.0 "https://generativelanguage.googleapis.com/v1beta/models/gemini-e2e:streamGenerateContent?alt=sse" -H "x-goog-api-key: $GEMINI_API_KEY" \
  -H "content-type: application/json" -d '{"contents":[{"role":"user","parts":[{"text":"make model.txt"}]}]}'
step node-chat node -e '
fetch("https://api.openai.com/v1/chat/completions", {method: "POST", headers: {"content-type": "application/json", authorization: "Bearer " + process.env.OPENAI_API_KEY},
  body: JSON.stringify({model: "gpt-chat-e2e", stream: true, stream_options: {include_usage: true}, messages: [{role: "user", content: "make model.txt"}]})})
  .then(r => r.text()).then(t => console.log(t.includes("call_e2e2") ? "tool-call-streamed" : t)).catch(e => console.log("error", e.cause || e))'
step agent-loop python3 -c "$AGENT_LOOP_PY" claude-loop
step model-file cat model.txt
step agent-loop-injected python3 -c "$AGENT_LOOP_PY" claude-exfil
step secret-in-sandbox sh -c 'grep -rlsF ` + "'" + `{{SECRET}}` + "'" + ` /proc/self/environ /workspace /tmp /etc; echo searched'
echo probes-done
sleep 600
`

// agentLoopPy is a minimal coding agent: it streams a Messages call,
// runs the tool call's command with bash -c, as agents' shell tools do,
// sends the result back and prints the model's last answer.
const agentLoopPy = `
import json, os, subprocess, sys, urllib.request
def call(messages):
    req = urllib.request.Request("https://api.anthropic.com/v1/messages",
        data=json.dumps({"model": sys.argv[1], "max_tokens": 300, "stream": True, "messages": messages}).encode(),
        headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01",
                 "content-type": "application/json", "user-agent": "e2e-loop/1.0"})
    blocks, stop = {}, None
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "content_block_start":
                blocks[ev["index"]] = dict(ev["content_block"], partial="")
            elif ev["type"] == "content_block_delta":
                d, b = ev["delta"], blocks[ev["index"]]
                if d["type"] == "input_json_delta":
                    b["partial"] += d["partial_json"]
                elif d["type"] == "text_delta":
                    b["text"] = b.get("text", "") + d["text"]
            elif ev["type"] == "message_delta":
                stop = ev["delta"].get("stop_reason")
    return [blocks[i] for i in sorted(blocks)], stop
messages = [{"role": "user", "content": "make model.txt"}]
for turn in range(5):
    blocks, stop = call(messages)
    if stop != "tool_use":
        print("final:", blocks[0].get("text"))
        break
    uses = [b for b in blocks if b["type"] == "tool_use"]
    results = []
    for b in uses:
        b["input"] = json.loads(b["partial"])
        out = subprocess.run(["bash", "-c", b["input"]["command"]], capture_output=True, text=True).stdout
        results.append({"type": "tool_result", "tool_use_id": b["id"], "content": out})
    messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]} for b in uses]},
                 {"role": "user", "content": results}]
`

// TestModelCalls: under a role whose host rules name their model APIs,
// each call from inside gVisor is one agentbox/model_call record: the
// model that answered, the tokens, the stop reason, the tool call the
// model asked for with its input, the client and the process that made
// it. The vendor got the real key; the sandbox held placeholders only.
func TestModelCalls(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "model", "e2e-model", map[string]string{"agentbox.dev/role": "e2e-model"})
	// A part of the secret, so that grep's own argv does not hold it.
	script := strings.ReplaceAll(modelScript, "{{SECRET}}", secretValue[4:len(secretValue)-3])
	id := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", script},
		"envs":    []map[string]string{{"key": "HOME", "value": "/workspace"}, {"key": "AGENT_LOOP_PY", "value": agentLoopPy}},
		"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	logs := waitLogsWithin(t, id, "probes-done", 3*time.Minute)
	lines := stepLines(logs.stdout)
	for step, want := range map[string]string{
		"keys":      "placeholder placeholder placeholder",
		"anthropic": `"id":"toolu_e2e1","input":{},"name":"Bash","type":"tool_use"`, "openai": `"call_id":"call_e2e1"`,
		"gemini": `"functionCall":{"args":{"command":`, "node-chat": "tool-call-streamed", "secret-in-sandbox": "searched",
		"agent-loop": "final: All done.", "model-file": "made-by-claude-loop", "agent-loop-injected": "final: All done.",
	} {
		if got := lines[step]; !strings.HasPrefix(got, "rc=0 ") || !strings.Contains(got, want) {
			t.Errorf("%s: %q, want rc=0 and %q", step, got, want)
		}
	}
	if strings.Contains(lines["secret-in-sandbox"], "/") {
		t.Errorf("the key is in the sandbox: %q", lines["secret-in-sandbox"])
	}
	if t.Failed() {
		t.Fatalf("pod output:\n%s\n%s", logs.stdout, logs.stderr)
	}
	// Each vendor received the real key, in its own header.
	for host, want := range map[string]string{anthropicHost + " /v1/messages": "X-Api-Key: " + secretValue,
		openaiHost + " /v1/responses": "Authorization: Bearer " + secretValue, openaiHost + " /v1/chat/completions": "Authorization: Bearer " + secretValue,
		geminiHost + " /v1beta/models/gemini-e2e:streamGenerateContent": "X-Goog-Api-Key: " + secretValue} {
		site, path, _ := strings.Cut(host, " ")
		if got := web.authSeen(site, path); len(got) == 0 || got[len(got)-1] != want {
			t.Errorf("%s received %q, want %q", host, got, want)
		}
	}
	p.remove()
	readTrail(t, p.id) // waits for the trail's end
	b, err := os.ReadFile(filepath.Join(dev.dir, "audit", p.id+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]*audit.Record{}
	var loop []*audit.Record // the agent loop's calls, in order
	var ran *audit.Record    // the process the loop's tool call started
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		r, err := audit.ParseLine(l)
		if err != nil {
			t.Fatal(err)
		}
		if r.Event == "agentbox/model_call" {
			if r.Model != nil && r.Model.Requested == "claude-loop" {
				loop = append(loop, r)
				continue
			}
			if r.Model != nil && r.Model.Requested == exfilModel {
				continue // checkInjectedTurn reads the report of it
			}
			path, _, _ := strings.Cut(r.Detail["path"], "?")
			calls[path] = r
		}
		if r.Event == "sentry/execve" && r.Process != nil && len(r.Process.Argv) == 3 && r.Process.Argv[2] == modelCommand("claude-loop") {
			ran = r
		}
		if bytes.Contains(l, []byte(secretValue)) {
			t.Errorf("the key is in the trail: %s", l)
		}
	}
	checkAgentLoop(t, loop, ran)
	checkInjectedTurn(t, p.id)
	type want struct {
		api, provider, model, requested, stop, tool, app string
		tokens                                           audit.Tokens
		stream                                           bool
	}
	for path, w := range map[string]want{
		"/v1/messages":  {"anthropic", "Anthropic", "claude-e2e-20261201", "claude-e2e", "tool_use", "Bash", "e2e-agent/1.0", audit.Tokens{Prompt: 120, Completion: 24, Total: 144}, true},
		"/v1/responses": {"openai", "OpenAI", "gpt-e2e-2026", "gpt-e2e", "completed", "shell", "e2e-agent/1.0", audit.Tokens{Prompt: 300, Completion: 30, Total: 330}, false},
		"/v1beta/models/gemini-e2e:streamGenerateContent": {"gemini", "Google", "gemini-e2e-001", "gemini-e2e", "STOP", "run_shell_command", "e2e-agent/1.0", audit.Tokens{Prompt: 80, Completion: 12, Total: 92}, true},
		"/v1/chat/completions":                            {"openai", "OpenAI", "gpt-chat-e2e", "gpt-chat-e2e", "tool_calls", "shell", "node", audit.Tokens{Prompt: 50, Completion: 9, Total: 59}, true},
	} {
		r := calls[path]
		if r == nil {
			t.Errorf("no model_call record for %s (have %v)", path, keys(calls))
			continue
		}
		m := r.Model
		if m == nil || m.API != w.api || m.Provider != w.provider || m.Name != w.model || m.StopReason != w.stop || m.Stream != w.stream ||
			m.Tokens == nil || *m.Tokens != w.tokens || len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != w.tool || commandOf(m.ToolCalls[0].Input) != modelCommand(w.requested) ||
			(m.Application != w.app && w.app != "node") || m.Application == "" || m.FirstByteMS <= 0 || len(m.RequestDigest) != 64 || m.Problem != "" {
			t.Errorf("%s: %s\n%+v", path, r.Message, m)
		}
		// The actor: the client's process, joined from the connect that
		// opened the gateway connection.
		name := "curl"
		if w.app == "node" {
			name = "node"
		}
		if r.Process == nil || r.Process.Name != name || r.Process.PID == 0 {
			t.Errorf("%s: actor %+v, want %s", path, r.Process, name)
		}
	}
}

// The loop: two calls, the first asking for the tool, the second after
// its result; the shell the loop started for the tool call is linked to
// the call and the model call that asked for it.
func checkAgentLoop(t *testing.T, loop []*audit.Record, ran *audit.Record) {
	t.Helper()
	if len(loop) != 2 || loop[0].Model.StopReason != "tool_use" || loop[1].Model.StopReason != "end_turn" || loop[1].Model.Application != "e2e-loop/1.0" {
		for _, r := range loop {
			t.Logf("%s %+v", r.Message, r.Model)
		}
		t.Fatalf("the agent loop's calls: %d", len(loop))
	}
	if ran == nil {
		t.Fatal("no sentry/execve record of the tool's bash -c")
	}
	t.Logf("the loop's first call is #%d, the tool's bash -c #%d", loop[0].Seq, ran.Seq)
	want := map[string]string{"tool_call_id": "toolu_e2e1", "tool_call_name": "Bash", "model": "claude-loop-20261201",
		"model_call": fmt.Sprintf("%s/%d", loop[0].Sandbox, loop[0].Seq)}
	for k, v := range want {
		if ran.Detail[k] != v {
			t.Errorf("the tool's process: %s = %q, want %q (%v)", k, ran.Detail[k], v, ran.Detail)
		}
	}
}

// checkInjectedTurn: agentbox audit report puts the connect refused to
// the injected turn's curl beside the tool call that asked for it.
func checkInjectedTurn(t *testing.T, sandbox string) {
	t.Helper()
	rep, raw := auditReport(t, sandbox)
	found := false
	for _, tu := range rep.Turns {
		if tu.Model != exfilModel+"-20261201" {
			continue
		}
		for _, c := range tu.Tools {
			for _, ref := range c.Refusals {
				if len(c.Processes) == 1 && strings.Contains(ref.Message, webAddr) {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("the report does not put the refused connect beside the injected turn:\n%s", clip(raw))
	}
}

// auditReport is agentbox audit report's JSON of a sandbox of the dev
// daemon, read back, and as it was printed.
func auditReport(t *testing.T, sandbox string) (*report.Report, string) {
	t.Helper()
	r := runCommand(time.Minute, nil, nil, filepath.Join(repoRoot, "_output", "bin", "agentbox"), "audit", "report", "-o", "json",
		"--sandbox", sandbox, filepath.Join(dev.dir, "audit"))
	if r.code != 0 {
		t.Fatalf("agentbox audit report: %v", r)
	}
	var rep report.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, clip(r.stdout))
	}
	return &rep, r.stdout
}

// commandOf is the command a tool call's input holds.
func commandOf(input string) string {
	cmd, _ := toollink.Command(input)
	return cmd
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestModelBudget: a role's model budget, from inside gVisor: the first
// call goes (it reserves 95 of 200 tokens; it uses 144), the second would
// pass the budget and gets Anthropic's own 429 with
// agentbox's reason, which the client shows, and the trail says which
// bound refused it; the vendor never saw the second call.
func TestModelBudget(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	before := len(web.authSeen(anthropicHost, "/v1/messages"))
	p := newPodIn(t, "modelbudget", "e2e-model-budget", map[string]string{"agentbox.dev/role": "e2e-model-budget"})
	call := `curl -sS -w ' http=%{http_code}' https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -H "content-type: application/json" -d '{"model":"claude-budget","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'`
	script := strings.Join([]string{gwStep("first", call), gwStep("second", call), "echo probes-done", "sleep 600"}, "; ")
	id := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", script},
		"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	logs := waitLogsWithin(t, id, "probes-done", 2*time.Minute)
	lines := stepLines(logs.stdout)
	if got := lines["first"]; !strings.Contains(got, `"stop_reason":"tool_use"`) || !strings.HasSuffix(strings.TrimSpace(got), "http=200") {
		t.Errorf("first call: %q", got)
	}
	want := `{"error":{"message":"agentbox: this call would pass this sandbox's model budget: it reserves more than 56 tokens (its input's size alone: more than 56 bytes, a token a byte at most), and 56 of 200 are left (144 used, 0 reserved by calls in flight) (limits.model.tokens)","type":"rate_limit_error"},"type":"error"} http=429`
	if got := strings.TrimSpace(lines["second"]); got != want {
		t.Errorf("second call: %q, want %q", got, want)
	}
	if n := len(web.authSeen(anthropicHost, "/v1/messages")) - before; n != 1 {
		t.Errorf("the vendor saw %d calls, want 1", n)
	}
	p.remove()
	var limited bool
	for _, r := range readTrail(t, p.id) {
		if r.Event == "agentbox/model_limit" && r.Detail["limit"] == "model_tokens" && r.Detail["http_status"] == "429" {
			limited = true
		}
	}
	if !limited {
		t.Error("trail: no agentbox/model_limit record")
	}
}
