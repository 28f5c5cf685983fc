package checkpoint

// The shared store: a directory every node mounts (a ReadWriteMany
// PersistentVolume, NFS), so that a sandbox suspended on one node resumes
// on another. An image holds the agent's memory, and so its secrets: what
// goes there is encrypted with a data key of the image's own (envelope.go:
// AES-256-GCM, in chunks whose nonce and associated data bind the
// checkpoint's name, the file, the chunk's place and whether it is the
// last, so that no chunk can be altered, moved, dropped or the file cut
// short unseen), which travels beside it wrapped by the cluster's
// key-encryption key. A node takes an image from there into its own store
// (Import): it gets the data key back, decrypts, checks every file against
// the manifest, and signs the manifest with its own node key, so that its
// restore checks it as any other.

import (
	"bytes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// chunkSize is how much of a file one sealed chunk holds.
const chunkSize = 1 << 20

// encSuffix ends an encrypted file's name in the shared store.
const encSuffix = ".enc"

// Shared is the cluster's shared store.
type Shared struct {
	Dir    string
	wrap   Wrapper
	unwrap Unwrapper
}

// OpenShared opens the shared store at dir: wrap wraps the data key of an
// image written there, unwrap gives an image's data key back.
func OpenShared(dir string, wrap Wrapper, unwrap Unwrapper) (*Shared, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("shared store %q: not an absolute path", dir)
	}
	if err := ensureDir(dir); err != nil {
		return nil, fmt.Errorf("shared store: %w", err)
	}
	return &Shared{Dir: dir, wrap: wrap, unwrap: unwrap}, nil
}

// LoadSymmetricKEK reads the cluster's checkpoint key from keyFile (32
// bytes, a regular file of the runtime's user, mode 0600). The key is never
// created here: every node must hold the same.
func LoadSymmetricKEK(keyFile string) (*SymmetricKEK, error) {
	key, err := readPrivateFile(keyFile, KeySize)
	if err != nil {
		return nil, fmt.Errorf("the cluster's checkpoint key: %w", err)
	}
	return NewSymmetricKEK(key)
}

// LoadPublicKEK reads the broker's public key (PEM) from path.
func LoadPublicKEK(path string) (*PublicKEK, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the broker's public key: %w", err)
	}
	k, err := ParsePublicKEK(b)
	if err != nil {
		return nil, fmt.Errorf("the broker's public key %s: %w", path, err)
	}
	return k, nil
}

// chunkAAD binds a chunk to its image, file and place.
func chunkAAD(name, file string, index uint64, last bool) []byte {
	l := byte(0)
	if last {
		l = 1
	}
	aad := fmt.Appendf(nil, "agentbox shared checkpoint v2\n%s\n%s\n", name, file)
	aad = binary.BigEndian.AppendUint64(aad, index)
	return append(aad, l)
}

// seal writes src to dst encrypted: a random 4-byte file prefix, then for
// each chunk its length and its sealed bytes. The nonce is the prefix and
// the chunk's index.
func seal(aead cipher.AEAD, dst io.Writer, src io.Reader, size int64, name, file string) error {
	prefix := make([]byte, 4)
	if _, err := rand.Read(prefix); err != nil {
		return err
	}
	if _, err := dst.Write(prefix); err != nil {
		return err
	}
	buf := make([]byte, chunkSize)
	var index uint64
	left := size
	for {
		n := int64(chunkSize)
		if left < n {
			n = left
		}
		if _, err := io.ReadFull(src, buf[:n]); err != nil {
			return err
		}
		left -= n
		last := left == 0
		nonce := binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), index)
		sealed := aead.Seal(nil, nonce, buf[:n], chunkAAD(name, file, index, last))
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(sealed)))
		if _, err := dst.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := dst.Write(sealed); err != nil {
			return err
		}
		if last {
			return nil
		}
		index++
	}
}

// open decrypts what seal wrote, refusing anything altered, reordered or
// cut short.
func open(aead cipher.AEAD, dst io.Writer, src io.Reader, name, file string) error {
	prefix := make([]byte, 4)
	if _, err := io.ReadFull(src, prefix); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	overhead := aead.Overhead()
	buf := make([]byte, chunkSize+overhead)
	// A failed Open clears its output: never the ciphertext's buffer.
	out := make([]byte, 0, chunkSize)
	for index := uint64(0); ; index++ {
		var hdr [4]byte
		if _, err := io.ReadFull(src, hdr[:]); err != nil {
			return fmt.Errorf("%s: cut short after chunk %d: %w", file, index, err)
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if n < overhead || n > len(buf) {
			return fmt.Errorf("%s: chunk %d of %d bytes", file, index, n)
		}
		if _, err := io.ReadFull(src, buf[:n]); err != nil {
			return fmt.Errorf("%s: chunk %d: %w", file, index, err)
		}
		nonce := binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), index)
		plain, err := aead.Open(out[:0], nonce, buf[:n], chunkAAD(name, file, index, false))
		last := false
		if err != nil {
			plain, err = aead.Open(out[:0], nonce, buf[:n], chunkAAD(name, file, index, true))
			last = true
		}
		if err != nil {
			return fmt.Errorf("%s: chunk %d does not decrypt with the image's data key: altered, or another image's", file, index)
		}
		if _, err := dst.Write(plain); err != nil {
			return err
		}
		if last {
			if extra, _ := src.Read(make([]byte, 1)); extra != 0 {
				return fmt.Errorf("%s: bytes after its last chunk", file)
			}
			return nil
		}
	}
}

// Export copies checkpoint name, once it checks out (Open), into the
// shared store, encrypted, and returns the bytes written.
func (s *Store) Export(name string, sh *Shared) (int64, error) {
	img, err := s.Open(name)
	if err != nil {
		return 0, err
	}
	if _, err := os.Lstat(filepath.Join(sh.Dir, name)); err == nil {
		return 0, fmt.Errorf("checkpoint %q is in the shared store already", name)
	}
	tmp, err := os.MkdirTemp(sh.Dir, "."+name+".tmp-")
	if err != nil {
		return 0, err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	dek := make([]byte, DataKeySize)
	if _, err := rand.Read(dek); err != nil {
		return 0, err
	}
	wrapped, err := sh.wrap.Wrap(name, dek)
	if err != nil {
		return 0, fmt.Errorf("wrapping the image's data key: %w", err)
	}
	wb, err := json.Marshal(wrapped)
	if err != nil {
		return 0, err
	}
	if err := writeFileSync(filepath.Join(tmp, DataKeyFile), wb); err != nil {
		return 0, err
	}
	aead, err := newAEAD(dek)
	if err != nil {
		return 0, err
	}
	total := int64(len(wb))
	files := append([]File{{Name: ManifestFile}}, img.Manifest.Files...)
	for _, f := range files {
		in, err := os.Open(filepath.Join(img.Dir, f.Name))
		if err != nil {
			return 0, err
		}
		st, err := in.Stat()
		if err == nil {
			err = sealFile(aead, filepath.Join(tmp, f.Name+encSuffix), in, st.Size(), name, f.Name)
		}
		in.Close()
		if err != nil {
			return 0, fmt.Errorf("exporting %s: %w", f.Name, err)
		}
		if st, err := os.Stat(filepath.Join(tmp, f.Name+encSuffix)); err == nil {
			total += st.Size()
		}
	}
	if err := os.Rename(tmp, filepath.Join(sh.Dir, name)); err != nil {
		return 0, err
	}
	done = true
	return total, syncDir(sh.Dir)
}

func sealFile(aead cipher.AEAD, path string, in io.Reader, size int64, name, file string) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = seal(aead, out, in, size, name, file)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// Has says whether the shared store holds checkpoint name.
func (sh *Shared) Has(name string) bool {
	if ValidName(name) != nil {
		return false
	}
	st, err := os.Lstat(filepath.Join(sh.Dir, name))
	return err == nil && st.IsDir()
}

// Import takes checkpoint name from the shared store into this node's:
// every file decrypts with the cluster's key, the manifest names the same
// checkpoint and lists exactly those files with their sizes and digests,
// and the node key then signs it. What does not check out is refused and
// nothing is left in the node's store.
func (s *Store) Import(name string, sh *Shared) error {
	if err := ValidName(name); err != nil {
		return err
	}
	src := filepath.Join(sh.Dir, name)
	tmp, err := s.Begin(name)
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("checkpoint %q: not in the shared store %s", name, sh.Dir)
	}
	aead, err := sh.dataKey(name)
	if err != nil {
		return fmt.Errorf("checkpoint %q from the shared store: %w", name, err)
	}
	for _, e := range ents {
		if e.Name() == DataKeyFile {
			continue
		}
		file, ok := strings.CutSuffix(e.Name(), encSuffix)
		if !ok || !e.Type().IsRegular() || file == "" {
			return fmt.Errorf("checkpoint %q: %s in the shared store is not one of its files", name, e.Name())
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		out, err := os.OpenFile(filepath.Join(tmp, file), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			err = open(aead, out, in, name, file)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
		}
		in.Close()
		if err != nil {
			return fmt.Errorf("checkpoint %q from the shared store: %w", name, err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(tmp, ManifestFile))
	if err != nil {
		return fmt.Errorf("checkpoint %q from the shared store: no manifest: %w", name, err)
	}
	var sm Signed
	if err := jsonStrict(raw, &sm); err != nil {
		return fmt.Errorf("checkpoint %q from the shared store: manifest: %w", name, err)
	}
	m := sm.Manifest
	if m.Name != name || m.Version != Version {
		return fmt.Errorf("checkpoint %q from the shared store: its manifest names %q (version %d)", name, m.Name, m.Version)
	}
	if err := os.Remove(filepath.Join(tmp, ManifestFile)); err != nil {
		return err
	}
	// Commit hashes what was decrypted; it must be what the manifest lists.
	listed := m.Files
	if _, err := s.Commit(tmp, &m); err != nil {
		return err
	}
	done = true
	if !sameFiles(listed, m.Files) {
		s.Remove(name)
		return fmt.Errorf("checkpoint %q from the shared store: its files are not the ones its manifest lists: refused", name)
	}
	return nil
}

// dataKey reads checkpoint name's wrapped data key and has it unwrapped.
func (sh *Shared) dataKey(name string) (cipher.AEAD, error) {
	b, err := readSmall(filepath.Join(sh.Dir, name, DataKeyFile), 8<<10)
	if err != nil {
		return nil, fmt.Errorf("its wrapped data key: %w", err)
	}
	w, err := ParseWrappedKey(b)
	if err != nil {
		return nil, err
	}
	if w.Checkpoint != name {
		return nil, fmt.Errorf("its data key is %s's: refused", w.Checkpoint)
	}
	dek, err := sh.unwrap.Unwrap(w)
	if err != nil {
		return nil, err
	}
	return newAEAD(dek)
}

// readSmall reads a regular file of at most limit bytes, without
// following a symlink or hanging on a FIFO (as bundle.ReadSmallFile does:
// that package's imports are not the store's).
func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > limit {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, limit)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// jsonStrict decodes b into v, refusing unknown fields.
func jsonStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func sameFiles(a, b []File) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// RemoveShared deletes checkpoint name from the shared store at dir (no
// key needed).
func RemoveShared(dir, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if st, err := os.Lstat(filepath.Join(dir, name)); err != nil || !st.IsDir() {
		return errors.New("not in the shared store")
	}
	return os.RemoveAll(filepath.Join(dir, name))
}
