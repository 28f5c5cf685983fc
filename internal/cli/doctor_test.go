package cli

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestReport(t *testing.T) {
	var b bytes.Buffer
	err := report(&b, []check{{name: "runsc", detail: "/x (static)"}, {name: "nftables", err: errors.New("nft: not found")}})
	if err == nil || !strings.Contains(err.Error(), "1 of 2 checks failed") {
		t.Fatalf("want failure, got %v", err)
	}
	want := "PASS  runsc        /x (static)\nFAIL  nftables     nft: not found\n"
	if b.String() != want {
		t.Fatalf("got %q want %q", b.String(), want)
	}
	b.Reset()
	if err := report(&b, []check{{name: "a", detail: "ok"}}); err != nil {
		t.Fatal(err)
	}
}

func TestRequireStatic(t *testing.T) {
	// The test binary itself is dynamically linked when cgo is on, static
	// otherwise; /bin/sh on Debian is always dynamic.
	if err := requireStatic("/bin/sh"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("/bin/sh: want 'dynamically linked', got %v", err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if err := requireStatic(notELF); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Fatalf("script: %v", err)
	}
	if _, err := os.Stat("/bin/busybox"); err == nil {
		if err := requireStatic("/bin/busybox"); err != nil {
			t.Fatalf("busybox-static: %v", err)
		}
	}
}

func TestCgroupMode(t *testing.T) {
	mk := func(paths ...string) string {
		root := t.TempDir()
		for _, p := range paths {
			os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
			os.WriteFile(filepath.Join(root, p), nil, 0o644)
		}
		return root
	}
	cases := []struct {
		root, want string
	}{
		{mk("cgroup.controllers"), "v2 (unified)"},
		{mk("memory/tasks", "unified/cgroup.controllers"), "v1 + v2 hybrid"},
		{mk("memory/tasks"), "v1 (legacy)"},
	}
	for _, tc := range cases {
		if got, err := cgroupMode(tc.root); err != nil || got != tc.want {
			t.Errorf("got %q %v, want %q", got, err, tc.want)
		}
	}
	if _, err := cgroupMode(mk()); err == nil {
		t.Error("empty dir: want error")
	}
}

// TestNftablesCheck loads the shim's ruleset shape on this machine, which
// must take it (CI runs the e2e suite here).
func TestNftablesCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a scratch network namespace")
	}
	for _, tool := range []string{"nft", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	c := checkNftables()
	if c.err != nil || !strings.Contains(c.detail, "egress ruleset loads") {
		t.Fatalf("%v", c)
	}
	if rs := sampleRuleset(); !strings.Contains(rs, "log prefix") || !strings.Contains(rs, "counter drop") {
		t.Errorf("the sample must have what the shim loads:\n%s", rs)
	}
}

// containerd 1.7 leaves runtime_handlers empty: the handlers come from the
// CRI config in the verbose status.
func TestHandlerNamesFromContainerd17(t *testing.T) {
	st := &runtimeapi.StatusResponse{Info: map[string]string{"config": `{"containerd":{"runtimes":{"runc":{},"agentbox":{"runtimeType":"io.containerd.agentbox.v1"}}}}`}}
	if got := handlerNames(st); len(got) != 2 || got[0] != "agentbox" || got[1] != "runc" {
		t.Fatalf("handlers %v", got)
	}
	st = &runtimeapi.StatusResponse{RuntimeHandlers: []*runtimeapi.RuntimeHandler{{Name: "agentbox"}}}
	if got := handlerNames(st); len(got) != 1 || got[0] != "agentbox" {
		t.Fatalf("handlers %v", got)
	}
}
