package doclinks

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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

// refusals are the format strings of the errors agentbox refuses with: an
// errkind kind wrapping fmt.Errorf or errors.New of a literal, in the
// shim and internal/ (tests and the e2e suite aside).
func refusals(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range []string{"../../shim", "../../internal"} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "e2e" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "errkind" || sel.Sel.Name == "Refusal" {
					return true
				}
				inner, ok := call.Args[0].(*ast.CallExpr)
				if !ok || len(inner.Args) == 0 {
					return true
				}
				if lit, ok := inner.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					out[s] = fset.Position(lit.Pos()).String()
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

var verb = regexp.MustCompile(`%[-+# 0-9.]*[a-zA-Z]`)

// TestTroubleshootingCoversRefusals: every refusal the code gives is in
// docs/troubleshooting.md: the longest fixed part of its message (between
// the values it formats in) is on the page.
func TestTroubleshootingCoversRefusals(t *testing.T) {
	page, err := os.ReadFile("../../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	rs := refusals(t)
	if len(rs) < 20 {
		t.Fatalf("found only %d refusals: the walk is wrong", len(rs))
	}
	for format, where := range rs {
		longest := ""
		for _, part := range verb.Split(format, -1) {
			if len(strings.TrimSpace(part)) > len(strings.TrimSpace(longest)) {
				longest = part
			}
		}
		longest = strings.TrimSpace(longest)
		if len(longest) < 4 {
			continue // a message that is all values (a wrapped error)
		}
		if !strings.Contains(string(page), longest) {
			t.Errorf("%s: %q is not in docs/troubleshooting.md (looked for %q)", where, format, longest)
		}
	}
}

// TestReadmeLinksEveryPage: each page under docs/ is linked from the
// README, where a newcomer starts.
func TestReadmeLinksEveryPage(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir("../../docs", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".md") {
			return err
		}
		rel, _ := filepath.Rel("../..", p)
		if !strings.Contains(string(readme), "]("+filepath.ToSlash(rel)+")") {
			t.Errorf("README.md does not link %s", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// evidencePages hold what tests show: the how-to pages say what agentbox
// does, and link here for what shows it.
var evidencePages = map[string]bool{
	"docs/testing.md":            true,
	"docs/benchmarks.md":         true,
	"docs/benchmarks-history.md": true,
}

var testName = regexp.MustCompile("`(?:go test [^`]*-run )?'?\\^?(Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_*|]*")

// TestHowToPagesNameNoTests: a test's name in a how-to page is evidence in
// the middle of the steps; it belongs in docs/testing.md or the benchmark
// pages.
func TestHowToPagesNameNoTests(t *testing.T) {
	pages, err := Pages("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range pages {
		if evidencePages[p.Path] {
			continue
		}
		checked++
		for i, l := range strings.Split(p.Text, "\n") {
			if m := testName.FindString(l); m != "" {
				t.Errorf("%s:%d names a test (%s): say it in docs/testing.md and link there", p.Path, i+1, m)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d pages checked", checked)
	}
}

func TestTestNamePattern(t *testing.T) {
	for s, want := range map[string]bool{
		"see `TestKubeRelease` here":                     true,
		"`go test -tags e2e -run TestHostileAuditFlood`": true,
		"`FuzzHTTPFront` sends":                          true,
		"`hack/test.sh` runs everything":                 false,
		"a Testing page":                                 false,
	} {
		if got := testName.MatchString(s); got != want {
			t.Errorf("%q: matched %v, want %v", s, got, want)
		}
	}
}
