package checkpoint

// The store's file handling: directories owned by root and private,
// files opened beneath them without following links, written durably.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/privdir"
)

func ensureDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("checkpoint store %q: not an absolute path", dir)
	}
	if err := privdir.Ensure(dir, privdir.Private); err != nil {
		return fmt.Errorf("checkpoint store: %w: it must be uid %d's alone (mode 0700): images hold agents' memory", err, os.Geteuid())
	}
	return nil
}

func ownedDir(fd int, dir string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if !private(&st) {
		return fmt.Errorf("checkpoint %s: owned by uid %d with mode %o: refused (the runtime's images are uid %d's alone)", dir, st.Uid, st.Mode&0o777, os.Geteuid())
	}
	return nil
}

func openAt(dfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, errors.New("not a regular file")
	}
	if !private(&st) {
		f.Close()
		return nil, fmt.Errorf("owned by uid %d with mode %o: refused", st.Uid, st.Mode&0o777)
	}
	return f, nil
}

func readAt(dfd int, name string, max int64) ([]byte, error) {
	f, err := openAt(dfd, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	return b, nil
}

// private says whether a file is the runtime user's alone (no group or
// other bits).
func private(st *unix.Stat_t) bool {
	return int(st.Uid) == os.Geteuid() && st.Mode&0o077 == 0
}

// sha256Of is r's SHA-256 (hex) and length.
func sha256Of(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

func writeFileSync(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
