package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Budget bounds what one sandbox's trail may take of the audit filesystem,
// so that one sandbox's volume never costs another its records:
//
//   - MaxBytes is the trail's own quota (all its segments);
//   - MinFree is space the trail leaves free on the filesystem, for other
//     sandboxes' trails and for new sandboxes' reserves;
//   - Reserve is preallocated (fallocate) when the trail starts, for the
//     trail's own records (the shim's decisions, gaps, limits, the end
//     record): they are written from it when the quota or the filesystem
//     is full, so they always fit. A trail whose reserve cannot be
//     allocated does not start.
//
// Records from the sandbox that do not fit are not dropped: the trail
// holds them and stops taking more (back-pressure; see Trail).
type Budget struct {
	MaxBytes int64
	MinFree  int64
	Reserve  int64
}

// FullError says why a batch of the sandbox's records cannot be written now.
type FullError struct{ Reason string }

func (e *FullError) Error() string { return "audit trail full: " + e.Reason }

// freeBytes is the space an unprivileged writer may still use on the
// filesystem holding dir.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// SetBudget applies b to the sink and allocates its reserve. It fails when
// the filesystem cannot hold the reserve beyond b.MinFree.
func (s *FileSink) SetBudget(b Budget) error {
	s.budget = b
	if b.Reserve <= 0 {
		return nil
	}
	free, err := freeBytes(s.dir)
	if err != nil {
		return fmt.Errorf("audit filesystem: %w", err)
	}
	if free-b.Reserve < b.MinFree {
		return fmt.Errorf("audit filesystem of %s has %d bytes free: a trail needs a %d-byte reserve beyond the %d kept free (audit.min_free_bytes)", s.dir, free, b.Reserve, b.MinFree)
	}
	path := filepath.Join(s.dir, s.sandbox+".reserve")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("audit reserve: %w", err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, b.Reserve); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("audit reserve of %d bytes: %w", b.Reserve, err)
	}
	s.reserve, s.reserveLeft = f, b.Reserve
	return nil
}

// admit says whether a batch of n bytes fits the budget, or why not.
func (s *FileSink) admit(n int64) error {
	if s.budget.MaxBytes > 0 && s.total+n > s.budget.MaxBytes {
		return &FullError{Reason: fmt.Sprintf("the sandbox's quota: %d of %d bytes used (audit.max_sandbox_bytes)", s.total, s.budget.MaxBytes)}
	}
	if s.budget.MinFree > 0 {
		free, err := freeBytes(s.dir)
		if err != nil {
			return err
		}
		if free-n < s.budget.MinFree {
			return &FullError{Reason: fmt.Sprintf("the audit filesystem: %d bytes free, %d kept free for other sandboxes (audit.min_free_bytes)", free, s.budget.MinFree)}
		}
	}
	return nil
}

// takeReserve frees n bytes of the reserve for a write of the trail's own.
func (s *FileSink) takeReserve(n int64) error {
	if s.reserve == nil || n > s.reserveLeft {
		return &FullError{Reason: fmt.Sprintf("the trail's reserve: %d bytes left, %d needed", s.reserveLeft, n)}
	}
	if err := s.reserve.Truncate(s.reserveLeft - n); err != nil {
		return err
	}
	s.reserveLeft -= n
	return nil
}

// ReserveLeft is what remains of the reserve.
func (s *FileSink) ReserveLeft() int64 { return s.reserveLeft }

func (s *FileSink) closeReserve() {
	if s.reserve != nil {
		s.reserve.Close()
		os.Remove(s.reserve.Name())
		s.reserve = nil
	}
}

// IsFull reports whether err is a FullError.
func IsFull(err error) bool {
	var f *FullError
	return errors.As(err, &f)
}
