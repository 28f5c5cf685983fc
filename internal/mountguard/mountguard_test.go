package mountguard

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/policy"
)

// tree builds a real directory tree with traps: a symlink at several
// depths (relative, absolute, escaping), runtime file names used as
// directories and files.
func tree(t testing.TB) (root, outside string) {
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{"root/a/b", "root/hosts.d", "outside/etc"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"root/a/b/c", "root/hosts", "root/a/hostname", "outside/etc/shadow"} {
		if err := os.WriteFile(filepath.Join(base, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"root/link":       "a",        // relative, stays inside
		"root/a/up":       "../..",    // escapes
		"root/a/abs":      outside,    // absolute, outside
		"root/a/b/self":   ".",        // harmless, still a symlink
		"root/hosts.d/h":  "../hosts", // inside, to a file
		"root/a/b/shadow": "../../../outside/etc/shadow",
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(base, l)); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside
}

// model walks rel below root the way the policy demands: no symlink
// component, never above root. It returns the path reached, or ok=false.
func model(root, rel string) (string, bool) {
	if strings.HasPrefix(rel, "/") {
		return "", false // RESOLVE_BENEATH refuses absolute paths
	}
	cur := root
	depth := 0
	for _, c := range strings.Split(rel, "/") {
		switch c {
		case "", ".":
			if st, err := os.Lstat(cur); err != nil || !st.IsDir() {
				return "", false
			}
			continue
		case "..":
			if st, err := os.Lstat(cur); err != nil || !st.IsDir() {
				return "", false
			}
			if depth == 0 {
				return "", false
			}
			depth--
			cur = filepath.Dir(cur)
			continue
		}
		st, err := os.Lstat(cur)
		if err != nil || !st.IsDir() {
			return "", false
		}
		next := filepath.Join(cur, c)
		st, err = os.Lstat(next)
		if err != nil || st.Mode()&os.ModeSymlink != 0 {
			return "", false
		}
		cur, depth = next, depth+1
	}
	return cur, true
}

var components = []string{"a", "b", "c", "link", "up", "abs", "self", "hosts", "hosts.d", "h", "hostname", "shadow", "..", ".", "", "etc", "x"}

// checkOpen asserts the property: Open succeeds exactly when the model
// does, and then opens the file the model reached.
func checkOpen(t *testing.T, root, rel string) {
	t.Helper()
	want, ok := model(root, rel)
	fd, err := Open(root, rel)
	if err == nil {
		defer unix.Close(fd)
	}
	if ok != (err == nil) {
		t.Fatalf("Open(%q): err %v, model says ok=%v (%s)", rel, err, ok, want)
	}
	if !ok {
		return
	}
	var got, exp unix.Stat_t
	if err := unix.Fstat(fd, &got); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(want, &exp); err != nil {
		t.Fatal(err)
	}
	if got.Ino != exp.Ino || got.Dev != exp.Dev {
		t.Fatalf("Open(%q) opened another file than %s", rel, want)
	}
}

func TestOpenRandomPaths(t *testing.T) {
	root, _ := tree(t)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5000; i++ {
		n := 1 + r.IntN(5)
		parts := make([]string, n)
		for j := range parts {
			parts[j] = components[r.IntN(len(components))]
		}
		checkOpen(t, root, strings.Join(parts, "/"))
	}
	// The named traps, each on its own.
	for _, rel := range []string{"link/b/c", "a/up/outside/etc/shadow", "a/abs/etc/shadow", "a/b/self/c", "hosts.d/h", "a/b/shadow", "../outside/etc/shadow", "hosts/x", "a/b/c"} {
		checkOpen(t, root, rel)
	}
}

func FuzzOpen(f *testing.F) {
	for _, s := range []string{"a/b/c", "link/b/c", "a/up/x", "../outside", "a//b/./c", "hosts/hosts"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		if strings.ContainsRune(rel, 0) {
			return
		}
		root, _ := tree(t)
		checkOpen(t, root, rel)
	})
}

// A root with a symlink component is refused too: an admin's typo or a
// planted link must not move a host mount.
func TestOpenRootWithSymlink(t *testing.T) {
	root, _ := tree(t)
	if _, err := Open(filepath.Join(root, "link"), "b/c"); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a root through a symlink must be refused: %v", err)
	}
}

// TestStage mounts for real (root only): the staged mount is the checked
// file, hardened, and Release takes it away.
func TestStage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts)")
	}
	root, _ := tree(t)
	bundle := t.TempDir()
	st := New(bundle)
	dir, err := st.Stage(policy.Bind{Source: root + "/a", Root: root, Rel: "a", Kind: "dir", ReadOnly: true, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "b", "c")); err != nil || string(b) != "root/a/b/c" {
		t.Fatalf("staged dir does not show the source: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("read-only staging must refuse writes: %v", err)
	}
	file, err := st.Stage(policy.Bind{Source: root + "/hosts", Root: root, Rel: "hosts", Kind: "file", NoExec: true})
	if err != nil {
		t.Fatal(err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var opts string
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == file {
			opts = f[5]
		}
	}
	for _, o := range []string{"noexec", "nosuid", "nodev", "rw"} {
		if !strings.Contains(opts, o) {
			t.Errorf("staged file options %q lack %s", opts, o)
		}
	}
	// Kinds are checked on what was opened, and symlinks refused.
	if _, err := st.Stage(policy.Bind{Source: root + "/hosts", Root: root, Rel: "hosts", Kind: "dir"}); err == nil {
		t.Error("a file where a directory belongs must be refused")
	}
	if _, err := st.Stage(policy.Bind{Source: root + "/hosts.d/h", Root: root, Rel: "hosts.d/h", Kind: "file"}); err == nil {
		t.Error("a symlink must be refused")
	}
	if err := Release(st.Dir()); err != nil {
		t.Fatal(err)
	}
	mi, _ = os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), st.Dir()) {
		t.Fatalf("release left mounts:\n%s", mi)
	}
	if _, err := os.Stat(st.Dir()); !os.IsNotExist(err) {
		t.Fatalf("release left the staging directory: %v", err)
	}
	if err := Release(st.Dir()); err != nil {
		t.Fatalf("release twice: %v", err)
	}
}

// BenchmarkStage is the cost one accepted bind adds to a Create: resolve,
// clone, harden, attach, and its release at Delete.
func BenchmarkStage(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (mounts)")
	}
	root, _ := tree(b)
	bundle := b.TempDir()
	for i := 0; i < b.N; i++ {
		st := New(bundle)
		if _, err := st.Stage(policy.Bind{Source: root + "/hosts", Root: root, Rel: "hosts", Kind: "file", ReadOnly: true}); err != nil {
			b.Fatal(err)
		}
		if err := Release(st.Dir()); err != nil {
			b.Fatal(err)
		}
	}
}
