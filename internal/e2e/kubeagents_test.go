//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/e2e/modelscript"
)

// TestKubeAgentExamples: examples/agents/ applied as the guide shows it
// (docs/agents/), but for the namespaces and the keys' values: the
// coding-agent role, the vendors' keys as a Kubernetes Secret only the
// node agent may read, and a pod each for Claude Code, Codex and Gemini
// CLI, which do their task at their vendors' default endpoints (the
// scripted model server). Each vendor got its key from the Secret; no
// pod held it; each pod's trail has its model calls.
func TestKubeAgentExamples(t *testing.T) {
	requireAgentCLIImage(t)
	k := kubeCluster(t)
	ns := k.namespace(t, "e2e-agents")
	keys := k.namespace(t, "e2e-agent-keys")
	k.inspectedOnBridge(t, webAddr, web.caPEM, anthropicHost, openaiHost, geminiHost)
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "coding-agent", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "coding-agent", "--ignore-not-found")
	})
	values := map[string]string{"sk-ant-replace-me": "sk-ant-" + uniqueID("e2e"), "sk-replace-me": "sk-oai-" + uniqueID("e2e"), "replace-me": "gem-" + uniqueID("e2e")}
	apply := func(file string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repoRoot, "examples", "agents", file))
		if err != nil {
			t.Fatal(err)
		}
		y := strings.ReplaceAll(string(b), "namespace: agents", "namespace: "+ns)
		y = strings.ReplaceAll(y, "agent-keys", keys)
		for placeholder, v := range values {
			y = strings.ReplaceAll(y, ": "+placeholder+"\n", ": "+v+"\n")
		}
		if r := k.run(time.Minute, []byte(y), "kubectl", "apply", "-f", "-"); r.code != 0 {
			t.Fatalf("kubectl apply %s: %v", file, r)
		}
	}
	for _, f := range []string{"secret.yaml", "rbac.yaml", "role.yaml"} {
		apply(f)
	}
	k.waitPolicy(t, "agentrole", "coding-agent", "enforced", enforced)
	pods := map[string]struct{ host, path, header, value string }{
		"claude-code": {anthropicHost, "/v1/messages", "X-Api-Key: ", values["sk-ant-replace-me"]},
		"codex":       {openaiHost, "/v1/responses", "Authorization: Bearer ", values["sk-replace-me"]},
		"gemini-cli":  {geminiHost, "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "X-Goog-Api-Key: ", values["replace-me"]},
	}
	for name := range pods {
		apply(name + ".yaml")
	}
	for name, want := range pods {
		p := k.waitPod(t, ns, name, 4*time.Minute, "terminated", terminated)
		logs := k.mustKubectl(t, "-n", ns, "logs", name)
		// What the runtime saw of it, for a failure's message.
		var calls int
		var records []string
		for _, r := range k.trail(t, k.sandboxOf(t, p.Metadata.UID)) {
			if r.Event == "agentbox/model_call" {
				calls++
			}
			if strings.HasPrefix(r.Event, "agentbox/") {
				records = append(records, fmt.Sprintf("%s: %s %v", r.Event, r.Message, r.Detail))
			}
			if strings.Contains(r.Message, want.value) {
				t.Errorf("%s: the key is in the trail: %s", name, r.Message)
			}
		}
		if st := p.Status.ContainerStatuses[0].State.Terminated; st.ExitCode != 0 || !strings.Contains(logs, modelscript.Done) {
			t.Errorf("%s: exit %d\n%s\nits agentbox records:\n%s", name, st.ExitCode, clip(logs), strings.Join(records, "\n"))
			continue
		}
		if seen := web.authSeen(want.host, want.path); !slices.Contains(seen, want.header+want.value) {
			t.Errorf("%s: %s received %d calls, none with the Secret's value", name, want.host, len(seen))
		}
		if calls != 4 {
			t.Errorf("%s: %d model calls in its trail, want 4; its agentbox records:\n%s\n%s", name, calls, strings.Join(records, "\n"), clip(logs))
		}
	}
}

// TestKubeAgentRecipes: the browsing agent and the Python agent of
// examples/agents/, applied as the guide shows them but for the namespace
// and the site names (docs.example.com and pypi.internal.example are the
// suite's web host, which serves a page and a package index): Chromium
// reads the allowed site and is refused another; pip installs from the
// private index and is refused the public one.
func TestKubeAgentRecipes(t *testing.T) {
	requireAgentCLIImage(t)
	k := kubeCluster(t)
	ns := k.namespace(t, "e2e-recipes")
	k.inspectedOnBridge(t, webAddr, web.caPEM, gwAllowA, gwAllowB)
	t.Cleanup(func() {
		k.kubectl("delete", "agentrolebinding", "browsing-agent", "python-agent", "--ignore-not-found")
		k.kubectl("delete", "agentrole", "browsing-agent", "python-agent", "--ignore-not-found")
	})
	apply := func(file string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repoRoot, "examples", "agents", file))
		if err != nil {
			t.Fatal(err)
		}
		y := strings.NewReplacer("namespace: agents", "namespace: "+ns,
			"https://pypi.internal.example/simple", "https://"+gwAllowA+"/pypi/simple",
			"pypi.internal.example", gwAllowA, "docs.example.com", gwAllowA, "elsewhere.example.net", gwAllowB,
			`value: "requests"`, `value: "abxdemo"`).Replace(string(b))
		if r := k.run(time.Minute, []byte(y), "kubectl", "apply", "-f", "-"); r.code != 0 {
			t.Fatalf("kubectl apply %s: %v", file, r)
		}
	}
	apply("browser-role.yaml")
	apply("python-role.yaml")
	k.waitPolicy(t, "agentrole", "browsing-agent", "enforced", enforced)
	k.waitPolicy(t, "agentrole", "python-agent", "enforced", enforced)
	apply("browser.yaml")
	apply("python-agent.yaml")
	for name, want := range map[string][]string{
		"browser":      {"== https://" + gwAllowA + "/guide\nsite=" + gwAllowA + " path=/guide", "== https://" + gwAllowB + "/\nERR_"},
		"python-agent": {"installed ['abxdemo']", "pypi.org refused"},
	} {
		p := k.waitPod(t, ns, name, 4*time.Minute, "terminated", terminated)
		logs := k.mustKubectl(t, "-n", ns, "logs", name)
		for _, w := range want {
			if !strings.Contains(logs, w) {
				t.Errorf("%s: lacks %q (exit %d):\n%s", name, w, p.Status.ContainerStatuses[0].State.Terminated.ExitCode, clip(logs))
			}
		}
	}
}
