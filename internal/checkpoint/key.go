package checkpoint

// The store's key and what it signs with it.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// KeySize is the node key's length in bytes.
const KeySize = 32

func loadOrCreateKey(path string) ([]byte, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("node key %q: not an absolute path", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("node key: %w", err)
		}
		tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
		werr := writeFileSync(tmp, key)
		if werr == nil {
			// Link, not rename: two shims creating the key at once agree
			// on the first one's.
			werr = os.Link(tmp, path)
		}
		os.Remove(tmp)
		if werr != nil && !errors.Is(werr, os.ErrExist) {
			return nil, fmt.Errorf("node key: %w", werr)
		}
		return loadOrCreateKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || !private(&st) {
		return nil, fmt.Errorf("node key %s: must be a regular file of uid %d with mode 0600 (it is uid %d, mode %o)", path, os.Geteuid(), st.Uid, st.Mode&0o7777)
	}
	key, err := io.ReadAll(io.LimitReader(f, KeySize+1))
	if err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("node key %s: %d bytes, want %d", path, len(key), KeySize)
	}
	return key, nil
}

// mac is the node key's MAC (hex) of v's JSON, under a context that says
// what v is.
func (s *Store) mac(context string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(context))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// signedBy says whether got is the node key's MAC of v under context.
func (s *Store) signedBy(context string, v any, got string) bool {
	want, err := s.mac(context, v)
	return err == nil && hmac.Equal([]byte(got), []byte(want))
}
