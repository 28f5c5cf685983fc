package cli

// agentbox audit validate and report.

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/ocsf"
	trailreport "agentbox.dev/agentbox/internal/report"
)

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
	out, err := output(c, "text", "html", "json")
	if err != nil {
		return err
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
