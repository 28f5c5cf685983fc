package audit

import (
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
}

// NewFileSink creates the trail file. It refuses to append to an existing
// trail of the same sandbox id: a chain starts once.
func NewFileSink(dir, sandbox string, maxBytes int64) (*FileSink, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("audit dir %s: %w", dir, err)
	}
	if old, _ := filepath.Glob(filepath.Join(dir, sandbox+".[0-9][0-9][0-9][0-9][0-9][0-9].jsonl")); len(old) > 0 {
		return nil, fmt.Errorf("audit trail of %s already exists in %s", sandbox, dir)
	}
	f, err := os.OpenFile(filepath.Join(dir, FileName(sandbox)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	return &FileSink{dir: dir, sandbox: sandbox, maxBytes: maxBytes, f: f}, nil
}

// Path is the active file.
func (s *FileSink) Path() string { return filepath.Join(s.dir, FileName(s.sandbox)) }

// WriteBatch appends whole lines, rotating first when they would pass the
// size limit. On error nothing of the batch stays in the file.
func (s *FileSink) WriteBatch(b []byte) error {
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

// Close syncs and closes the file.
func (s *FileSink) Close() error {
	err := s.f.Sync()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}
