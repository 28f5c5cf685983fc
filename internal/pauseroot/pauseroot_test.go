package pauseroot

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	reader "gvisor.dev/gvisor/pkg/erofs"
)

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// read returns the content of path in the image, following no symlink.
func read(t *testing.T, image, path string) (string, bool) {
	t.Helper()
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	img, err := reader.OpenImage(f)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	ino, err := img.Inode(img.RootNid())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Split(strings.Trim(path, "/"), "/") {
		nid, err := ino.Lookup(name)
		if err != nil {
			return "", false
		}
		if ino, err = img.Inode(nid); err != nil {
			t.Fatal(err)
		}
	}
	if ino.IsSymlink() {
		target, err := ino.Readlink()
		if err != nil {
			t.Fatal(err)
		}
		return "-> " + target, true
	}
	rs, err := ino.DataRanges()
	if err != nil {
		t.Fatal(err)
	}
	return string(rs[0].Bytes), true
}

func TestImageOfOneLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the image directory is root's")
	}
	base := t.TempDir()
	lower, upper, dir := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "images")
	write(t, filepath.Join(lower, "pause"), "\x7fELF pause", 0o755)
	write(t, filepath.Join(lower, "etc/passwd"), "root:x:0:0::/:/pause\n", 0o644)
	if err := os.Symlink("/pause", filepath.Join(lower, "sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	path, err := Image(dir, []string{upper, lower})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := read(t, path, "/pause"); !ok || got != "\x7fELF pause" {
		t.Errorf("/pause: %q, %v", got, ok)
	}
	if got, _ := read(t, path, "/sh"); got != "-> /pause" {
		t.Errorf("/sh: %q, want the symlink kept as one", got)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o400 {
		t.Fatalf("image %v: %v", st, err)
	}
	// A second pod of the same image (a new, empty upper) finds it.
	upper2 := filepath.Join(base, "upper2")
	os.Mkdir(upper2, 0o755)
	again, err := Image(dir, []string{upper2, lower})
	if err != nil || again != path {
		t.Errorf("the same layers gave %q (%v), not %q", again, err, path)
	}
	// The same tree from other layers (another node's snapshot of the
	// image, unpacked at another time) is the same image, by the same name.
	copyDir := filepath.Join(base, "copy")
	write(t, filepath.Join(copyDir, "etc/passwd"), "root:x:0:0::/:/pause\n", 0o644)
	write(t, filepath.Join(copyDir, "pause"), "\x7fELF pause", 0o755)
	os.Symlink("/pause", filepath.Join(copyDir, "sh"))
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(copyDir, "pause"), old, old)
	os.Chtimes(copyDir, old, old)
	if same, err := Image(dir, []string{copyDir}); err != nil || same != path {
		t.Errorf("a copy of the tree gave %q (%v), want %q: images are named by their bytes", same, err, path)
	}
	// A pod whose upper holds something is another tree: its own image.
	write(t, filepath.Join(upper2, "extra"), "x", 0o644)
	other, err := Image(dir, []string{upper2, lower})
	if err != nil || other == path {
		t.Errorf("a non-empty upper gave %q (%v): want an image of its own", other, err)
	}
	// The directory is root's alone.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Image(dir, []string{lower}); err == nil || !strings.Contains(err.Error(), "others may enter") {
		t.Errorf("a directory others may read: %v", err)
	}
}

func TestImageMergesLayersAsOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting the layers needs root")
	}
	base := t.TempDir()
	top, bottom, dir := filepath.Join(base, "top"), filepath.Join(base, "bottom"), filepath.Join(base, "images")
	write(t, filepath.Join(bottom, "pause"), "old", 0o755)
	write(t, filepath.Join(bottom, "gone"), "hidden", 0o644)
	write(t, filepath.Join(top, "pause"), "new", 0o755)
	if err := unix.Mknod(filepath.Join(top, "gone"), unix.S_IFCHR, 0); err != nil { // a whiteout
		t.Fatal(err)
	}
	path, err := Image(dir, []string{top, bottom})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := read(t, path, "/pause"); got != "new" {
		t.Errorf("/pause: %q, want the top layer's", got)
	}
	if _, ok := read(t, path, "/gone"); ok {
		t.Error("/gone is in the image: the whiteout did not hide it")
	}
	var names []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		names = append(names, filepath.Ext(e.Name()))
	}
	if strings.Join(names, " ") != ".erofs .layers" && strings.Join(names, " ") != ".layers .erofs" {
		t.Errorf("the directory holds %v after a build, want the image and its layers' file (the merge mount removed)", names)
	}
}

func TestImageRefuses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the image directory is root's")
	}
	base := t.TempDir()
	empty := filepath.Join(base, "empty")
	os.Mkdir(empty, 0o755)
	dir := filepath.Join(base, "images")
	if _, err := Image(dir, []string{empty}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty rootfs: %v", err)
	}
	fifo := filepath.Join(base, "fifo")
	write(t, filepath.Join(fifo, "pause"), "x", 0o755)
	if err := unix.Mkfifo(filepath.Join(fifo, "p"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Image(dir, []string{fifo}); err == nil || !strings.Contains(err.Error(), "only directories, regular files and symlinks") {
		t.Errorf("a rootfs with a fifo: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused build left %d files", len(ents))
	}
	if _, err := Image(dir, []string{filepath.Join(base, "missing")}); err == nil {
		t.Error("a missing layer was accepted")
	}
}

func TestPruneKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	// Images are named by a digest: image i's is i in 64 hex digits.
	digest := func(i int) string { return fmt.Sprintf("%064x", i) }
	for i := 0; i < Keep+3; i++ {
		p := filepath.Join(dir, digest(i)+".erofs")
		write(t, p, "x", 0o400)
		os.Chtimes(p, now, now.Add(time.Duration(i)*time.Minute))
	}
	write(t, filepath.Join(dir, "k1.layers"), digest(0)+"\n", 0o600)
	write(t, filepath.Join(dir, "k2.layers"), digest(1)+"\n", 0o600)
	stale := filepath.Join(dir, "build-1")
	write(t, stale, "half", 0o600)
	os.Chtimes(stale, now, now.Add(-time.Hour))
	keep := filepath.Join(dir, digest(0)+".erofs") // the oldest, but just used
	prune(dir, keep)
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != Keep+1 || names[0] != digest(0)+".erofs" || names[Keep] != "k1.layers" || strings.Contains(strings.Join(names, " "), "build-") {
		t.Errorf("left %v: want image 0 and the %d newest, the layers' file naming a kept image, no stale build", names, Keep-1)
	}
}
