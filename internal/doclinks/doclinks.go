// Package doclinks checks the links between the repository's Markdown
// files: each relative link names a file that exists, and each #anchor a
// heading of that file (GitHub's anchors). Its test runs on the
// repository; the checker is pure.
package doclinks

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// File is a Markdown file: its path (slash-separated, relative to the
// repository's root) and its text.
type File struct {
	Path, Text string
}

var (
	link       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	inlineCode = regexp.MustCompile("`[^`]*`")
	punct      = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// Slug is GitHub's anchor for a heading's text.
func Slug(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = strings.ReplaceAll(s, "`", "")
	s = punct.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// line is a line outside fenced code blocks, numbered from 1.
type line struct {
	n    int
	text string
}

// lines are a file's lines outside fenced code blocks.
func lines(text string) []line {
	var out []line
	fenced := false
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line{i + 1, l})
		}
	}
	return out
}

// Anchors are a file's heading anchors.
func Anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range lines(text) {
		if !strings.HasPrefix(l.text, "#") {
			continue
		}
		s := Slug(strings.TrimLeft(l.text, "#"))
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// Check returns a problem for each link of files that names a file not
// in exists (or files), or an anchor that file lacks. exists says
// whether a path (not Markdown, or a directory) is in the repository.
func Check(files []File, exists func(string) bool) []string {
	byPath := map[string]File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	var problems []string
	for _, f := range files {
		for _, l := range lines(f.Text) {
			for _, m := range link.FindAllStringSubmatch(inlineCode.ReplaceAllString(l.text, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				p := f.Path
				if file != "" {
					p = path.Clean(path.Join(path.Dir(f.Path), file))
				}
				where := fmt.Sprintf("%s:%d: %s", f.Path, l.n, target)
				if strings.HasPrefix(p, "../") {
					problems = append(problems, where+": outside the repository")
					continue
				}
				t, isMD := byPath[p]
				if !isMD && !exists(p) {
					problems = append(problems, where+": no such file")
					continue
				}
				if anchor != "" && (!isMD || !Anchors(t.Text)[anchor]) {
					problems = append(problems, where+": no heading #"+anchor)
				}
			}
		}
	}
	return problems
}
