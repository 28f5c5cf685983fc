package audit

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// Prune removes ended trails from dir, oldest first, until the *.jsonl
// files there take at most maxTotal bytes. A trail counts as ended when
// its last record is the end record; one still running, cut short, or
// whose webhook spool (in spoolDir) is not yet delivered is never removed.
// It returns the trails removed.
func Prune(dir, spoolDir string, maxTotal int64) ([]string, error) {
	if maxTotal <= 0 {
		return nil, nil
	}
	trails, err := FindTrails(dir)
	if err != nil {
		return nil, err
	}
	type cand struct {
		t     TrailFiles
		size  int64
		mtime int64
	}
	var total int64
	var ended []cand
	for _, t := range trails {
		var size, mtime int64
		for _, f := range t.Files {
			if st, err := os.Stat(f); err == nil {
				size += st.Size()
				if m := st.ModTime().UnixNano(); m > mtime {
					mtime = m
				}
			}
		}
		total += size
		if !endsWithEnd(t.Files[len(t.Files)-1]) {
			continue
		}
		if spoolDir != "" {
			if _, err := os.Stat(filepath.Join(spoolDir, t.Sandbox+".spool")); err == nil {
				continue // not yet delivered
			}
		}
		ended = append(ended, cand{t, size, mtime})
	}
	sort.Slice(ended, func(i, j int) bool { return ended[i].mtime < ended[j].mtime })
	var removed []string
	var errs []error
	for _, c := range ended {
		if total <= maxTotal {
			break
		}
		for _, f := range c.t.Files {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		total -= c.size
		removed = append(removed, c.t.Sandbox)
	}
	return removed, errors.Join(errs...)
}

// endsWithEnd reports whether a trail file's last line is the end record.
func endsWithEnd(file string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return false
	}
	const tail = 64 << 10
	off := st.Size() - tail
	if off < 0 {
		off = 0
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return false
	}
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	// The last record is the end record, in either format.
	return bytes.Contains(b, []byte(`"event_code":"`+EventSandboxEnd+`"`)) || bytes.Contains(b, []byte(`"event":"`+EventSandboxEnd+`"`))
}
