// Package cgroups removes a container's cgroup directories after a sandbox
// that failed to start (runsc does not clean up after itself then, and a
// later container with the same id would inherit the stale limits).
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
