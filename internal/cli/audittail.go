package cli

// agentbox audit tail: following trails, filtered, in lines or JSON.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/audit"
)

// tailFilter selects records.
type tailFilter struct {
	pod, role, sandbox string
	class              int
}

func parseClass(s string) (int, error) {
	switch strings.ToLower(s) {
	case "":
		return -1, nil
	case "file":
		return audit.ClassFileSystem, nil
	case "process":
		return audit.ClassProcess, nil
	case "network":
		return classNetworkAny, nil
	case "agentbox", "base":
		return classAgentbox, nil
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil {
		return 0, fmt.Errorf("--class %q: want file, process, network, agentbox or a class_uid", s)
	}
	return n, nil
}

func (f tailFilter) match(r *audit.Record) bool {
	switch {
	case f.class == classNetworkAny:
		if r.ClassUID/1000 != 4 {
			return false
		}
	case f.class == classAgentbox:
		if !strings.HasPrefix(r.Event, "agentbox/") {
			return false
		}
	case f.class >= 0 && r.ClassUID != f.class:
		return false
	}
	if f.role != "" && r.Role != f.role {
		return false
	}
	if f.sandbox != "" && r.Sandbox != f.sandbox {
		return false
	}
	if f.pod != "" {
		ns, name, ok := strings.Cut(f.pod, "/")
		if !ok {
			name, ns = ns, ""
		}
		if r.PodName != name || (ns != "" && r.PodNamespace != ns) {
			return false
		}
	}
	return true
}

func auditTail(c *cli.Context) error {
	class, err := parseClass(c.String("class"))
	if err != nil {
		return cli.Exit(err, 2)
	}
	f := tailFilter{pod: c.String("pod"), role: c.String("role"), sandbox: c.String("sandbox"), class: class}
	paths := c.Args().Slice()
	if len(paths) == 0 {
		cfg, err := loadConfig(c)
		if err != nil {
			return cli.Exit(err, 1)
		}
		paths = []string{cfg.Audit.Dir}
	}
	out, err := output(c, "text", "json")
	if err != nil {
		return err
	}
	asJSON := out == "json"
	offsets := map[string]int64{}
	for {
		trails, err := audit.FindTrails(paths...)
		if err != nil {
			return cli.Exit(err, 1)
		}
		for _, t := range trails {
			for _, file := range t.Files {
				off, err := tailFile(c.App.Writer, file, offsets[file], f, asJSON)
				if err != nil {
					return cli.Exit(err, 1)
				}
				offsets[file] = off
			}
		}
		if !c.Bool("follow") {
			return nil
		}
		select {
		case <-c.Context.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tailFile prints whole lines from off and returns the new offset. A
// rotated file keeps its name's content, so offsets stay valid.
func tailFile(w io.Writer, file string, off int64, f tailFilter, asJSON bool) (int64, error) {
	fh, err := os.Open(file)
	if err != nil {
		if os.IsNotExist(err) {
			return off, nil // rotated away: its segment is listed next time
		}
		return off, err
	}
	defer fh.Close()
	if _, err := fh.Seek(off, io.SeekStart); err != nil {
		return off, err
	}
	br := bufio.NewReaderSize(fh, 1<<16)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return off, nil // a partial line waits for its end
		}
		off += int64(len(line))
		r, perr := audit.ParseLine(line)
		if perr != nil {
			fmt.Fprintf(w, "%s: unreadable record at byte %d\n", filepath.Base(file), off-int64(len(line)))
			continue
		}
		if !f.match(r) {
			continue
		}
		if asJSON {
			w.Write(line)
			continue
		}
		fmt.Fprintln(w, formatRecord(r))
	}
}

// formatRecord renders a record on one line for people. Every field came
// from the sandbox or from names the agent chose: a value with anything
// but graphic, unquoted characters is quoted with Go escapes, so a file
// name with a newline or a forged "field=value" cannot pass for another
// record or field. -o json prints the record exactly.
func formatRecord(r *audit.Record) string {
	var b strings.Builder
	t := r.Time
	if len(t) > 23 {
		t = t[11:23]
	}
	fmt.Fprintf(&b, "%s %s #%d %-26s", esc(t), esc(r.Sandbox), r.Seq, esc(r.Event))
	if r.Role != "" {
		fmt.Fprintf(&b, " role=%s", esc(r.Role))
	}
	if r.PodName != "" {
		fmt.Fprintf(&b, " pod=%s/%s", esc(r.PodNamespace), esc(r.PodName))
	}
	if p := r.Process; p != nil {
		if p.PID != 0 {
			fmt.Fprintf(&b, " pid=%d", p.PID)
		}
		if p.Name != "" {
			fmt.Fprintf(&b, " comm=%s", esc(p.Name))
		}
		if len(p.Argv) > 0 {
			q := make([]string, len(p.Argv))
			for i, a := range p.Argv {
				q[i] = strconv.QuoteToGraphic(a)
			}
			fmt.Fprintf(&b, " argv=[%s]", strings.Join(q, " "))
		}
		if p.ExitSts != nil {
			fmt.Fprintf(&b, " exit=%d", *p.ExitSts)
		}
	}
	if r.File != nil {
		fmt.Fprintf(&b, " path=%s", esc(r.File.Path))
		if r.File.Flags != "" {
			fmt.Fprintf(&b, " flags=%s", esc(r.File.Flags))
		}
		if r.File.Mode != 0 && r.ClassUID == audit.ClassFileSystem && r.ActivityName != "Open" {
			fmt.Fprintf(&b, " mode=%#o", r.File.Mode)
		}
	}
	if r.Target != nil {
		fmt.Fprintf(&b, " to=%s", esc(r.Target.Path))
	}
	if d := r.Dst; d != nil {
		switch {
		case d.IP != "":
			fmt.Fprintf(&b, " dst=%s:%d", esc(d.IP), d.Port)
		case d.Path != "":
			fmt.Fprintf(&b, " dst=%s", esc(d.Path))
		default:
			fmt.Fprintf(&b, " family=%s type=%s", esc(d.Family), esc(d.Type))
		}
	}
	if s := r.Src; s != nil && s.IP != "" {
		// The sandbox's end: a connect's local port is the client port of
		// the gateway's record for that connection.
		fmt.Fprintf(&b, " src=%s:%d", esc(s.IP), s.Port)
	}
	if r.Status != "" {
		fmt.Fprintf(&b, " %s", esc(r.Status))
		if r.Errno != 0 {
			fmt.Fprintf(&b, "(errno %d)", r.Errno)
		}
	}
	if r.Message != "" {
		fmt.Fprintf(&b, " %s", strconv.QuoteToGraphic(r.Message))
	}
	return b.String()
}

// esc returns s as is when every rune is graphic and none is a space, a
// quote, a backslash or '=', and Go-quoted (strconv.QuoteToGraphic)
// otherwise.
func esc(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsGraphic(r) || unicode.IsSpace(r) || r == '"' || r == '\\' || r == '=' || r == '\'' || r == '`' {
			return strconv.QuoteToGraphic(s)
		}
	}
	return s
}
