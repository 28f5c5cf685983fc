package doclinks

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Command is a command line a page shows in a code block: where it is
// ("docs/roles.md:61") and the line as a reader would paste it ("$ "
// taken off, continuation lines joined; its comment and redirections
// kept, for a shell to run).
type Command struct {
	At, Line string
}

// Commands are the lines of files' fenced code blocks that run program
// (its name, then a space). A usage synopsis (alternatives in brackets,
// "[--root / | ...]") is not a command. In file order, then line order.
func Commands(files []File, program string) []Command {
	var out []Command
	for _, f := range files {
		in := false
		lines := strings.Split(f.Text, "\n")
		for i := 0; i < len(lines); i++ {
			l := strings.TrimSpace(lines[i])
			if strings.HasPrefix(l, "```") {
				in = !in
				continue
			}
			l = strings.TrimPrefix(l, "$ ")
			if !in || !strings.HasPrefix(l, program+" ") {
				continue
			}
			at := fmt.Sprintf("%s:%d", f.Path, i+1)
			for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
				i++
				l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
			}
			if strings.Contains(l, " | ") && strings.Contains(l, "[") {
				continue // a synopsis
			}
			out = append(out, Command{At: at, Line: l})
		}
	}
	return out
}

// Pages reads the repository's README.md and docs/ pages below root,
// docs/reference/ (generated from the code) left out, sorted by path.
func Pages(root string) ([]File, error) {
	var files []File
	add := func(p string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		files = append(files, File{Path: filepath.ToSlash(rel), Text: string(b)})
		return nil
	}
	if err := add(filepath.Join(root, "README.md")); err != nil {
		return nil, err
	}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "reference" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			return add(p)
		}
		return nil
	})
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, err
}
