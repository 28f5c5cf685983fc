package cli

import (
	"bufio"
	"bytes"
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
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/ocsf"
	trailreport "agentbox.dev/agentbox/internal/report"
)

func auditCommand() *cli.Command {
	return &cli.Command{
		Name:  "audit",
		Usage: "read and verify audit trails",
		Subcommands: []*cli.Command{
			{
				Name:      "tail",
				Usage:     "print audit records, optionally following new ones",
				ArgsUsage: "[DIR or FILE...] (default: the config's audit.dir)",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing records as they are written"},
					&cli.StringFlag{Name: "pod", Usage: "only records of this pod (NAME or NAMESPACE/NAME)"},
					&cli.StringFlag{Name: "role", Usage: "only records under this role"},
					&cli.StringFlag{Name: "class", Usage: "only this class: file, process, network, agentbox (or a class_uid)"},
					&cli.StringFlag{Name: "sandbox", Usage: "only this sandbox id"},
					&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "text", Usage: "text or json (the records as written)"},
					&cli.StringFlag{Name: "config", Value: config.UnnamedPath(), Usage: "agentbox shim config (for audit.dir)"},
				},
				Action: auditTail,
			},
			{
				Name:      "verify",
				Usage:     "check trails for modified, deleted, inserted, reordered and truncated records",
				ArgsUsage: "PATH... (trail files, or directories of them)",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "open", Usage: "accept trails without an end record (sandboxes still running)"},
				},
				Action: auditVerify,
			},
			{
				Name:      "report",
				Usage:     "one sandbox's story: process tree, files changed, network by host, refusals, limits, gaps, the chain's check",
				ArgsUsage: "PATH... (trail files, or directories of them)",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "sandbox", Usage: "the sandbox (its trail's id)"},
					&cli.StringFlag{Name: "pod", Usage: "NAMESPACE/NAME: the pod's latest sandbox"},
					&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "text", Usage: "text, html (one self-contained page) or json"},
				},
				Action: auditReport,
			},
			{
				Name:      "validate",
				Usage:     "check that every record conforms to the OCSF schema agentbox writes (" + audit.SchemaVersion + ", built in)",
				ArgsUsage: "PATH... (trail files, or directories of them)",
				Action:    auditValidate,
			},
		},
	}
}

func auditVerify(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.Exit("usage: agentbox audit verify PATH...", 2)
	}
	trails, err := audit.FindTrails(c.Args().Slice()...)
	if err != nil {
		return cli.Exit(err, 2)
	}
	if len(trails) == 0 {
		return cli.Exit("no *.jsonl trail found", 2)
	}
	bad, gaps := 0, 0
	var results []audit.VerifyResult
	for _, t := range trails {
		results = append(results, audit.VerifyTrail(t, c.Bool("open")))
	}
	for _, res := range results {
		if given, err := audit.LinkProblem(res, results); err != nil && res.Problem == nil {
			res.Problem = fmt.Errorf("restored from checkpoint %s, and does not link to it: %v", esc(res.RestoredFrom.Checkpoint), err)
			res.FirstBad = 1
		} else if res.RestoredFrom != nil && res.Problem == nil {
			l := res.RestoredFrom
			how := "linked: that trail holds the record"
			if !given {
				how = "that trail was not given: pass it too to check the link"
			}
			fmt.Fprintf(c.App.Writer, "LINK  %s: restored from checkpoint %s, continues sandbox %s after its record %d (%s)\n",
				esc(res.Sandbox), esc(l.Checkpoint), esc(l.Sandbox), l.Seq, how)
		}
		if res.Problem != nil {
			bad++
			fmt.Fprintf(c.App.Writer, "FAIL  %s: first bad seq %d: %v\n", esc(res.Sandbox), res.FirstBad, res.Problem)
			continue
		}
		state := "ended"
		if !res.Ended {
			state = "open"
		}
		if res.Gaps > 0 {
			gaps++
			fmt.Fprintf(c.App.Writer, "GAPS  %s: %d records, chain intact, %s (%d file(s)); %d event(s) not recorded, in %d gap record(s)\n",
				esc(res.Sandbox), res.Records, state, len(res.Files), res.Unrecorded, res.Gaps)
			continue
		}
		fmt.Fprintf(c.App.Writer, "OK    %s: %d records, chain intact, %s (%d file(s))\n", esc(res.Sandbox), res.Records, state, len(res.Files))
	}
	switch {
	case bad > 0:
		return cli.Exit(fmt.Sprintf("%d of %d trail(s) failed verification", bad, len(trails)), 1)
	case gaps > 0:
		return cli.Exit(fmt.Sprintf("%d of %d trail(s) intact but with gaps: not a complete account", gaps, len(trails)), VerifyGapsExit)
	}
	return nil
}

// VerifyGapsExit is verify's exit code when every chain is intact but some
// trail says events were not recorded.
const VerifyGapsExit = 3

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

// Filters wider than one class: network is the Network Activity
// category (connections, HTTP, DNS); agentbox is every record the shim
// writes of its own, whatever its class.
const (
	classNetworkAny = -2
	classAgentbox   = -3
)

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
		cfg, err := config.Load(c.String("config"), c.IsSet("config"))
		if err != nil {
			return cli.Exit(err, 1)
		}
		paths = []string{cfg.Audit.Dir}
	}
	asJSON := c.String("output") == "json"
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

func auditValidate(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.Exit("usage: agentbox audit validate PATH...", 2)
	}
	res, err := ValidateTrails(c.Args().Slice()...)
	if err != nil {
		return cli.Exit(err, 2)
	}
	for _, p := range res.Problems {
		fmt.Fprintln(c.App.Writer, "FAIL  "+esc(p))
	}
	fmt.Fprintf(c.App.Writer, "%d of %d records in %d trail(s) conform to OCSF %s\n", res.Records-res.Bad, res.Records, res.Trails, audit.SchemaVersion)
	if res.Bad > 0 {
		return cli.Exit("", 1)
	}
	return nil
}

// ValidateResult counts the records ValidateTrails checked.
type ValidateResult struct {
	Trails, Records, Bad int
	// Problems names each bad record (file:line: path: what), the first
	// 100.
	Problems []string
}

// ValidateTrails checks every line of the trails found in paths against
// the OCSF schema built into agentbox.
func ValidateTrails(paths ...string) (ValidateResult, error) {
	var res ValidateResult
	s, err := ocsf.Embedded()
	if err != nil {
		return res, err
	}
	trails, err := audit.FindTrails(paths...)
	if err != nil {
		return res, err
	}
	if len(trails) == 0 {
		return res, fmt.Errorf("no *.jsonl trail found")
	}
	for _, t := range trails {
		res.Trails++
		for _, f := range t.Files {
			b, err := os.ReadFile(f)
			if err != nil {
				return res, err
			}
			for i, line := range bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n")) {
				res.Records++
				probs := s.ValidateJSON(line)
				if len(probs) == 0 {
					continue
				}
				res.Bad++
				if len(res.Problems) < 100 {
					res.Problems = append(res.Problems, fmt.Sprintf("%s:%d: %v", f, i+1, probs))
				}
			}
		}
	}
	return res, nil
}

func auditReport(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.Exit("usage: agentbox audit report [--sandbox ID | --pod NS/NAME] [-o text|html|json] PATH...", 2)
	}
	out := c.String("output")
	if out != "text" && out != "html" && out != "json" {
		return cli.Exit(fmt.Sprintf("--output %q: want text, html or json", out), 2)
	}
	sandbox, pod := c.String("sandbox"), c.String("pod")
	if (sandbox == "") == (pod == "") {
		return cli.Exit("name one sandbox: --sandbox ID or --pod NAMESPACE/NAME", 2)
	}
	if pod != "" && strings.Count(pod, "/") != 1 {
		return cli.Exit(fmt.Sprintf("--pod %q: want NAMESPACE/NAME", pod), 2)
	}
	trails, err := audit.FindTrails(c.Args().Slice()...)
	if err != nil {
		return cli.Exit(err, 2)
	}
	var chosen *audit.TrailFiles
	var recs []*audit.Record
	var latest time.Time
	for i := range trails {
		t := &trails[i]
		if sandbox != "" && t.Sandbox != sandbox {
			continue
		}
		rs, err := readTrailRecords(t.Files)
		if err != nil {
			return cli.Exit(err, 2)
		}
		if pod != "" {
			if len(rs) == 0 || rs[0].PodNamespace+"/"+rs[0].PodName != pod {
				continue
			}
			// The pod's latest sandbox: the one whose trail began last.
			began, _ := time.Parse(time.RFC3339Nano, rs[0].Time)
			if chosen != nil && began.Before(latest) {
				continue
			}
			latest = began
		}
		chosen, recs = t, rs
	}
	if chosen == nil {
		return cli.Exit(fmt.Sprintf("no trail for %s in %s", esc(sandbox+pod), strings.Join(c.Args().Slice(), " ")), 1)
	}
	rep := trailreport.Build(recs, audit.VerifyTrail(*chosen, false))
	switch out {
	case "html":
		err = trailreport.HTML(c.App.Writer, rep)
	case "json":
		err = trailreport.JSON(c.App.Writer, rep)
	default:
		err = trailreport.Text(c.App.Writer, rep)
	}
	if err != nil {
		return cli.Exit(err, 1)
	}
	return nil
}

// readTrailRecords parses a trail's files; a line that is not a record
// is an error naming it (verify says what happened to it).
func readTrailRecords(files []string) ([]*audit.Record, error) {
	var out []*audit.Record
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, line := range bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			r, err := audit.ParseLine(line)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: not a record: %v", f, i+1, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}
