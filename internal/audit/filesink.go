package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// FileSink writes one sandbox's trail to DIR/SANDBOX.jsonl, rotating it to
// DIR/SANDBOX.NNNNNN.jsonl when it would pass MaxBytes. Each batch of
// records goes to the file in one write(2); a batch that fails is cut off
// again (no torn line) and reported to the caller, which accounts for it.
type FileSink struct {
	dir, sandbox string
	maxBytes     int64
	f            *os.File
	size         int64
	segments     int
	// total counts the bytes of all segments, for the budget.
	total       int64
	budget      Budget
	reserve     *os.File
	reserveLeft int64
}

// maxRuns bounds how often one sandbox id's trail may be started in one
// directory.
const maxRuns = 10000

// NewFileSink creates the trail file. A chain starts once: it never appends
// to an existing trail. A sandbox id used before (a ctr container id
// reused, or the same id in two containerd namespaces) gets a trail of its
// own, named SANDBOX@N (container ids cannot contain '@').
func NewFileSink(dir, sandbox string, maxBytes int64) (*FileSink, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("audit dir %s: %w", dir, err)
	}
	for run := 1; run <= maxRuns; run++ {
		name := sandbox
		if run > 1 {
			name = fmt.Sprintf("%s@%d", sandbox, run)
		}
		if old, _ := filepath.Glob(filepath.Join(dir, name+".[0-9][0-9][0-9][0-9][0-9][0-9].jsonl")); len(old) > 0 {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, FileName(name)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("audit trail: %w", err)
		}
		return &FileSink{dir: dir, sandbox: name, maxBytes: maxBytes, f: f}, nil
	}
	return nil, fmt.Errorf("audit trail of %s: %d trails of that id exist in %s", sandbox, maxRuns, dir)
}

// Name is the trail's name: the sandbox id, or SANDBOX@N for a reused id.
func (s *FileSink) Name() string { return s.sandbox }

// Path is the active file.
func (s *FileSink) Path() string { return filepath.Join(s.dir, FileName(s.sandbox)) }

// WriteBatch appends whole lines of the sandbox's records, rotating first
// when they would pass the size limit. A batch the budget does not admit
// is refused with a FullError and nothing is written. On error nothing of
// the batch stays in the file.
func (s *FileSink) WriteBatch(b []byte) error {
	if err := s.admit(int64(len(b))); err != nil {
		return err
	}
	return s.write(b)
}

// WriteOwn appends a batch that carries the trail's own records: past the
// budget it is written from the reserve.
func (s *FileSink) WriteOwn(b []byte) error {
	if err := s.admit(int64(len(b))); err != nil {
		if !IsFull(err) {
			return err
		}
		if err := s.takeReserve(int64(len(b))); err != nil {
			return err
		}
	}
	return s.write(b)
}

func (s *FileSink) write(b []byte) error {
	if s.maxBytes > 0 && s.size > 0 && s.size+int64(len(b)) > s.maxBytes {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	n, err := s.f.Write(b)
	if err == nil && n < len(b) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(b))
	}
	if err != nil {
		if n > 0 {
			if terr := s.f.Truncate(s.size); terr != nil {
				return fmt.Errorf("%v; and cutting the partial batch failed: %v", err, terr)
			}
		}
		return err
	}
	s.size += int64(n)
	s.total += int64(n)
	return nil
}

func (s *FileSink) rotate() error {
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("rotate audit trail: %w", err)
	}
	next := filepath.Join(s.dir, SegmentName(s.sandbox, s.segments+1))
	if err := os.Rename(s.Path(), next); err != nil {
		return fmt.Errorf("rotate audit trail: %w", err)
	}
	f, err := os.OpenFile(s.Path(), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		os.Rename(next, s.Path()) // keep writing where we were
		return fmt.Errorf("rotate audit trail: %w", err)
	}
	s.segments++
	s.f.Close()
	s.f, s.size = f, 0
	return nil
}

// Sync fsyncs the file.
func (s *FileSink) Sync() error { return s.f.Sync() }

// syncer is the active file, for an fsync outside the trail's lock (a
// rotation after it syncs and closes that file itself; a Sync on a closed
// file fails harmlessly).
func (s *FileSink) syncer() *os.File { return s.f }

// Close syncs and closes the file, and gives the reserve back.
func (s *FileSink) Close() error {
	s.closeReserve()
	err := s.f.Sync()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}
