package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memDir is the directory of the cgroup at path in cgroup v1's memory
// hierarchy or the v2 tree, and whether it is v2's.
func memDir(root, path string) (string, bool, error) {
	dir, ok := cleanPath(path)
	if !ok {
		return "", false, fmt.Errorf("cgroup %q: not a cgroupfs path below the root", path)
	}
	for _, c := range []struct {
		h, file string
		v2      bool
	}{{"memory", "memory.limit_in_bytes", false}, {"", "memory.max", true}, {"unified", "memory.max", true}} {
		d := filepath.Join(root, c.h, dir)
		if _, err := os.Stat(filepath.Join(d, c.file)); err == nil {
			return d, c.v2, nil
		}
	}
	return "", false, fmt.Errorf("cgroup %s: no memory limit file", dir)
}

// OOMKills is how many times the kernel's OOM killer killed a process of
// the cgroup at path (cgroupfs form) below root: the oom_kill line of v1's
// memory.oom_control (kernel 4.13 and later) or v2's memory.events.
func OOMKills(root, path string) (uint64, error) {
	d, v2, err := memDir(root, path)
	if err != nil {
		return 0, err
	}
	f := filepath.Join(d, "memory.oom_control")
	if v2 {
		f = filepath.Join(d, "memory.events")
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == "oom_kill" {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: oom_kill %q: %w", f, v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s: no oom_kill line", f)
}
