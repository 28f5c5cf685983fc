package structure

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxLines is the longest a Go file may be.
const maxLines = 500

// longFileMark, in a file's comments with a reason after it, lets it be
// longer.
const longFileMark = "agentbox:long-file:"

// TestFileLength: no Go file the module keeps (generated ones aside) is
// over maxLines lines, unless it says why.
func TestFileLength(t *testing.T) {
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git tree: %v", err)
	}
	files, err := exec.Command("git", "-C", strings.TrimSpace(string(root)), "ls-files", "*.go").Output()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range strings.Fields(string(files)) {
		path := filepath.Join(strings.TrimSpace(string(root)), f)
		lines, generated, why, err := measure(path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree
			}
			t.Fatal(err)
		}
		n++
		switch {
		case lines <= maxLines, generated:
		case why == "":
			t.Errorf("%s: %d lines, more than %d: split it by concern (or say why not: // %s REASON)", f, lines, maxLines, longFileMark)
		case len(why) < 20:
			t.Errorf("%s: %q is no reason", f, why)
		}
	}
	if n < 100 {
		t.Fatalf("measured only %d files: the walk is wrong", n)
	}
}

// measure counts a file's lines, and says whether it is generated and
// why it may be long.
func measure(path string) (lines int, generated bool, why string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines++
		l := s.Text()
		if strings.HasPrefix(l, "// Code generated ") && strings.HasSuffix(l, " DO NOT EDIT.") {
			generated = true
		}
		if _, rest, ok := strings.Cut(l, "// "+longFileMark); ok {
			why = strings.TrimSpace(rest)
		}
	}
	return lines, generated, why, s.Err()
}
