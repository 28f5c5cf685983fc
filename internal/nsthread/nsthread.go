// Package nsthread runs code on an OS thread in another network namespace,
// the way sockets get made in a namespace the process does not live in.
package nsthread

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs f on a locked OS thread that enter moved into another network
// namespace, then moves the thread back. If it cannot go back, the thread
// stays locked and dies with its goroutine, so no other goroutine ever
// runs in the wrong namespace.
func Run(enter, f func() error) (err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, oerr := os.Open("/proc/thread-self/ns/net")
		if oerr != nil {
			runtime.UnlockOSThread()
			err = oerr
			return
		}
		defer orig.Close()
		if err = enter(); err != nil {
			runtime.UnlockOSThread()
			return
		}
		err = f()
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			err = errors.Join(err, fmt.Errorf("return to the process's namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
	return err
}

// Fd enters the namespace fd refers to.
func Fd(fd int) func() error {
	return func() error { return unix.Setns(fd, unix.CLONE_NEWNET) }
}

// Path enters the namespace at path (/var/run/netns/NAME, /proc/PID/ns/net).
func Path(path string) func() error {
	return func() error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
	}
}

// New enters a new, empty namespace.
func New() error { return unix.Unshare(unix.CLONE_NEWNET) }
