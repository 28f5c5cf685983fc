package privdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	private := mk("private", 0o700)
	readable := mk("readable", 0o755)
	writable := mk("writable", 0o777)
	link := filepath.Join(base, "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	me := os.Geteuid()
	for _, tc := range []struct {
		name, dir string
		owner     int
		forbid    os.FileMode
		want      string // "" accepted; else a part of the error
	}{
		{"private", private, me, Private, ""},
		{"private, others may read", readable, me, Private, "has mode 0755: others may enter or read it"},
		{"store, others may read", readable, me, NoOthersWrite, ""},
		{"store, others may write", writable, me, NoOthersWrite, "has mode 0777: others may write to it"},
		{"another owner", private, me + 1, Private, "not uid"},
		{"a symlink to a good directory", link, me, Private, "not a directory (a symlink?)"},
		{"a file", file, me, Private, "not a directory"},
		{"missing", filepath.Join(base, "none"), me, Private, "no such file"},
	} {
		err := Check(tc.dir, tc.owner, tc.forbid)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func TestEnsure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := Ensure(dir, Private); err != nil {
		t.Fatalf("a new directory: %v", err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v, %v; want mode 0700", fi.Mode(), err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(dir, Private); err == nil {
		t.Fatal("an existing directory others may enter was accepted")
	}
}
