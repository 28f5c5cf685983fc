package ingest

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// keptBuffer is how much of a session's buffer stays resident after a
// large message: most of gVisor's messages are a few hundred bytes.
const keptBuffer = 64 << 10

// sessionBuffer is a session's receive buffer, MaxMessageSize+1 bytes
// mapped outside Go's heap. Taken from the heap, the 1 MiB counted as
// live for every sandbox's whole life and so raised the garbage collector's
// goal for the rest of the shim's heap by as much again; mapped, only the
// pages a message touched are resident, and release returns what a large
// message touched beyond keptBuffer. Nothing may keep a slice of it past
// the message it was read for (Process copies what it keeps).
type sessionBuffer struct{ b []byte }

func newSessionBuffer() (*sessionBuffer, error) {
	b, err := unix.Mmap(-1, 0, MaxMessageSize+1, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("session buffer: %w", err)
	}
	return &sessionBuffer{b: b}, nil
}

// release gives the pages beyond keptBuffer back to the kernel once a
// message of n bytes has been handled.
func (s *sessionBuffer) release(n int) {
	if n > keptBuffer {
		_ = unix.Madvise(s.b[keptBuffer:], unix.MADV_DONTNEED)
	}
}

func (s *sessionBuffer) free() { _ = unix.Munmap(s.b) }
