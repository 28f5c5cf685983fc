package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/control"
)

// The sandbox commands find a sandbox by id prefix or pod, send the
// request and print what the shim answered; a failed request exits
// non-zero with the shim's reason.
func TestSandboxCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	var got []control.Request
	sb := &control.Sandbox{ID: "4f2a9c0e11d2aaaa", Namespace: "k8s.io", Pod: "agents/coder-1", Role: "coder", StartDigest: "sha256:0123456789abcdef",
		LiveDigest: "sha256:0123456789abcdef", Egress: "allowlist", EgressNow: "allowlist", State: "running", Trail: "/var/log/agentbox/audit/4f2a.jsonl",
		Started: time.Now()}
	srv, err := control.Listen(control.SocketPath(dir, "c", sb.ID), uint32(os.Geteuid()), func(_ context.Context, _ control.Peer, req control.Request) control.Response {
		got = append(got, req)
		switch req.Op {
		case control.OpQuarantine:
			sb.Quarantined, sb.EgressNow = true, "none (quarantined)"
			return control.Response{OK: true, Message: "quarantined", Sandbox: sb}
		case control.OpThaw:
			return control.Response{Error: "the sandbox is not frozen", Sandbox: sb}
		}
		return control.Response{OK: true, Sandbox: sb}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	out, _, err := run(t, "sandbox", "list", "--control-dir", dir)
	if err != nil || !strings.Contains(out, "4f2a9c0e11d2  agents/coder-1  coder  0123456789ab") || !strings.Contains(out, "running") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	out, _, err = run(t, "sandbox", "quarantine", "--control-dir", dir, "--pod", "agents/coder-1", "--reason", "exfiltration")
	if err != nil || !strings.Contains(out, "sandbox 4f2a9c0e11d2aaaa: quarantined") {
		t.Fatalf("quarantine: %v\n%s", err, out)
	}
	out, _, _ = run(t, "sandbox", "list", "--control-dir", dir)
	if !strings.Contains(out, "allowlist -> none (quarantined)") || !strings.Contains(out, "running, quarantined") {
		t.Fatalf("list after quarantine:\n%s", out)
	}
	if _, _, err := run(t, "sandbox", "quarantine", "--control-dir", dir, "--release", "4f2a"); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, _, err := run(t, "sandbox", "thaw", "--control-dir", dir, "4f2a"); err == nil || !strings.Contains(err.Error(), "not frozen") {
		t.Fatalf("thaw: %v", err)
	}
	if _, _, err := run(t, "sandbox", "stop", "--control-dir", dir, "4f2a"); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("stop without a reason: %v", err)
	}
	if _, _, err := run(t, "sandbox", "stop", "--control-dir", dir, "--reason", "x", "ffff"); err == nil || !strings.Contains(err.Error(), "no running sandbox") {
		t.Fatalf("stop of an unknown sandbox: %v", err)
	}
	var ops []string
	for _, r := range got {
		ops = append(ops, r.Op+":"+r.Reason)
	}
	if want := "info:,info:,quarantine:exfiltration,info:,info:,release:,info:,thaw:,info:"; strings.Join(ops, ",") != want {
		t.Fatalf("requests %v, want %s", ops, want)
	}
}
