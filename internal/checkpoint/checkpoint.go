// Package checkpoint keeps sandboxes' memory images, the runtime's own:
// one directory per checkpoint under the node's store (the store 0700, each
// checkpoint 0700, its files 0600, all owned by the runtime's user), with a
// manifest that lists every file's SHA-256 and is authenticated by the
// node's key (HMAC-SHA256).
//
// An image holds the agent's whole memory, secrets included. A crafted image
// is arbitrary Sentry state, so a restore takes only a checkpoint by name
// from the store, and only when its manifest's MAC and every file's digest
// check out (Open). Nothing a pod author writes is ever read as an image.
package checkpoint

import (
	"bytes"
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
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ManifestFile is the signed manifest in a checkpoint's directory.
const ManifestFile = "agentbox-manifest.json"

// Version of the manifest format.
const Version = 1

// macContext separates this MAC from any other use of the node key.
const macContext = "agentbox checkpoint manifest v1\n"

// nameRE is what a checkpoint name may be: a name, never a path.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName says why name cannot name a checkpoint (nil: it can).
func ValidName(name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("checkpoint name %q: want 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit (a name in the node's store, never a path)", name)
	}
	return nil
}

// File is one file of an image.
type File struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Trail is where the checkpointed sandbox's trail stood: the record that
// says it was checkpointed. The restored sandbox's trail names it.
type Trail struct {
	Sandbox  string `json:"sandbox"`
	LastSeq  uint64 `json:"lastSeq"`
	LastHash string `json:"lastHash"`
}

// Manifest describes a checkpoint. The node key authenticates all of it.
type Manifest struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	SandboxID string    `json:"sandboxId"`
	// Namespace is the containerd namespace; Pod the pod's namespace/name
	// and PodNamespace its Kubernetes namespace (CRI pods only).
	Namespace    string `json:"namespace"`
	Pod          string `json:"pod,omitempty"`
	PodNamespace string `json:"podNamespace,omitempty"`
	// Quarantined is the quarantine's reason when the sandbox was
	// quarantined: such a checkpoint is not restored.
	Quarantined string `json:"quarantined,omitempty"`
	// Placeholders are what the sandbox held instead of the secrets its
	// gateway injects, by variable (random tokens, not secrets): the
	// restored agent holds them in its memory, and its new sandbox keeps
	// them.
	Placeholders map[string]string `json:"placeholders,omitempty"`
	// Role and PolicyDigest are what the sandbox ran under when it was
	// checkpointed (its live digest); Profile is that profile, compiled, for
	// the restore's looser-role check.
	Role         string          `json:"role"`
	PolicyDigest string          `json:"policyDigest"`
	Profile      json.RawMessage `json:"profile"`
	// Egress is the egress plan it ran under (narrowed live, perhaps).
	Egress json.RawMessage `json:"egress"`
	// Containers are the sandbox's containers, root first.
	Containers []string `json:"containers"`
	// WallClockUsed is how much of its wall-clock limit the agent had used.
	WallClockUsed time.Duration `json:"wallClockUsedNs"`
	// Suspended: the sandbox was stopped after the checkpoint.
	Suspended bool  `json:"suspended"`
	Trail     Trail `json:"trail"`
	// Files are the image's files (gVisor's state and pages files).
	Files []File `json:"files"`
}

// Signed is the manifest file: the manifest and its MAC.
type Signed struct {
	Manifest Manifest `json:"manifest"`
	MAC      string   `json:"mac"`
}

// Store is the node's checkpoints.
type Store struct {
	Dir string
	key []byte
}

// OpenStore opens the store at dir with the node key at keyFile, creating
// either if missing (the key from crypto/rand). Both must be the
// runtime user's own and closed to others.
func OpenStore(dir, keyFile string) (*Store, error) {
	if err := ensureDir(dir); err != nil {
		return nil, err
	}
	key, err := loadOrCreateKey(keyFile)
	if err != nil {
		return nil, err
	}
	return &Store{Dir: dir, key: key}, nil
}

func ensureDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("checkpoint store %q: not an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("checkpoint store %s: not a directory (a symlink?)", dir)
	}
	if !private(&st) {
		return fmt.Errorf("checkpoint store %s: owned by uid %d with mode %o: it must be uid %d's alone (mode 0700): images hold agents' memory", dir, st.Uid, st.Mode&0o777, os.Geteuid())
	}
	return nil
}

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

// Begin makes the directory a checkpoint's files are written into before
// Commit puts it in place under name.
func (s *Store) Begin(name string) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	if _, err := os.Lstat(filepath.Join(s.Dir, name)); err == nil {
		return "", fmt.Errorf("checkpoint %q already exists in %s", name, s.Dir)
	}
	return os.MkdirTemp(s.Dir, "."+name+".tmp-")
}

// Abort removes a checkpoint begun and not committed.
func (s *Store) Abort(tmp string) { os.RemoveAll(tmp) }

// Commit hashes the files runsc wrote into tmp, signs m with them and
// renames tmp to m.Name. It returns the signed manifest's digest (the
// image's digest).
func (s *Store) Commit(tmp string, m *Manifest) (string, error) {
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return "", err
	}
	m.Version, m.Files = Version, nil
	for _, e := range ents {
		if e.Name() == ManifestFile {
			return "", fmt.Errorf("checkpoint: runsc wrote a file named %s", ManifestFile)
		}
		if !e.Type().IsRegular() {
			return "", fmt.Errorf("checkpoint: %s is not a regular file", e.Name())
		}
		p := filepath.Join(tmp, e.Name())
		if err := os.Chmod(p, 0o600); err != nil {
			return "", err
		}
		f, err := os.Open(p)
		if err != nil {
			return "", err
		}
		sum, size, err := sha256Of(f)
		f.Close()
		if err != nil {
			return "", err
		}
		m.Files = append(m.Files, File{Name: e.Name(), Size: size, SHA256: sum})
	}
	if len(m.Files) == 0 {
		return "", errors.New("checkpoint: runsc wrote no files")
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	b, digest, err := s.sign(m)
	if err != nil {
		return "", err
	}
	if err := writeFileSync(filepath.Join(tmp, ManifestFile), b); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, m.Name)); err != nil {
		return "", fmt.Errorf("checkpoint %q: %w", m.Name, err)
	}
	return digest, nil
}

// sign returns the manifest file's content and its digest.
func (s *Store) sign(m *Manifest) ([]byte, string, error) {
	sig, err := s.mac(macContext, m)
	if err != nil {
		return nil, "", err
	}
	b, err := json.MarshalIndent(Signed{Manifest: *m, MAC: sig}, "", "  ")
	if err != nil {
		return nil, "", err
	}
	b = append(b, '\n')
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Image is a checkpoint that checked out: its manifest, its digest and the
// directory runsc restores from.
type Image struct {
	Manifest Manifest
	Digest   string
	Dir      string
}

// Open checks the checkpoint name: the directory is the runtime user's
// own, its manifest's MAC is the node key's, it holds exactly the files the
// manifest lists, each with the size and digest listed. Any other
// checkpoint is refused with what is wrong.
func (s *Store) Open(name string) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.Dir, name)
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("checkpoint %q: not in the node's store %s", name, s.Dir)
		}
		return nil, fmt.Errorf("checkpoint %q: %w (a symlink is refused)", name, err)
	}
	d := os.NewFile(uintptr(dfd), dir)
	defer d.Close()
	if err := ownedDir(dfd, dir); err != nil {
		return nil, err
	}
	raw, err := readAt(dfd, ManifestFile, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %q: manifest: %w", name, err)
	}
	var sm Signed
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sm); err != nil {
		return nil, fmt.Errorf("checkpoint %q: manifest: %w", name, err)
	}
	if !s.signedBy(macContext, &sm.Manifest, sm.MAC) {
		return nil, fmt.Errorf("checkpoint %q: its manifest is not signed by this node's key: refused (a crafted or altered image is arbitrary gVisor state)", name)
	}
	m := sm.Manifest
	if m.Version != Version || m.Name != name {
		return nil, fmt.Errorf("checkpoint %q: manifest version %d names %q", name, m.Version, m.Name)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	listed := map[string]File{}
	for _, f := range m.Files {
		listed[f.Name] = f
	}
	for _, n := range names {
		if _, ok := listed[n]; !ok && n != ManifestFile {
			return nil, fmt.Errorf("checkpoint %q: file %s is not in its manifest: refused", name, n)
		}
	}
	rawSum := sha256.Sum256(raw)
	digest := "sha256:" + hex.EncodeToString(rawSum[:])
	seen := s.loadVerified(name, digest)
	var stamps []fileStamp
	hashed := false
	for _, f := range m.Files {
		st, sum, err := s.checkFile(dfd, f, seen)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %q: %s: %w", name, f.Name, err)
		}
		if sum != "" {
			hashed = true
			if st.Size != f.Size || sum != f.SHA256 {
				return nil, fmt.Errorf("checkpoint %q: %s does not match its manifest (size %d, sha256 %s; signed %d, %s): the image was altered: refused", name, f.Name, st.Size, short(sum), f.Size, short(f.SHA256))
			}
		}
		stamps = append(stamps, st)
	}
	if hashed {
		s.saveVerified(name, digest, stamps)
	}
	return &Image{Manifest: m, Digest: digest, Dir: dir}, nil
}

// verifiedDir remembers, per checkpoint, each file's identity (device,
// inode, size, modification and change times) as it was when its digest
// last matched the manifest: a file with the same identity is not hashed
// again (a template is restored by every new pod of its role). Any write
// to a file changes its change time, which no one but root can set; the
// record is under the node key too.
const verifiedDir = ".verified"

type fileStamp struct {
	Name  string `json:"name"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
}

type verifiedRecord struct {
	Digest string      `json:"digest"`
	Files  []fileStamp `json:"files"`
	MAC    string      `json:"mac"`
}

// verifiedContext separates a verification record's MAC from a manifest's.
const verifiedContext = "agentbox checkpoint verified v1\n"

// verifiedSigned is what a verification record's MAC covers.
func (v *verifiedRecord) verifiedSigned() any {
	return struct {
		D string
		F []fileStamp
	}{v.Digest, v.Files}
}

// loadVerified is what an earlier Open of the checkpoint (with the
// manifest of digest) found to match, by file name (none if anything is
// off).
func (s *Store) loadVerified(name, digest string) map[string]fileStamp {
	dfd, err := unix.Open(filepath.Join(s.Dir, verifiedDir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(dfd)
	if ownedDir(dfd, verifiedDir) != nil {
		return nil
	}
	b, err := readAt(dfd, name+".json", 1<<20)
	if err != nil {
		return nil
	}
	var v verifiedRecord
	if json.Unmarshal(b, &v) != nil || v.Digest != digest || !s.signedBy(verifiedContext, v.verifiedSigned(), v.MAC) {
		return nil
	}
	out := map[string]fileStamp{}
	for _, f := range v.Files {
		out[f.Name] = f
	}
	return out
}

// saveVerified records the stamps of files that matched (best effort: a
// failure only means hashing again next time).
func (s *Store) saveVerified(name, digest string, stamps []fileStamp) {
	dir := filepath.Join(s.Dir, verifiedDir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return
	}
	v := verifiedRecord{Digest: digest, Files: stamps}
	var err error
	if v.MAC, err = s.mac(verifiedContext, v.verifiedSigned()); err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.tmp", name, os.Getpid()))
	if writeFileSync(tmp, b) != nil || os.Rename(tmp, filepath.Join(dir, name+".json")) != nil {
		os.Remove(tmp)
	}
}

// checkFile opens an image file and stamps it; it hashes it (sum set)
// unless seen holds the same stamp.
func (s *Store) checkFile(dfd int, f File, seen map[string]fileStamp) (fileStamp, string, error) {
	fh, err := openAt(dfd, f.Name)
	if err != nil {
		return fileStamp{}, "", err
	}
	defer fh.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(fh.Fd()), &st); err != nil {
		return fileStamp{}, "", err
	}
	stamp := fileStamp{Name: f.Name, Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	if prev, ok := seen[f.Name]; ok && prev == stamp && stamp.Size == f.Size {
		return stamp, "", nil
	}
	sum, n, err := sha256Of(fh)
	if err != nil {
		return stamp, "", err
	}
	stamp.Size = n
	return stamp, sum, nil
}

// List returns the store's checkpoints by name (unchecked: Open checks one).
func (s *Store) List() ([]Manifest, error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, err
	}
	var out []Manifest
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.Dir, e.Name(), ManifestFile))
		if err != nil {
			continue
		}
		var sm Signed
		if json.Unmarshal(b, &sm) == nil {
			out = append(out, sm.Manifest)
		}
	}
	return out, nil
}

// Remove deletes a checkpoint.
func (s *Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	os.Remove(filepath.Join(s.Dir, verifiedDir, name+".json"))
	return os.RemoveAll(filepath.Join(s.Dir, name))
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

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
