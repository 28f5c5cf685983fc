package cgroups

import (
	"os"
	"path/filepath"
	"testing"
)

// A plain directory tree stands in for cgroupfs: Remove only rmdirs.
func TestRemove(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"memory/default/c1/child", "pids/default/c1", "unified/default/c1", "memory/default/other"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Symlink("memory", filepath.Join(root, "memory,alias"))
	if err := Remove(root, "/default/c1"); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"memory/default/c1", "pids/default/c1", "unified/default/c1"} {
		if _, err := os.Stat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still there", gone)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "memory/default/other")); err != nil {
		t.Error("a sibling cgroup was removed")
	}
	if err := Remove(root, "/default/missing"); err != nil {
		t.Errorf("missing cgroup: %v", err)
	}
	for _, p := range []string{"", "/", "system.slice:agentbox:c1"} {
		if err := Remove(root, p); p == "/" && err == nil {
			t.Error("removing the root cgroup must be refused")
		} else if p != "/" && err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
}
