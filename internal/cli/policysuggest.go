package cli

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/suggest"
)

// policySuggestCommand writes the tightest role that lets an agent do
// what its trail shows.
func policySuggestCommand() *cli.Command {
	return &cli.Command{
		Name:      "suggest",
		Usage:     "from an agent's trail, write the tightest role that would have let it do the same (YAML, each line saying where it came from)",
		ArgsUsage: "TRAIL.jsonl...",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Value: "suggested", Usage: "the role's name"},
			&cli.StringFlag{Name: "inherits", Value: "baseline", Usage: "the role's parent"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return cli.Exit("usage: agentbox policy suggest [--name NAME] [--inherits ROLE] TRAIL.jsonl... (a sandbox's trail files)", 2)
			}
			recs, err := readTrailRecords(c.Args().Slice())
			if err != nil {
				return cli.Exit(err, 1)
			}
			if len(recs) == 0 {
				return cli.Exit("the trail holds no record", 1)
			}
			fmt.Fprint(c.App.Writer, suggest.Suggest(suggest.Observe(recs), suggest.Options{Name: c.String("name"), Inherits: c.String("inherits")}))
			return nil
		},
	}
}

// policyDiffCommand says what a role would have refused of what a trail
// shows, without running the agent again.
func policyDiffCommand() *cli.Command {
	return &cli.Command{
		Name:  "diff",
		Usage: "what a role would have refused of what an agent's trail shows (exit 1 when something)",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "trail", Required: true, Usage: "the agent's trail files"},
			&cli.StringFlag{Name: "role", Required: true, Usage: "the role to hold the run against"},
			policyPathsFlag(),
			configFlag(),
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return cli.Exit(err, 1)
			}
			set, err := policy.LoadPaths(policyPaths(c, cfg.Policy.Dir)...)
			if err != nil {
				for _, e := range policy.Errors(err) {
					fmt.Fprintln(c.App.ErrWriter, e)
				}
				return cli.Exit("the policy does not load", 1)
			}
			if _, ok := set.Roles[c.String("role")]; !ok {
				return cli.Exit(fmt.Sprintf("role %q is not defined in %s", c.String("role"), strings.Join(policyPaths(c, cfg.Policy.Dir), ", ")), 1)
			}
			p, err := set.Profile(c.String("role"))
			if err != nil {
				return cli.Exit(err, 1)
			}
			recs, err := readTrailRecords(c.StringSlice("trail"))
			if err != nil {
				return cli.Exit(err, 1)
			}
			u := suggest.Observe(recs)
			findings, err := suggest.Diff(u, p)
			if err != nil {
				return cli.Exit(err, 1)
			}
			for _, f := range findings {
				fmt.Fprintf(c.App.Writer, "refused: %s: %s\n", esc(f.What), esc(f.Why))
			}
			if len(findings) > 0 {
				return cli.Exit(fmt.Sprintf("role %s would have refused %d thing(s) the agent did", c.String("role"), len(findings)), 1)
			}
			fmt.Fprintf(c.App.Writer, "role %s allows everything the trail shows (%d host(s), %d file(s) written, %d run)\n", c.String("role"), len(u.Hosts), len(u.Written), len(u.Executed))
			return nil
		},
	}
}
