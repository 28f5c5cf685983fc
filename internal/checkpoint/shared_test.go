package checkpoint

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sharedPair is two nodes' stores (each its own node key) and the shared
// store they both mount with the cluster's key.
func sharedPair(t *testing.T) (a, b *Store, sh *Shared) {
	t.Helper()
	a, _ = newStore(t)
	b, _ = newStore(t)
	dir := t.TempDir()
	key := make([]byte, KeySize)
	rand.Read(key)
	if err := os.WriteFile(filepath.Join(dir, "cluster.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	kek, err := LoadSymmetricKEK(filepath.Join(dir, "cluster.key"))
	if err != nil {
		t.Fatal(err)
	}
	sh, err = OpenShared(filepath.Join(dir, "shared"), kek, kek)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, sh
}

// An image suspended on node a resumes on node b: b imports it from the
// shared store, where it is encrypted, and signs it with its own key.
func TestSharedExportImport(t *testing.T) {
	a, b, sh := sharedPair(t)
	secret := "agent-memory-" + strings.Repeat("s3cr3t", 10)
	pages := strings.Repeat("page ", chunkSize/5+100) + secret // more than one chunk
	commit(t, a, "cp1", map[string]string{"checkpoint.img": "state " + secret, "pages.img": pages})
	n, err := a.Export("cp1", sh)
	if err != nil || n < int64(len(pages)) {
		t.Fatalf("export: %d bytes, %v", n, err)
	}
	filepath.Walk(filepath.Join(sh.Dir, "cp1"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("s3cr3t")) || bytes.Contains(b, []byte("sandboxId")) {
				t.Errorf("%s holds plaintext", p)
			}
		}
		return nil
	})
	if _, err := b.Open("cp1"); err == nil {
		t.Fatal("node b has the image before importing it")
	}
	if err := b.Import("cp1", sh); err != nil {
		t.Fatal(err)
	}
	img, err := b.Open("cp1")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(img.Dir, "pages.img"))
	if string(got) != pages || img.Manifest.Trail.LastSeq != 7 || img.Manifest.SandboxID != "sb1" {
		t.Fatalf("imported image: %d bytes, manifest %+v", len(got), img.Manifest)
	}
	if _, err := a.Export("cp1", sh); err == nil {
		t.Fatal("exported twice under one name")
	}
}

// What was altered in the shared store, or encrypted with another key,
// or moved from another image, is refused, and nothing is left behind.
func TestSharedImportRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(t *testing.T, sh *Shared)
		want   string
	}{
		{"a flipped byte", func(t *testing.T, sh *Shared) {
			p := filepath.Join(sh.Dir, "cp1", "pages.img"+encSuffix)
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			os.WriteFile(p, b, 0o600)
		}, "does not decrypt"},
		{"cut short", func(t *testing.T, sh *Shared) {
			p := filepath.Join(sh.Dir, "cp1", "pages.img"+encSuffix)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-chunkSize/2], 0o600)
		}, "pages.img"},
		{"its last chunk dropped", func(t *testing.T, sh *Shared) {
			p := filepath.Join(sh.Dir, "cp1", "pages.img"+encSuffix)
			b, _ := os.ReadFile(p)
			// prefix (4), then [len(4) chunk] ...: keep the first chunk only.
			first := 4 + 4 + chunkSize + 16
			os.WriteFile(p, b[:first], 0o600)
		}, "cut short"},
		{"a file from another image", func(t *testing.T, sh *Shared) {
			os.Rename(filepath.Join(sh.Dir, "cp2", "pages.img"+encSuffix), filepath.Join(sh.Dir, "cp1", "pages.img"+encSuffix))
		}, "does not decrypt"},
		{"another image's data key", func(t *testing.T, sh *Shared) {
			os.Rename(filepath.Join(sh.Dir, "cp2", DataKeyFile), filepath.Join(sh.Dir, "cp1", DataKeyFile))
		}, "its data key is cp2's"},
		{"another image's data key, renamed", func(t *testing.T, sh *Shared) {
			b, _ := os.ReadFile(filepath.Join(sh.Dir, "cp2", DataKeyFile))
			os.WriteFile(filepath.Join(sh.Dir, "cp1", DataKeyFile), []byte(strings.Replace(string(b), `"cp2"`, `"cp1"`, 1)), 0o600)
		}, "does not unwrap"},
		{"no data key", func(t *testing.T, sh *Shared) {
			os.Remove(filepath.Join(sh.Dir, "cp1", DataKeyFile))
		}, "its wrapped data key"},
		{"a file added", func(t *testing.T, sh *Shared) {
			os.WriteFile(filepath.Join(sh.Dir, "cp1", "extra"), []byte("x"), 0o600)
		}, "not one of its files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, sh := sharedPair(t)
			big := strings.Repeat("p", chunkSize+100)
			commit(t, a, "cp1", map[string]string{"checkpoint.img": "state", "pages.img": big})
			commit(t, a, "cp2", map[string]string{"checkpoint.img": "state", "pages.img": big})
			for _, n := range []string{"cp1", "cp2"} {
				if _, err := a.Export(n, sh); err != nil {
					t.Fatal(err)
				}
			}
			tc.modify(t, sh)
			err := b.Import("cp1", sh)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("import: %v, want %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(b.Dir); len(ents) > 1 { // .verified at most
				for _, e := range ents {
					if e.Name() != verifiedDir {
						t.Fatalf("left in the node's store: %s", e.Name())
					}
				}
			}
		})
	}
	// Another cluster's key: refused.
	a, b, sh := sharedPair(t)
	commit(t, a, "cp1", map[string]string{"pages.img": "p"})
	a.Export("cp1", sh)
	_, _, other := sharedPair(t)
	other.Dir = sh.Dir
	if err := b.Import("cp1", other); err == nil || !strings.Contains(err.Error(), "not the cluster checkpoint key") {
		t.Fatalf("another key: %v", err)
	}
}
