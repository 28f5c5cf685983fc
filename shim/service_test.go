package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadSmallFile(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "resolv.conf")
	os.WriteFile(ok, []byte("search a\n"), 0o644)
	if b, err := readSmallFile(ok, 64); err != nil || string(b) != "search a\n" {
		t.Fatalf("%q %v", b, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readSmallFile(fifo, 64); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO must be refused at once: %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 100), 0o644)
	if _, err := readSmallFile(big, 64); err == nil {
		t.Error("a file over the limit must be refused")
	}
	link := filepath.Join(dir, "link")
	os.Symlink(ok, link)
	if _, err := readSmallFile(link, 64); err == nil {
		t.Error("a symlink must not be followed")
	}
}
