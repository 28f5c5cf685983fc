package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/checkpoint"
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

// checkpoints lists the node's images, each checked as a restore would
// check it, and removes one by name (never by path).
func TestCheckpointsCommand(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.toml")
	store := filepath.Join(dir, "store")
	os.WriteFile(cfgPath, []byte("version = 1\n[checkpoint]\ndir = \""+store+"\"\nkey_file = \""+filepath.Join(dir, "node.key")+"\"\n"), 0o600)
	st, err := checkpoint.OpenStore(store, filepath.Join(dir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	tmp, _ := st.Begin("cp1")
	os.WriteFile(filepath.Join(tmp, "pages.img"), []byte("pages"), 0o600)
	if _, err := st.Commit(tmp, &checkpoint.Manifest{Name: "cp1", SandboxID: "4f2a9c0e11d2aaaa", Role: "coder", Suspended: true}); err != nil {
		t.Fatal(err)
	}
	out, _, err := run(t, "sandbox", "checkpoints", "--config", cfgPath)
	if err != nil || !strings.Contains(out, "cp1") || !strings.Contains(out, "coder") || !strings.Contains(out, "ok") {
		t.Fatalf("checkpoints: %v\n%s", err, out)
	}
	os.WriteFile(filepath.Join(store, "cp1", "pages.img"), []byte("pagez"), 0o600)
	if out, _, _ := run(t, "sandbox", "checkpoints", "--config", cfgPath); !strings.Contains(out, "does not match its manifest") {
		t.Fatalf("an altered image is listed as:\n%s", out)
	}
	if _, _, err := run(t, "sandbox", "checkpoints", "--config", cfgPath, "--remove", "../store"); err == nil {
		t.Fatal("a path was removed")
	}
	if out, _, err := run(t, "sandbox", "checkpoints", "--config", cfgPath, "--remove", "cp1"); err != nil || !strings.Contains(out, "removed") {
		t.Fatalf("remove: %v %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(store, "cp1")); !os.IsNotExist(err) {
		t.Fatalf("cp1 is still there: %v", err)
	}
}
