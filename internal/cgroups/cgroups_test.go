package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// A plain directory tree stands in for cgroupfs: SetIdle writes the first
// cpu.idle it finds, v1's cpu hierarchy before the v2 tree.
func TestSetIdle(t *testing.T) {
	root := tree(t, map[string]string{"cpu/kubepods/pod1/cpu.idle": "0", "kubepods/pod2/cpu.idle": "0"})
	for _, c := range []struct {
		path, file string
		idle       bool
		want       string
	}{
		{"/kubepods/pod1", "cpu/kubepods/pod1/cpu.idle", true, "1"},
		{"kubepods/pod1", "cpu/kubepods/pod1/cpu.idle", false, "0"},
		{"/kubepods/pod2", "kubepods/pod2/cpu.idle", true, "1"},
	} {
		f, err := SetIdle(root, c.path, c.idle)
		if err != nil || f != filepath.Join(root, c.file) {
			t.Fatalf("%s: %q, %v", c.path, f, err)
		}
		if b, _ := os.ReadFile(f); string(b) != c.want {
			t.Errorf("%s: cpu.idle %q, want %q", c.path, b, c.want)
		}
	}
	if _, err := SetIdle(root, "/kubepods/pod3", true); !errors.Is(err, ErrNoIdle) {
		t.Errorf("a cgroup without cpu.idle: %v", err)
	}
	for _, p := range []string{"", "/", "..", "kubepods.slice:cri:pod1"} {
		if _, err := SetIdle(root, p, true); err == nil {
			t.Errorf("%q: not refused", p)
		}
	}
}

// Quotas read and written in v1's two files and v2's cpu.max.
func TestQuota(t *testing.T) {
	root := tree(t, map[string]string{"cpu/pods/p1/cpu.cfs_quota_us": "-1", "cpu/pods/p1/cpu.cfs_period_us": "100000", "pods/p2/cpu.max": "max 100000", "pods/p3/cpu.max": "bad"})
	for _, c := range []struct{ path, file, want string }{
		{"/pods/p1", "cpu/pods/p1/cpu.cfs_quota_us", "5000"},
		{"/pods/p2", "pods/p2/cpu.max", "5000 100000"},
	} {
		q, err := ReadQuota(root, c.path)
		if err != nil || q != (Quota{-1, 100000}) || q.Millis() != 0 {
			t.Fatalf("%s: %+v, %v", c.path, q, err)
		}
		if err := SetQuota(root, c.path, Quota{5000, 100000}); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(root, c.file)); string(b) != c.want {
			t.Errorf("%s: %q, want %q", c.file, b, c.want)
		}
		if q, err := ReadQuota(root, c.path); err != nil || q.Millis() != 50 {
			t.Errorf("%s: read back %+v (%d millis), %v", c.path, q, q.Millis(), err)
		}
		if err := SetQuota(root, c.path, Quota{-1, 100000}); err != nil {
			t.Fatal(err)
		}
		if q, _ := ReadQuota(root, c.path); q.Quota != -1 {
			t.Errorf("%s: unbounded again: %+v", c.path, q)
		}
	}
	for _, p := range []string{"/pods/p3", "/pods/none", "/"} {
		if _, err := ReadQuota(root, p); err == nil {
			t.Errorf("%s: read", p)
		}
		if err := SetQuota(root, p, Quota{1, 1}); err == nil && p != "/pods/p3" {
			t.Errorf("%s: written", p)
		}
	}
}

// Lower lowers and never raises, in v1's files and v2's.
func TestLower(t *testing.T) {
	root := tree(t, map[string]string{
		"memory/pods/p1/memory.limit_in_bytes": "9223372036854771712", "cpu/pods/p1/cpu.cfs_quota_us": "-1", "cpu/pods/p1/cpu.cfs_period_us": "100000",
		"memory/pods/p2/memory.limit_in_bytes": "1048576", "cpu/pods/p2/cpu.cfs_quota_us": "50000", "cpu/pods/p2/cpu.cfs_period_us": "100000",
		"pods/p3/memory.max": "max", "pods/p3/cpu.max": "max 100000",
	})
	for _, c := range []struct {
		path string
		did  string
		want map[string]string
	}{
		{"/pods/p1", "memory 536870912; cpu 100000/100000", map[string]string{"memory/pods/p1/memory.limit_in_bytes": "536870912", "cpu/pods/p1/cpu.cfs_quota_us": "100000"}},
		{"/pods/p2", "", map[string]string{"memory/pods/p2/memory.limit_in_bytes": "1048576", "cpu/pods/p2/cpu.cfs_quota_us": "50000"}},
		{"/pods/p3", "memory 536870912; cpu 100000/100000", map[string]string{"pods/p3/memory.max": "536870912", "pods/p3/cpu.max": "100000 100000"}},
	} {
		did, err := Lower(root, c.path, 512<<20, Quota{Quota: 200000, Period: 200000})
		if err != nil || strings.Join(did, "; ") != c.did {
			t.Errorf("%s: %q, %v", c.path, did, err)
		}
		for f, v := range c.want {
			if b, _ := os.ReadFile(filepath.Join(root, f)); string(b) != v {
				t.Errorf("%s: %q, want %q", f, b, v)
			}
		}
	}
	if did, err := Lower(root, "/pods/p1", 0, Quota{}); err != nil || len(did) != 0 {
		t.Errorf("nothing to lower: %q, %v", did, err)
	}
	if _, err := Lower(root, "/pods/none", 1, Quota{}); err == nil {
		t.Error("a missing cgroup: no error")
	}
}

// tree is a plain directory tree standing in for cgroupfs: each file of
// files (a path below the root) with its content.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for f, v := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
