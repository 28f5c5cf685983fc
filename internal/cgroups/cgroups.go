// Package cgroups removes a container's cgroup directories after a sandbox
// that failed to start (runsc does not clean up after itself then, and a
// later container with the same id would inherit the stale limits), and
// reads what a sandbox's cgroup used before it goes, and puts a waiting
// sandbox's cgroup in the idle CPU class.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Root is where cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Remove deletes the cgroup at path (an OCI linux.cgroupsPath in cgroupfs
// form, like /default/ID) and its children from every hierarchy mounted
// below root: each v1 controller and the v2 tree. A missing directory is
// not an error; a cgroup that still holds processes stays and is reported.
// systemd-style paths ("slice:prefix:name") are left to systemd.
func Remove(root, path string) error {
	if path == "" || strings.Contains(path, ":") {
		return nil
	}
	clean := filepath.Clean("/" + path)
	if clean == "/" {
		return fmt.Errorf("refusing to remove the root cgroup")
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	seen := map[string]bool{}
	for _, e := range entries {
		h := filepath.Join(root, e.Name())
		if real, err := filepath.EvalSymlinks(h); err == nil {
			if seen[real] {
				continue
			}
			seen[real] = true
			h = real
		}
		if st, err := os.Stat(h); err != nil || !st.IsDir() {
			continue
		}
		if err := removeTree(filepath.Join(h, clean)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeTree removes a cgroup directory, children first. Only directories
// are removed: a cgroup's files go with its rmdir.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// Usage is what a cgroup used over its life: its peak memory and its CPU
// time.
type Usage struct {
	MemoryPeak int64 // bytes
	CPU        time.Duration
}

// ReadUsage reads the usage of the cgroup at path (cgroupfs form) below
// root: cgroup v1's memory.max_usage_in_bytes and cpuacct.usage, or v2's
// memory.peak and cpu.stat usage_usec. ok is false when neither could be
// read: a systemd-style path, a cgroup already removed, a kernel without
// memory.peak.
func ReadUsage(root, path string) (u Usage, ok bool) {
	dir, ok := cleanPath(path)
	if !ok {
		return u, false
	}
	var gotMem, gotCPU bool
	// v1: the memory hierarchy; v2: the unified tree (at root, or at
	// root/unified on a hybrid host).
	if n, ok := readInt(filepath.Join(root, "memory", dir, "memory.max_usage_in_bytes")); ok {
		u.MemoryPeak, gotMem = n, true
	}
	for _, uroot := range []string{root, filepath.Join(root, "unified")} {
		if n, ok := readInt(filepath.Join(uroot, dir, "memory.peak")); ok && !gotMem {
			u.MemoryPeak, gotMem = n, true
		}
	}
	u.CPU, gotCPU = readCPU(root, dir)
	return u, gotMem || gotCPU
}

// ReadCPU reads the CPU time the cgroup at path (cgroupfs form) below
// root has used: cgroup v1's cpuacct.usage, or v2's cpu.stat usage_usec.
// ok is false when it could not be read.
func ReadCPU(root, path string) (time.Duration, bool) {
	dir, ok := cleanPath(path)
	if !ok {
		return 0, false
	}
	return readCPU(root, dir)
}

func readCPU(root, dir string) (time.Duration, bool) {
	// v1: cpuacct may be mounted with cpu, as cpu,cpuacct.
	for _, h := range []string{"cpuacct", "cpu,cpuacct"} {
		if n, ok := readInt(filepath.Join(root, h, dir, "cpuacct.usage")); ok {
			return time.Duration(n), true
		}
	}
	for _, uroot := range []string{root, filepath.Join(root, "unified")} {
		b, err := os.ReadFile(filepath.Join(uroot, dir, "cpu.stat"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, found := strings.CutPrefix(l, "usage_usec "); found {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return time.Duration(n) * time.Microsecond, true
				}
			}
		}
	}
	return 0, false
}

// cleanPath is path (cgroupfs form) made absolute and clean; ok is false
// for a systemd-style path ("slice:prefix:name") or the root itself.
func cleanPath(path string) (string, bool) {
	if path == "" || strings.Contains(path, ":") {
		return "", false
	}
	clean := filepath.Clean("/" + path)
	return clean, clean != "/"
}

func readInt(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}
