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
	"agentbox.dev/agentbox/internal/checkpoint/naming"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// ValidName says why name cannot name a checkpoint (nil: it can).
func ValidName(name string) error { return naming.Valid(name) }

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
	// ModelTokens and ModelRequests are what its model calls had used of
	// its model budget (limits.model): a restored agent goes on from them.
	ModelTokens   int64 `json:"modelTokens,omitempty"`
	ModelRequests int64 `json:"modelRequests,omitempty"`
	// MCPCalls are the tools/call it had made, by "HOST" and "HOST TOOL"
	// (limits.mcp): a restored agent goes on from them.
	MCPCalls map[string]int64 `json:"mcpCalls,omitempty"`
	// Suspended: the sandbox was stopped after the checkpoint.
	Suspended bool `json:"suspended"`
	// PauseImage: the pod's pause container ran from the node's image of
	// its rootfs, not on a gofer. gVisor restores a container only with
	// the mounts it was checkpointed with: the restored pod's pause is
	// served the same way.
	PauseImage bool `json:"pauseImage,omitempty"`
	// SandboxObject and SandboxUID name the agent-sandbox Sandbox the pod
	// belonged to (NAMESPACE/NAME), as the node agent proved it: only a
	// pod proven to be that Sandbox's (by UID) is restored from it.
	SandboxObject string `json:"sandboxObject,omitempty"`
	SandboxUID    string `json:"sandboxUid,omitempty"`
	Trail         Trail  `json:"trail"`
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
		if err == nil {
			// On disk before anything relies on it (a suspend stops the
			// agent once its image is committed).
			err = f.Sync()
		}
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
	if err := syncDir(s.Dir); err != nil {
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

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
