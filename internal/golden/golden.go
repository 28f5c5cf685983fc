// Package golden checks a generated file against the one committed: tests
// of generators call Check, and -update (the caller's flag) rewrites it.
package golden

import (
	"os"
	"testing"
)

// Check fails t when the file at path is not want, naming the command
// that regenerates it; with update, it writes want there first.
func Check(t *testing.T, path, want string, update bool, regenerate string) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: %s", path, regenerate)
	}
}
