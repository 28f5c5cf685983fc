package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
)

// controlTimeout bounds one request to a sandbox's shim.
const controlTimeout = 10 * time.Second

func sandboxCommand() *cli.Command {
	common := []cli.Flag{
		&cli.StringFlag{Name: "config", Value: config.UnnamedPath(), Usage: "agentbox shim config (for shim.control_dir)"},
		&cli.StringFlag{Name: "control-dir", Usage: "the sandboxes' control sockets (default: the config's shim.control_dir)"},
		&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "text", Usage: "text or json"},
	}
	target := append([]cli.Flag{&cli.StringFlag{Name: "pod", Usage: "NAMESPACE/NAME: the pod's sandbox (instead of an ID)"}}, common...)
	reason := &cli.StringFlag{Name: "reason", Usage: "why (it goes into the sandbox's trail)"}
	act := func(name, usage, op string, flags ...cli.Flag) *cli.Command {
		return &cli.Command{
			Name: name, Usage: usage, ArgsUsage: "(ID | --pod NAMESPACE/NAME)",
			Flags:  append(append([]cli.Flag{}, flags...), target...),
			Action: func(c *cli.Context) error { return sandboxAct(c, op) },
		}
	}
	return &cli.Command{
		Name:  "sandbox",
		Usage: "respond to running sandboxes on this node (root): list, quarantine, freeze, thaw, stop",
		Subcommands: []*cli.Command{
			{
				Name:   "list",
				Usage:  "each running sandbox: pod, role, policy digest, egress, state, trail",
				Flags:  common,
				Action: sandboxList,
			},
			act("quarantine", "cut the sandbox's egress (every allow rule, the resolver, the gateway); the agent keeps running", control.OpQuarantine,
				reason, &cli.BoolFlag{Name: "release", Usage: "lift the quarantine: the role's egress again"}),
			act("freeze", "pause every process of the sandbox (its wall clock is held)", control.OpFreeze, reason),
			act("thaw", "resume a frozen sandbox", control.OpThaw, reason),
			act("stop", "kill every container of the sandbox", control.OpStop, reason),
		},
	}
}

// listed asks every sandbox in the control socket directory the flags or
// the config name.
func listed(c *cli.Context) ([]control.Listed, error) {
	dir := c.String("control-dir")
	if dir == "" {
		cfg, err := config.Load(c.String("config"), c.IsSet("config"))
		if err != nil {
			return nil, err
		}
		dir = cfg.Shim.ControlDir
	}
	return control.List(dir, controlTimeout)
}

func sandboxList(c *cli.Context) error {
	listed, err := listed(c)
	if err != nil {
		return cli.Exit(err, 1)
	}
	if c.String("output") == "json" {
		var out []*control.Sandbox
		for _, l := range listed {
			if l.Sandbox != nil {
				out = append(out, l.Sandbox)
			}
		}
		return writeJSON(c.App.Writer, out)
	}
	writeSandboxes(c.App.Writer, listed)
	for _, l := range listed {
		if l.Err != nil {
			fmt.Fprintf(c.App.ErrWriter, "%s: no answer (%v): its shim is gone or busy\n", l.Socket, l.Err)
		}
	}
	return nil
}

// writeSandboxes prints one line per sandbox that answered.
func writeSandboxes(w io.Writer, listed []control.Listed) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tPOD\tROLE\tDIGEST (START/LIVE)\tEGRESS\tSTATE\tWALL CLOCK LEFT\tTRAIL")
	for _, l := range listed {
		sb := l.Sandbox
		if sb == nil {
			continue
		}
		pod := sb.Pod
		if pod == "" {
			pod = "(" + sb.Namespace + ")"
		}
		digest := short(sb.StartDigest)
		if sb.LiveDigest != sb.StartDigest {
			digest += "/" + short(sb.LiveDigest)
		}
		egress := sb.Egress
		if sb.EgressNow != sb.Egress {
			egress += " -> " + sb.EgressNow
		}
		state := sb.State
		if sb.Quarantined {
			state += ", quarantined"
		}
		left := sb.WallClockLeft
		if left == "" {
			left = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short(sb.ID), pod, sb.Role, digest, egress, state, left, sb.Trail)
	}
	tw.Flush()
}

// short abbreviates an id or digest for a table.
func short(s string) string {
	s = strings.TrimPrefix(s, "sha256:")
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func sandboxAct(c *cli.Context, op string) error {
	if op == control.OpQuarantine && c.Bool("release") {
		op = control.OpRelease
	}
	if c.NArg() > 1 {
		return cli.Exit(fmt.Sprintf("one sandbox at a time: got %d arguments", c.NArg()), 2)
	}
	req := control.Request{Op: op, Reason: c.String("reason")}
	if err := req.Validate(); err != nil {
		return cli.Exit(strings.Replace(err.Error(), "reason:", "--reason:", 1), 2)
	}
	all, err := listed(c)
	if err != nil {
		return cli.Exit(err, 1)
	}
	target, err := control.Find(all, c.Args().First(), c.String("pod"))
	if err != nil {
		return cli.Exit(err, 1)
	}
	resp, err := control.Call(target.Socket, req, controlTimeout)
	if c.String("output") == "json" {
		if werr := writeJSON(c.App.Writer, resp); werr != nil {
			return werr
		}
	} else if err == nil {
		fmt.Fprintf(c.App.Writer, "sandbox %s: %s (shim took %v)\n", target.Sandbox.ID, resp.Message, time.Duration(resp.Micros)*time.Microsecond)
	}
	if err != nil {
		return cli.Exit(fmt.Sprintf("sandbox %s: %v", target.Sandbox.ID, err), 1)
	}
	return nil
}
