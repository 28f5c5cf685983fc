package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	app := App()
	var out, errb bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errb
	app.ExitErrHandler = func(*cli.Context, error) {}
	err := app.Run(append([]string{"agentbox"}, args...))
	return out.String(), errb.String(), err
}

func TestPolicyValidate(t *testing.T) {
	out, _, err := run(t, "policy", "validate", "../../policies")
	if err != nil || !strings.Contains(out, "ok: 3 role(s), 3 binding(s) in 4 file(s)") {
		t.Fatalf("shipped policies: %q %v", out, err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: a}\nspec:\n  limits: {memory: lots}\n  filesystem: {rootfs: rw}\n"), 0o644)
	_, stderr, err := run(t, "policy", "validate", dir)
	if err == nil || !strings.Contains(err.Error(), "2 problem(s) found") {
		t.Fatalf("want failure with count, got %v", err)
	}
	for _, w := range []string{"a.yaml:6: spec.filesystem.rootfs", "a.yaml:5: spec.limits.memory"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if _, _, err := run(t, "policy", "validate"); err == nil {
		t.Error("no paths: want usage error")
	}
}

func TestPolicyExplain(t *testing.T) {
	out, _, err := run(t, "policy", "explain", "--policy-dir", "../../policies", "--role", "coder", "--namespace", "agents", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Profile struct {
			Role   string `json:"role"`
			Digest string `json:"digest"`
		} `json:"profile"`
		RunscFlags map[string]string `json:"runscFlags"`
		Spec       struct {
			Root struct {
				Readonly bool `json:"readonly"`
			} `json:"root"`
			Process struct {
				Env []string `json:"env"`
			} `json:"process"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if ex.Profile.Role != "coder" || !strings.HasPrefix(ex.Profile.Digest, "sha256:") || !ex.Spec.Root.Readonly || ex.RunscFlags["network"] != "" || ex.RunscFlags["oci-seccomp"] != "true" {
		t.Fatalf("explain json: %+v", ex)
	}
	for _, kv := range ex.Spec.Process.Env {
		if strings.HasPrefix(kv, "AWS_SECRET") {
			t.Fatalf("sample secret survived: %v", ex.Spec.Process.Env)
		}
	}
	text, _, err := run(t, "policy", "explain", "--policy-dir", "../../policies", "--role", "coder", "--namespace", "agents")
	if err != nil || !strings.Contains(text, "role coder (chain coder -> baseline)") || !strings.Contains(text, "--oci-seccomp=true") || !strings.Contains(text, "metadata addresses denied") {
		t.Fatalf("explain text: %v\n%s", err, text)
	}
	if _, _, err := run(t, "policy", "explain", "--policy-dir", "../../policies", "--role", "coder", "--namespace", "default"); err == nil || !strings.Contains(err.Error(), "not bound") {
		t.Fatalf("unbound: %v", err)
	}
}

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestPolicyExplainPod: explain with a Pod manifest as input shows what
// each container asks for and gets under its role, or the refusal naming
// the field (testdata/pod-*.yaml against testdata/*.golden).
func TestPolicyExplainPod(t *testing.T) {
	for _, c := range []struct {
		pod     string
		refused int // containers that would not start
	}{
		{"restricted", 0},
		{"asks-nothing", 0},
		{"asks-too-much", 2},
	} {
		t.Run(c.pod, func(t *testing.T) {
			out, stderr, err := run(t, "policy", "explain", "--config", "testdata/shim.toml", "--policy-dir", "../../policies", "--pod", "testdata/pod-"+c.pod+".yaml")
			if c.refused == 0 && err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			if c.refused > 0 && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d of ", c.refused))) {
				t.Fatalf("want %d refused, got %v", c.refused, err)
			}
			golden := filepath.Join("testdata", "explain-pod-"+c.pod+".golden")
			if *update {
				os.WriteFile(golden, []byte(out), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update)", err)
			}
			if string(want) != out {
				t.Fatalf("differs from %s (go test -update to accept):\n%s", golden, out)
			}
		})
	}
	// What the golden files say, asserted directly, so that a careless
	// -update cannot bless a regression.
	out, _, err := run(t, "policy", "explain", "--config", "testdata/shim.toml", "--policy-dir", "../../policies", "--pod", "testdata/pod-restricted.yaml", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Pod struct {
			Containers []struct {
				Name    string `json:"name"`
				Refused string `json:"refused"`
				Spec    struct {
					Root    struct{ Readonly bool } `json:"root"`
					Process struct {
						User struct {
							UID, GID       uint32
							AdditionalGids []uint32
						}
						Capabilities    map[string][]string `json:"capabilities"`
						NoNewPrivileges bool                `json:"noNewPrivileges"`
					} `json:"process"`
					Linux struct {
						Seccomp struct {
							DefaultAction string `json:"defaultAction"`
						} `json:"seccomp"`
					} `json:"linux"`
				} `json:"spec"`
			} `json:"containers"`
		} `json:"pod"`
	}
	if err := json.Unmarshal([]byte(out), &ex); err != nil || len(ex.Pod.Containers) != 1 {
		t.Fatalf("%v\n%s", err, out)
	}
	s := ex.Pod.Containers[0].Spec
	u := s.Process.User
	if u.UID != 1000 || u.GID != 1000 || fmt.Sprint(u.AdditionalGids) != "[1000 2000]" || !s.Process.NoNewPrivileges || !s.Root.Readonly || s.Linux.Seccomp.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("restricted pod under baseline: %+v", s)
	}
	for set, caps := range s.Process.Capabilities {
		if len(caps) != 0 {
			t.Errorf("capabilities %s: %v, want none", set, caps)
		}
	}
	out, _, _ = run(t, "policy", "explain", "--config", "testdata/shim.toml", "--policy-dir", "../../policies", "--pod", "testdata/pod-asks-too-much.yaml")
	for _, want := range []string{"REFUSED: process.capabilities: CAP_NET_ADMIN not granted", "REFUSED: host options refused: linux.resources.devices[0]"} {
		if !strings.Contains(out, want) {
			t.Errorf("asks-too-much: no %q in\n%s", want, out)
		}
	}
	// Input explain does not understand is an error naming the field.
	dir := t.TempDir()
	for name, pod := range map[string]string{
		"spec.containers[0].securityContext.runAsUsr: unknown field": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    securityContext: {runAsUsr: 1000}\n",
		"spec.securityContext.seccompProfile.type \"Bogus\"":         "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {seccompProfile: {type: Bogus}}\n  containers:\n  - name: c\n",
		"want a v1 Pod": "apiVersion: apps/v1\nkind: Deployment\n",
		"spec.volumes[0] (v): a volume type explain does not model": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  volumes: [{name: v, nfs: {server: x}}]\n  containers:\n  - name: c\n",
	} {
		f := filepath.Join(dir, "pod.yaml")
		os.WriteFile(f, []byte(pod), 0o644)
		out, _, err := run(t, "policy", "explain", "--config", "testdata/shim.toml", "--policy-dir", "../../policies", "--pod", f)
		if err == nil || !strings.Contains(err.Error()+out, name) {
			t.Errorf("want %q, got %v\n%s", name, err, out)
		}
	}
	if _, _, err := run(t, "policy", "explain", "--policy-dir", "../../policies", "--pod", "testdata/pod-restricted.yaml", "--role", "coder"); err == nil {
		t.Error("--role with --pod: want a usage error")
	}
}

// TestPolicyExplainSecrets: explain says which secrets reach the agent and
// which the gateway holds.
func TestPolicyExplainSecrets(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: r}
spec:
  network:
    egress: allowlist
    allow:
      - {host: api.github.com, ports: [443]}
      - {host: api.openai.com, ports: [443], http: {methods: [POST], paths: ["/v1/*"]}}
  credentials:
    secrets:
      - {env: NPM_TOKEN, file: /s/npm}
      - {env: GITHUB_TOKEN, file: /s/gh, inject: {host: api.github.com, header: Authorization, format: "Bearer {secret}"}}
      - {file: /s/oai, inject: {host: api.openai.com, header: Authorization, format: "Bearer {secret}"}}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: r}
spec: {role: r, subjects: [{namespace: a}]}
`), 0o644)
	out, _, err := run(t, "policy", "explain", "--policy-dir", dir, "--role", "r", "--namespace", "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"NPM_TOKEN <- /s/npm (REACHES THE AGENT",
		`/s/gh: the gateway sets Authorization: "Bearer {secret}" on requests to api.github.com over TLS (the sandbox's GITHUB_TOKEN holds a placeholder`,
		"/s/oai: the gateway sets Authorization", "api.openai.com over TLS (never in the sandbox)",
		"api.openai.com ports [443] (TLS terminated: methods [POST], paths [/v1/*])",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("explain lacks %q:\n%s", w, out)
		}
	}
}

// A role with a model host says so, with its budget and what its model
// calls' records keep.
func TestPolicyExplainModelHost(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"baseline.yaml", "coder.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../policies", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "claude.yaml"), []byte(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: claude-coder}
spec:
  inherits: coder
  network:
    egress: allowlist
    allow:
      - {host: api.anthropic.com, ports: [443], api: anthropic}
  limits:
    model: {tokens: 2000000, perMinute: {requests: 30}}
  audit: {model: content}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: claude-coder}
spec:
  role: claude-coder
  subjects: [{namespace: agents}]
`), 0o644)
	out, stderr, err := run(t, "policy", "explain", "--policy-dir", dir, "--role", "claude-coder", "--namespace", "agents")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"api.anthropic.com ports [443] (model host, anthropic API: TLS terminated, each call recorded)",
		"model budget 2000000 tokens, 30 calls a minute", "audit:       model calls keep content (audit.model)"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
}
