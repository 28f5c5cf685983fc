package cli

import (
	"bytes"
	"encoding/json"
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
