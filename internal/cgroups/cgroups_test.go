package cgroups

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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

func TestReadUsage(t *testing.T) {
	write := func(root, rel, content string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o644)
	}
	v1 := t.TempDir()
	write(v1, "memory/pods/sb/memory.max_usage_in_bytes", "268435456\n")
	write(v1, "cpu,cpuacct/pods/sb/cpuacct.usage", "1500000000\n")
	if u, ok := ReadUsage(v1, "/pods/sb"); !ok || u.MemoryPeak != 256<<20 || u.CPU != 1500*time.Millisecond {
		t.Errorf("v1: %+v %v", u, ok)
	}
	v2 := t.TempDir()
	write(v2, "pods/sb/memory.peak", "1048576\n")
	write(v2, "pods/sb/cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n")
	if u, ok := ReadUsage(v2, "pods/sb"); !ok || u.MemoryPeak != 1<<20 || u.CPU != 2500*time.Millisecond {
		t.Errorf("v2: %+v %v", u, ok)
	}
	hybrid := t.TempDir()
	write(hybrid, "unified/pods/sb/cpu.stat", "usage_usec 10\n")
	if u, ok := ReadUsage(hybrid, "/pods/sb"); !ok || u.CPU != 10*time.Microsecond || u.MemoryPeak != 0 {
		t.Errorf("hybrid: %+v %v", u, ok)
	}
	for _, p := range []string{"", "/", "kubepods.slice:cri-containerd:abc", "/gone"} {
		if u, ok := ReadUsage(v1, p); ok {
			t.Errorf("%q: %+v", p, u)
		}
		if c, ok := ReadCPU(v1, p); ok {
			t.Errorf("ReadCPU %q: %v", p, c)
		}
	}
	if c, ok := ReadCPU(v1, "pods/sb"); !ok || c != 1500*time.Millisecond {
		t.Errorf("ReadCPU v1: %v %v", c, ok)
	}
	if c, ok := ReadCPU(v2, "/pods/sb"); !ok || c != 2500*time.Millisecond {
		t.Errorf("ReadCPU v2: %v %v", c, ok)
	}
}
