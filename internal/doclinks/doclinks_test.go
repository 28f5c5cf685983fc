package doclinks

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	files := []File{
		{"README.md", "# agentbox\n## Quick start\nSee [docs](docs/a.md), [the start](#quick-start), [b](docs/a.md#the-b-part), [ex](examples/x.yaml).\n" +
			"`[not](a-link.md)`\n```\n[not](either.md)\n```\n[web](https://example.com/x)\n"},
		{"docs/a.md", "# A\n## The `b` part!\n[back](../README.md#agentbox) [gone](missing.md) [bad](../README.md#nope) [out](../../x.md) [dir](../examples)\n"},
	}
	exists := func(p string) bool { return p == "examples/x.yaml" || p == "examples" }
	got := Check(files, exists)
	want := []string{"docs/a.md:3: missing.md: no such file", "docs/a.md:3: ../README.md#nope: no heading #nope", "docs/a.md:3: ../../x.md: outside the repository"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{"Quickstart (one command, as root, on a fresh machine)": "quickstart-one-command-as-root-on-a-fresh-machine",
		"On a node: `agentbox install`": "on-a-node-agentbox-install", "Suspend, resume and start from a template": "suspend-resume-and-start-from-a-template"} {
		if got := Slug(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// TestRepositoryLinks: every link between the repository's Markdown files
// resolves.
func TestRepositoryLinks(t *testing.T) {
	root := "../.."
	var files []File
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && (name == ".git" || name == "_output" || name == "node_modules" || name == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".md") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			files = append(files, File{filepath.ToSlash(rel), string(b)})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Stat(filepath.Join(root, p)); return err == nil }
	for _, p := range Check(files, exists) {
		t.Error(p)
	}
	if len(files) < 10 {
		t.Fatalf("only %d Markdown files found", len(files))
	}
}

// TestHackHelp: each command the docs send users to answers --help with
// what it does and says what it installs (or which command does), with
// nothing set up: help needs no cache, no root and no daemon.
func TestHackHelp(t *testing.T) {
	for _, s := range []string{"quickstart", "test", "setup", "bench", "pycompat", "critest", "kube", "containerd", "images", "e2e"} {
		cmd := exec.Command("bash", filepath.Join("../../hack", s+".sh"), "--help")
		cmd.Env = append(os.Environ(), "AGENTBOX_CACHE="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) == 0 {
			t.Errorf("hack/%s.sh --help: %v\n%s", s, err, out)
			continue
		}
		if s != "e2e" && s != "containerd" && s != "images" && !strings.Contains(strings.ToLower(string(out)), "install") {
			t.Errorf("hack/%s.sh --help does not say what it installs:\n%s", s, out)
		}
	}
}
