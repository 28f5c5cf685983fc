package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Store is asked by the digest of the bytes read: one byte changed (same
// size), another digest; an input that could not be read whole has none.
func TestInputDigest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.yaml")
	os.WriteFile(path, []byte(family), 0o644)
	a := readInput(dir).digest()
	os.WriteFile(path, []byte(strings.Replace(family, "1Gi", "2Gi", 1)), 0o644)
	b := readInput(dir).digest()
	if a == "" || b == "" || a == b {
		t.Fatalf("digests: %q %q", a, b)
	}
	in := readInput(dir)
	in.problems = []error{errors.New("unreadable")}
	if d := in.digest(); d != "" {
		t.Fatalf("an input with problems has digest %q", d)
	}
}
