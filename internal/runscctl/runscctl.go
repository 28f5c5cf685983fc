// Package runscctl addresses a runsc sandbox's control socket, which the
// shim calls directly (its stats, port-forward) instead of starting runsc
// for each call.
package runscctl

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MaxSocketPath is the longest path a unix socket can be dialed at
// (sun_path's 108 bytes, less its terminating NUL); a longer one is
// dialed through /proc/self/fd, as runsc does.
const MaxSocketPath = 107

// Socket is the control socket of sandbox id under runsc root root (its
// containerd namespace's).
func Socket(root, id string) string { return filepath.Join(root, "runsc-"+id+".sock") }

// Dialable is path as a unix socket can be dialed at: itself, or when it
// is longer than MaxSocketPath, /proc/self/fd/N of an O_PATH descriptor
// that done closes (call it once dialed).
func Dialable(path string) (dialable string, done func(), err error) {
	if len(path) <= MaxSocketPath {
		return path, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd), func() { unix.Close(fd) }, nil
}
