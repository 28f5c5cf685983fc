package checkpoint

// The shared store: a directory every node mounts (a ReadWriteMany
// PersistentVolume, NFS), so that a sandbox suspended on one node resumes
// on another. An image holds the agent's memory, and so its secrets: what
// goes there is encrypted with the cluster's checkpoint key (AES-256-GCM,
// in chunks whose nonce and associated data bind the checkpoint's name, the
// file, the chunk's place and whether it is the last, so that no chunk can
// be altered, moved, dropped or the file cut short unseen). A node takes an
// image from there into its own store (Import): it decrypts it, checks
// every file against the manifest, and signs the manifest with its own
// node key, so that its restore checks it as any other.

import (
	"bytes"
	"crypto/aes"
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
)

// chunkSize is how much of a file one sealed chunk holds.
const chunkSize = 1 << 20

// encSuffix ends an encrypted file's name in the shared store.
const encSuffix = ".enc"

// Shared is the cluster's shared store.
type Shared struct {
	Dir  string
	aead cipher.AEAD
}

// OpenShared opens the shared store at dir with the checkpoint key in
// keyFile (32 bytes, a regular file of the runtime's user, mode 0600). The
// key is never created here: every node must hold the same.
func OpenShared(dir, keyFile string) (*Shared, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("shared store %q: not an absolute path", dir)
	}
	if _, err := os.Stat(keyFile); err != nil {
		return nil, fmt.Errorf("shared store: checkpoint key: %w", err)
	}
	key, err := loadOrCreateKey(keyFile)
	if err != nil {
		return nil, fmt.Errorf("shared store: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	if err := ensureDir(dir); err != nil {
		return nil, fmt.Errorf("shared store: %w", err)
	}
	return &Shared{Dir: dir, aead: aead}, nil
}

// chunkAAD binds a chunk to its image, file and place.
func chunkAAD(name, file string, index uint64, last bool) []byte {
	l := byte(0)
	if last {
		l = 1
	}
	aad := fmt.Appendf(nil, "agentbox shared checkpoint v1\n%s\n%s\n", name, file)
	aad = binary.BigEndian.AppendUint64(aad, index)
	return append(aad, l)
}

// seal writes src to dst encrypted: a random 4-byte file prefix, then for
// each chunk its length and its sealed bytes. The nonce is the prefix and
// the chunk's index.
func (sh *Shared) seal(dst io.Writer, src io.Reader, size int64, name, file string) error {
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
		sealed := sh.aead.Seal(nil, nonce, buf[:n], chunkAAD(name, file, index, last))
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
func (sh *Shared) open(dst io.Writer, src io.Reader, name, file string) error {
	prefix := make([]byte, 4)
	if _, err := io.ReadFull(src, prefix); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	overhead := sh.aead.Overhead()
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
		plain, err := sh.aead.Open(out[:0], nonce, buf[:n], chunkAAD(name, file, index, false))
		last := false
		if err != nil {
			plain, err = sh.aead.Open(out[:0], nonce, buf[:n], chunkAAD(name, file, index, true))
			last = true
		}
		if err != nil {
			return fmt.Errorf("%s: chunk %d does not decrypt with the cluster's checkpoint key: altered, or another image's", file, index)
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
	var total int64
	files := append([]File{{Name: ManifestFile}}, img.Manifest.Files...)
	for _, f := range files {
		in, err := os.Open(filepath.Join(img.Dir, f.Name))
		if err != nil {
			return 0, err
		}
		st, err := in.Stat()
		if err == nil {
			err = sealFile(sh, filepath.Join(tmp, f.Name+encSuffix), in, st.Size(), name, f.Name)
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

func sealFile(sh *Shared, path string, in io.Reader, size int64, name, file string) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = sh.seal(out, in, size, name, file)
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
	for _, e := range ents {
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
			err = sh.open(out, in, name, file)
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
