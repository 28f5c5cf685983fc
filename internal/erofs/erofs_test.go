package erofs

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	reader "gvisor.dev/gvisor/pkg/erofs"
)

func file(name string, mode fs.FileMode, content string) *Node {
	return &Node{Name: name, Mode: mode, UID: 1, GID: 2, Size: int64(len(content)),
		Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(content)), nil }}
}

func dir(name string, children ...*Node) *Node {
	return &Node{Name: name, Mode: fs.ModeDir | 0o755, Children: children}
}

// image writes root and opens it with gVisor's own reader.
func image(t *testing.T, root *Node) *reader.Image {
	t.Helper()
	p := filepath.Join(t.TempDir(), "img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Write(f, root, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := f.Stat(); st.Size() != n || n%blockSize != 0 {
		t.Fatalf("wrote %d bytes, file has %d", n, st.Size())
	}
	f.Close()
	f, err = os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	img, err := reader.OpenImage(f)
	if err != nil {
		t.Fatalf("gVisor refused the image: %v", err)
	}
	t.Cleanup(img.Close)
	return img
}

func lookup(t *testing.T, img *reader.Image, path string) reader.Inode {
	t.Helper()
	ino, err := img.Inode(img.RootNid())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Split(strings.Trim(path, "/"), "/") {
		if name == "" {
			continue
		}
		nid, err := ino.Lookup(name)
		if err != nil {
			t.Fatalf("lookup %s: %v", path, err)
		}
		if ino, err = img.Inode(nid); err != nil {
			t.Fatalf("inode of %s: %v", path, err)
		}
	}
	return ino
}

func content(t *testing.T, ino reader.Inode) string {
	t.Helper()
	rs, err := ino.DataRanges()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ino.DataOffset(); err != nil {
		t.Fatalf("gVisor cannot map the file: %v", err)
	}
	return string(rs[0].Bytes) + string(rs[1].Bytes)
}

func TestWriteReadByGVisor(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 3*blockSize/16+7) // spans four blocks
	var many []*Node
	for i := 0; i < 400; i++ { // names enough for several directory blocks
		many = append(many, file(fmt.Sprintf("entry-%03d-%s", i, strings.Repeat("x", 40)), 0o644, fmt.Sprint(i)))
	}
	mtime := time.Unix(1700000000, 5)
	bin := file("pause", 0o755, "\x7fELF...")
	bin.ModTime = mtime
	root := dir("",
		dir("bin", bin, &Node{Name: "sh", Mode: fs.ModeSymlink | 0o777, Target: "pause"}),
		dir("etc", file("empty", 0o600, ""), file("big", 0o644, big)),
		dir("many", many...),
		&Node{Name: "-dash", Mode: fs.ModeSetuid | 0o755, Size: 1, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("d")), nil }},
		dir("emptydir"),
	)
	img := image(t, root)

	r := lookup(t, img, "/")
	if !r.IsDir() || r.Nlink() != 2+4 {
		t.Errorf("root: dir %v nlink %d, want a directory with 6 links", r.IsDir(), r.Nlink())
	}
	var names []string
	if err := r.IterDirents(func(name string, _ uint8, nid uint64) error {
		names = append(names, name)
		if name == ".." && nid != r.Nid() {
			t.Errorf("the root's .. is %d, not itself (%d)", nid, r.Nid())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names, " "), "-dash . .. bin emptydir etc many"; got != want {
		t.Errorf("root entries %q, want %q (sorted, . and .. included)", got, want)
	}
	p := lookup(t, img, "/bin/pause")
	if got := content(t, p); got != "\x7fELF..." {
		t.Errorf("/bin/pause holds %q", got)
	}
	if p.Mode() != 0o100755 || p.UID() != 1 || p.GID() != 2 || p.Mtime() != uint64(mtime.Unix()) || p.MtimeNsec() != 5 {
		t.Errorf("/bin/pause: mode %o uid %d gid %d mtime %d.%d", p.Mode(), p.UID(), p.GID(), p.Mtime(), p.MtimeNsec())
	}
	if l := lookup(t, img, "/bin/sh"); !l.IsSymlink() {
		t.Error("/bin/sh is not a symlink")
	} else if target, err := l.Readlink(); err != nil || target != "pause" {
		t.Errorf("/bin/sh -> %q, %v", target, err)
	}
	if got := content(t, lookup(t, img, "/etc/big")); got != big {
		t.Errorf("/etc/big: %d bytes back of %d", len(got), len(big))
	}
	if e := lookup(t, img, "/etc/empty"); e.Size() != 0 || e.Mode() != 0o100600 {
		t.Errorf("/etc/empty: size %d mode %o", e.Size(), e.Mode())
	}
	if d := lookup(t, img, "/-dash"); d.Mode() != 0o104755 {
		t.Errorf("/-dash: mode %o, want setuid 0755", d.Mode())
	}
	m := lookup(t, img, "/many")
	if m.Size() <= blockSize {
		t.Fatalf("/many is %d bytes: the test needs a directory of several blocks", m.Size())
	}
	for i, n := range many {
		if got := content(t, lookup(t, img, "/many/"+n.Name)); got != fmt.Sprint(i) {
			t.Fatalf("/many/%s holds %q", n.Name, got)
		}
	}
	count := 0
	if err := m.IterDirents(func(string, uint8, uint64) error { count++; return nil }); err != nil || count != len(many)+2 {
		t.Errorf("/many lists %d entries (%v), want %d", count, err, len(many)+2)
	}
	if e := lookup(t, img, "/emptydir"); e.Size() == 0 {
		t.Error("an empty directory has no . and ..")
	} else if _, err := e.Lookup("x"); err == nil {
		t.Error("an empty directory found an entry")
	}
}

func TestWriteRefuses(t *testing.T) {
	short := file("short", 0o644, "abc")
	short.Size = 10
	long := file("long", 0o644, "abcdef")
	long.Size = 2
	for _, c := range []struct {
		name string
		root *Node
		lim  Limits
		want string
	}{
		{"a file root", file("f", 0o644, ""), Limits{}, "root is not a directory"},
		{"a fifo", dir("", &Node{Name: "p", Mode: fs.ModeNamedPipe | 0o644}), Limits{}, "only directories, regular files and symlinks"},
		{"a device", dir("", &Node{Name: "null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666}), Limits{}, "only directories"},
		{"two entries of one name", dir("", file("a", 0o644, ""), file("a", 0o644, "")), Limits{}, "two entries named"},
		{"a name with a slash", dir("", file("a/b", 0o644, "")), Limits{}, "is named"},
		{"a name of dots", dir("", file("..", 0o644, "")), Limits{}, "is named"},
		{"a long name", dir("", file(strings.Repeat("n", 256), 0o644, "")), Limits{}, "is named"},
		{"an empty symlink", dir("", &Node{Name: "l", Mode: fs.ModeSymlink}), Limits{}, "target of 0 bytes"},
		{"a file shorter than its size", dir("", short), Limits{}, "changed: 3 bytes, not 10"},
		{"a file longer than its size", dir("", long), Limits{}, "changed: 3 bytes, not 2"},
		{"too many files", dir("", file("a", 0o644, ""), file("b", 0o644, "")), Limits{Files: 2}, "more than 2 files"},
		{"too many bytes", dir("", file("a", 0o644, strings.Repeat("x", 3*blockSize))), Limits{Bytes: 4 * blockSize}, "exceed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Write(io.Discard, c.root, c.lim)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Write: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestWriteIsDeterministic: the same tree gives the same bytes, so a node's
// cached image is the image of what it was built from.
func TestWriteIsDeterministic(t *testing.T) {
	tree := func() *Node {
		return dir("", file("b", 0o644, "2"), file("a", 0o644, "1"), dir("d", file("c", 0o600, "3")))
	}
	var a, b bytes.Buffer
	if _, err := Write(&a, tree(), Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(&b, tree(), Limits{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes of one tree differ")
	}
}
