package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// commit writes a fake image (what runsc would) and commits it.
func commit(t *testing.T, s *Store, name string, files map[string]string) string {
	t.Helper()
	tmp, err := s.Begin(name)
	if err != nil {
		t.Fatal(err)
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(tmp, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	digest, err := s.Commit(tmp, &Manifest{Name: name, SandboxID: "sb1", Role: "coder", PolicyDigest: "sha256:aa", Profile: []byte(`{"role":"coder"}`),
		Trail: Trail{Sandbox: "sb1", LastSeq: 7, LastHash: strings.Repeat("ab", 32)}})
	if err != nil {
		t.Fatal(err)
	}
	return digest
}

func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := OpenStore(filepath.Join(dir, "store"), filepath.Join(dir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func TestCommitAndOpen(t *testing.T) {
	s, _ := newStore(t)
	digest := commit(t, s, "cp1", map[string]string{"checkpoint.img": "state", "pages.img": "pages"})
	img, err := s.Open("cp1")
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != digest || img.Manifest.Trail.LastSeq != 7 || len(img.Manifest.Files) != 2 {
		t.Fatalf("image %+v, digest %s", img, digest)
	}
	st, err := os.Stat(filepath.Join(img.Dir, "pages.img"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("pages.img mode %v, %v", st.Mode(), err)
	}
	if _, err := s.Begin("cp1"); err == nil {
		t.Fatal("a second checkpoint under the same name was begun")
	}
}

func TestOpenRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spoil  func(t *testing.T, s *Store, dir string)
		reason string
	}{
		{"file altered", func(t *testing.T, s *Store, dir string) {
			os.WriteFile(filepath.Join(dir, "pages.img"), []byte("pagez"), 0o600)
		}, "does not match its manifest"},
		{"file added", func(t *testing.T, s *Store, dir string) {
			os.WriteFile(filepath.Join(dir, "extra.img"), []byte("x"), 0o600)
		}, "not in its manifest"},
		{"file removed", func(t *testing.T, s *Store, dir string) {
			os.Remove(filepath.Join(dir, "pages.img"))
		}, "pages.img"},
		{"manifest edited", func(t *testing.T, s *Store, dir string) {
			p := filepath.Join(dir, ManifestFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), `"coder"`, `"admin"`, 1)), 0o600)
		}, "not signed by this node's key"},
		{"signed by another key", func(t *testing.T, s *Store, dir string) {
			other, _ := OpenStore(filepath.Join(t.TempDir(), "s"), filepath.Join(t.TempDir(), "k"))
			body, _, _ := other.sign(&Manifest{Version: Version, Name: "cp", Files: []File{}})
			os.WriteFile(filepath.Join(dir, ManifestFile), body, 0o600)
		}, "not signed by this node's key"},
		{"a symlink", func(t *testing.T, s *Store, dir string) {
			os.Rename(dir, dir+".real")
			os.Symlink(dir+".real", dir)
		}, "symlink"},
		{"open to others", func(t *testing.T, s *Store, dir string) {
			os.Chmod(dir, 0o755)
		}, "mode 755"},
		{"a file open to others", func(t *testing.T, s *Store, dir string) {
			os.Chmod(filepath.Join(dir, "pages.img"), 0o644)
		}, "mode 644"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			commit(t, s, "cp", map[string]string{"checkpoint.img": "state", "pages.img": "pages"})
			tc.spoil(t, s, filepath.Join(s.Dir, "cp"))
			_, err := s.Open("cp")
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Open: %v, want an error with %q", err, tc.reason)
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, n := range []string{"", "../x", "a/b", "A", ".hidden", "a..b", strings.Repeat("a", 64)} {
		if ValidName(n) == nil {
			t.Errorf("name %q accepted", n)
		}
	}
	for _, n := range []string{"a", "agent-1.2026-12-02", "x_y"} {
		if err := ValidName(n); err != nil {
			t.Errorf("name %q: %v", n, err)
		}
	}
	s, _ := newStore(t)
	if _, err := s.Open("missing"); err == nil || !strings.Contains(err.Error(), "not in the node's store") {
		t.Fatalf("Open(missing): %v", err)
	}
}

func TestKey(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "node.key")
	a, err := OpenStore(filepath.Join(dir, "s"), key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenStore(filepath.Join(dir, "s"), key)
	if err != nil || string(a.key) != string(b.key) || len(a.key) != KeySize {
		t.Fatalf("the key was not kept: %v", err)
	}
	os.Chmod(key, 0o644)
	if _, err := OpenStore(filepath.Join(dir, "s"), key); err == nil || !strings.Contains(err.Error(), "mode 0600") {
		t.Fatalf("a key readable by others: %v", err)
	}
	os.Chmod(key, 0o600)
	os.Chmod(filepath.Join(dir, "s"), 0o755)
	if _, err := OpenStore(filepath.Join(dir, "s"), key); err == nil || !strings.Contains(err.Error(), "0700") {
		t.Fatalf("a store open to others: %v", err)
	}
}

// An image checked once is not hashed again while its files are the same
// files, unchanged; any write makes the next Open hash it, and refuse it.
func TestOpenRemembersWhatMatched(t *testing.T) {
	s, _ := newStore(t)
	commit(t, s, "cp", map[string]string{"checkpoint.img": "state", "pages.img": "pages"})
	if _, err := s.Open("cp"); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(filepath.Join(s.Dir, "cp"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	img, _ := s.Open("cp")
	seen := s.loadVerified("cp", img.Digest)
	if len(seen) != 2 {
		t.Fatalf("remembered %v", seen)
	}
	if _, sum, err := s.checkFile(dfd, img.Manifest.Files[1], seen); err != nil || sum != "" {
		t.Fatalf("an unchanged file was hashed again (%q, %v)", sum, err)
	}
	// Same size, new content: its times change, so it is hashed and refused.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(s.Dir, "cp", "pages.img"), []byte("pagez"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("cp"); err == nil || !strings.Contains(err.Error(), "does not match its manifest") {
		t.Fatalf("an altered file after a good Open: %v", err)
	}
	// A forged record is ignored.
	os.WriteFile(filepath.Join(s.Dir, verifiedDir, "cp.json"), []byte(`{"digest":"`+img.Digest+`","files":[],"mac":"00"}`), 0o600)
	if got := s.loadVerified("cp", img.Digest); got != nil {
		t.Fatalf("a forged record was read: %v", got)
	}
}
