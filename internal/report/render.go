package report

import (
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// JSON writes the report as indented JSON.
func JSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// q quotes a value from the sandbox for a terminal: anything but graphic
// characters is shown with Go escapes, so a file name with a newline or
// an escape sequence cannot pass for another line or repaint the screen.
func q(s string) string {
	for _, r := range s {
		if !unicode.IsGraphic(r) || r == '"' || r == '\\' {
			return strconv.Quote(s)
		}
	}
	return s
}

func qs(l []string) string {
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = q(s)
	}
	return strings.Join(out, " ")
}

func rel(start, t time.Time) string {
	if t.IsZero() || start.IsZero() {
		return "?"
	}
	return fmt.Sprintf("+%.3fs", t.Sub(start).Seconds())
}

// Text writes the report for a terminal.
func Text(w io.Writer, rep *Report) error {
	ew := &errWriter{w: w}
	p := func(format string, args ...any) { fmt.Fprintf(ew, format, args...) }
	p("sandbox %s", q(rep.Sandbox))
	if rep.Pod != "" {
		p("  pod %s", q(rep.Pod))
	}
	p("  role %s (%s)\n", q(rep.Role), q(rep.PolicyDigest))
	p("%s .. %s (%s), %d records\n", rep.Start.UTC().Format(time.RFC3339Nano), rep.End.UTC().Format(time.RFC3339Nano), rep.End.Sub(rep.Start).Round(time.Millisecond), rep.Records)
	p("\nCHAIN  %s\n", verifyLine(rep.Verify))
	if rep.Exit != nil {
		p("EXIT   %s\n", q(rep.Exit.Message))
	}
	if len(rep.Turns) > 0 {
		p("\nMODEL TURNS\n")
		for _, tu := range rep.Turns {
			p("  %s #%d %s (%s) %d tokens", rel(rep.Start, tu.Time), tu.Seq, q(tu.Model), q(tu.API), tu.Tokens)
			if tu.StopReason != "" {
				p(", stop %s", q(tu.StopReason))
			}
			p(", client %s pid %d\n", q(tu.Client), tu.PID)
			if tu.Refused() {
				// What the agent had just read, next to what was refused.
				switch {
				case tu.Read != "":
					p("    after reading the result of %s: %s\n", q(tu.ReadCall), q(clipText(tu.Read, 400)))
				case tu.SentDigest != "":
					p("    it was sent sha256:%s (audit.model: content keeps what it had read)\n", tu.SentDigest)
				}
			}
			for _, c := range tu.Tools {
				p("    tool %s %s %s\n", q(c.Name), q(c.ID), q(c.Input))
				if len(c.Processes) > 0 {
					p("      started pid %v\n", c.Processes)
				}
				for _, m := range c.MCP {
					p("      called MCP %s #%d %s on %s: %s\n", rel(rep.Start, m.Time), m.Seq, q(m.Tool), q(m.Server), mcpOutcome(m))
				}
				for _, it := range c.Refusals {
					p("      REFUSED %s #%d %s %s\n", rel(rep.Start, it.Time), it.Seq, it.Event, q(it.Message))
				}
			}
		}
	}
	if len(rep.MCP) > 0 {
		p("\nMCP CALLS\n")
		for _, m := range rep.MCP {
			link := "not linked to a model's tool call"
			if m.ToolCall != "" {
				link = "for tool call " + q(m.ToolCall)
			}
			p("  %s #%d %s on %s: %s, %s\n", rel(rep.Start, m.Time), m.Seq, q(m.Tool), q(m.Server), mcpOutcome(m), link)
		}
	}
	p("\nPROCESSES\n")
	var tree func(ps []*Process, indent string)
	tree = func(ps []*Process, indent string) {
		for _, pr := range ps {
			p("%s%s\n", indent, procLine(pr))
			for _, e := range pr.Execs {
				p("%s    then exec %s\n", indent, q(e))
			}
			tree(pr.Children, indent+"  ")
		}
	}
	tree(rep.Processes, "  ")
	p("\nFILES CREATED, CHANGED AND DELETED\n")
	if len(rep.Files) == 0 {
		p("  none\n")
	}
	for _, d := range rep.Files {
		p("  %s/\n", q(d.Dir))
		for _, f := range d.Files {
			p("    %-8s %s%s  (%s pid %d %s)\n", f.Op, q(f.Path), changeTarget(f, q), rel(rep.Start, f.Time), f.PID, q(f.Comm))
		}
	}
	p("\nNETWORK BY HOST\n")
	if len(rep.Network) == 0 {
		p("  none\n")
	}
	for _, h := range rep.Network {
		p("  %s  lookups %d, allowed %d, denied %d  %s\n", q(h.Host), h.Lookups, h.Allowed, h.Denied, qs(h.Addresses))
		for _, r := range h.Requests {
			p("    %s\n", q(r))
		}
	}
	section := func(title string, items []Item) {
		p("\n%s\n", title)
		if len(items) == 0 {
			p("  none\n")
		}
		for _, it := range items {
			p("  %s #%d %s %s\n", rel(rep.Start, it.Time), it.Seq, it.Event, q(it.Message))
		}
	}
	section("REFUSALS AND DENIALS", rep.Refusals)
	section("LIMITS HIT", rep.Limits)
	section("GAPS", rep.Gaps)
	return ew.err
}

func changeTarget(f FileChange, quote func(string) string) string {
	switch {
	case f.Op == "renamed" && f.Target != "":
		return " -> " + quote(f.Target)
	case f.Op == "linked" && f.Target != "":
		return " -> " + quote(f.Target)
	case f.Op == "mode":
		return " " + f.Mode
	}
	return ""
}

func procLine(pr *Process) string {
	s := fmt.Sprintf("[%d] %s", pr.PID, q(pr.Name))
	if len(pr.Argv) > 0 {
		s += ": " + qs(pr.Argv)
	}
	switch {
	case pr.ExitCode != nil:
		s += fmt.Sprintf("  -> exit %d", *pr.ExitCode)
	case pr.Signal != nil:
		s += fmt.Sprintf("  -> killed by signal %d", *pr.Signal)
	default:
		s += "  (no exit recorded)"
	}
	return s
}

func verifyLine(v Verification) string {
	switch {
	case !v.Intact:
		return "BROKEN: " + v.Problem
	case v.Gaps > 0:
		return fmt.Sprintf("intact, %d event(s) not recorded in %d gap record(s)", v.Unrecorded, v.Gaps)
	case !v.Ended:
		return "intact so far (no end record: still running, or cut)"
	}
	return "intact, ended"
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

//go:embed report.html.tmpl
var tmplFS embed.FS

var page = template.Must(template.New("report.html.tmpl").Funcs(template.FuncMap{
	"rel":    rel,
	"join":   func(l []string) string { return strings.Join(l, " ") },
	"verify": verifyLine,
	"target": func(f FileChange) string { return changeTarget(f, func(s string) string { return s }) },
	"utc":    func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"clip":   func(s string) string { return clipText(s, 400) },
	"dur":    func(a, b time.Time) string { return b.Sub(a).Round(time.Millisecond).String() },
	// pct places t on the timeline, 0..100.
	"pct": func(start, end, t time.Time) string {
		total := end.Sub(start)
		if total <= 0 {
			return "0"
		}
		return strconv.FormatFloat(100*float64(t.Sub(start))/float64(total), 'f', 2, 64)
	},
	"exit": func(p *Process) string {
		switch {
		case p.ExitCode != nil:
			return fmt.Sprintf("exit %d", *p.ExitCode)
		case p.Signal != nil:
			return fmt.Sprintf("signal %d", *p.Signal)
		}
		return "no exit recorded"
	},
	"failed": func(p *Process) bool { return p.Signal != nil || p.ExitCode != nil && *p.ExitCode != 0 },
}).ParseFS(tmplFS, "report.html.tmpl"))

// HTML writes the report as one self-contained page: no script, style or
// font from anywhere else, every value escaped by html/template.
func HTML(w io.Writer, rep *Report) error {
	return page.Execute(w, rep)
}

// clipText cuts s to n bytes, on a rune boundary, marking the cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// mcpOutcome says what came back for an MCP call.
func mcpOutcome(m MCPUse) string {
	switch {
	case !m.Answered:
		return "no answer"
	case m.IsError:
		return fmt.Sprintf("an error (%d bytes)", m.Bytes)
	}
	return fmt.Sprintf("a result of %d bytes", m.Bytes)
}
