package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/audit"
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
					outputFlag("text", "json"),
					configFlag(),
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
					outputFlag("text", "html", "json"),
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

// Filters wider than one class: network is the Network Activity
// category (connections, HTTP, DNS); agentbox is every record the shim
// writes of its own, whatever its class.
const (
	classNetworkAny = -2
	classAgentbox   = -3
)
