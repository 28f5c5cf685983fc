package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
)

// controlTimeout bounds one request to a sandbox's shim.
const controlTimeout = 10 * time.Second

// checkpointTimeout bounds a checkpoint or suspend request.
const checkpointTimeout = 10 * time.Minute

// checkpointList prints the node's checkpoints, each opened as a restore
// would open it.
func checkpointList(c *cli.Context) error {
	out, err := output(c, "text", "json")
	if err != nil {
		return err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return cli.Exit(err, 1)
	}
	store, err := checkpoint.OpenStore(cfg.Checkpoint.Dir, cfg.Checkpoint.KeyFile)
	if err != nil {
		return cli.Exit(err, 1)
	}
	if name := c.String("remove"); name != "" {
		if err := checkpoint.ValidName(name); err != nil {
			return cli.Exit("--remove: "+err.Error(), 2)
		}
		if _, err := os.Lstat(filepath.Join(store.Dir, name)); err != nil {
			return cli.Exit(fmt.Sprintf("checkpoint %s: not in the node's store %s", name, store.Dir), 1)
		}
		if err := store.Remove(name); err != nil {
			return cli.Exit(err, 1)
		}
		fmt.Fprintf(c.App.Writer, "checkpoint %s removed\n", name)
		return nil
	}
	list, err := store.List()
	if err != nil {
		return cli.Exit(err, 1)
	}
	type row struct {
		checkpoint.Manifest
		Digest string `json:"digest,omitempty"`
		Bytes  int64  `json:"bytes"`
		Check  string `json:"check"`
	}
	var rows []row
	for _, m := range list {
		r := row{Manifest: m, Check: "ok"}
		for _, f := range m.Files {
			r.Bytes += f.Size
		}
		if img, err := store.Open(m.Name); err != nil {
			r.Check = err.Error()
		} else {
			r.Digest = img.Digest
		}
		rows = append(rows, r)
	}
	if out == "json" {
		return writeJSON(c.App.Writer, rows)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tSANDBOX\tPOD\tROLE\tSIZE\tSUSPENDED\tCHECK")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d MiB\t%v\t%s\n", r.Name, r.Created.Format(time.RFC3339), policy.ShortDigest(r.SandboxID), r.Pod, r.Role, r.Bytes>>20, r.Suspended, r.Check)
	}
	return tw.Flush()
}

func sandboxCommand() *cli.Command {
	common := []cli.Flag{
		configFlag(),
		&cli.StringFlag{Name: "control-dir", Usage: "the sandboxes' control sockets (default: the config's shim.control_dir)"},
		outputFlag("text", "json"),
	}
	target := append([]cli.Flag{&cli.StringFlag{Name: "pod", Usage: "NAMESPACE/NAME: the pod's sandbox (instead of an ID)"}}, common...)
	reason := &cli.StringFlag{Name: "reason", Usage: "why (it goes into the sandbox's trail)"}
	cpName := &cli.StringFlag{Name: "name", Usage: "the checkpoint's name in the store (default: the sandbox ID and the time)"}
	act := func(name, usage, op string, flags ...cli.Flag) *cli.Command {
		return &cli.Command{
			Name: name, Usage: usage, ArgsUsage: "(ID | --pod NAMESPACE/NAME)",
			Flags:  append(append([]cli.Flag{}, flags...), target...),
			Action: func(c *cli.Context) error { return sandboxAct(c, op) },
		}
	}
	return &cli.Command{
		Name:  "sandbox",
		Usage: "respond to running sandboxes on this node (root): list, quarantine, freeze, thaw, stop, checkpoint, suspend; fork an agent-sandbox Sandbox (Kubernetes)",
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
			act("checkpoint", "write the sandbox's memory (every container) into the node's checkpoint store, signed; it keeps running", control.OpCheckpoint,
				cpName, reason),
			act("suspend", "checkpoint the sandbox, then stop it; a pod annotated agentbox.dev/restore-from: NAME resumes it", control.OpSuspend, cpName, reason),
			forkCommand(),
			{
				Name:   "checkpoints",
				Usage:  "the node's checkpoints, each checked (its signature and files) as a restore would; --remove NAME deletes one (it holds an agent's memory)",
				Flags:  append([]cli.Flag{&cli.StringFlag{Name: "remove", Usage: "delete this checkpoint from the node's store"}}, common...),
				Action: checkpointList,
			},
		},
	}
}

// listed asks every sandbox in the control socket directory the flags or
// the config name.
func listed(c *cli.Context) ([]control.Listed, error) {
	dir := c.String("control-dir")
	if dir == "" {
		cfg, err := loadConfig(c)
		if err != nil {
			return nil, err
		}
		dir = cfg.Shim.ControlDir
	}
	return control.List(dir, controlTimeout)
}

func sandboxList(c *cli.Context) error {
	out, err := output(c, "text", "json")
	if err != nil {
		return err
	}
	listed, err := listed(c)
	if err != nil {
		return cli.Exit(err, 1)
	}
	if out == "json" {
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
		digest := policy.ShortDigest(sb.StartDigest)
		if sb.LiveDigest != sb.StartDigest {
			digest += "/" + policy.ShortDigest(sb.LiveDigest)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", policy.ShortDigest(sb.ID), pod, sb.Role, digest, egress, state, left, sb.Trail)
	}
	tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func sandboxAct(c *cli.Context, op string) error {
	out, err := output(c, "text", "json")
	if err != nil {
		return err
	}
	if op == control.OpQuarantine && c.Bool("release") {
		op = control.OpRelease
	}
	if c.NArg() > 1 {
		return cli.Exit(fmt.Sprintf("one sandbox at a time: got %d arguments", c.NArg()), 2)
	}
	req := control.Request{Op: op, Reason: c.String("reason"), Name: c.String("name")}
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
	timeout := controlTimeout
	if op == control.OpCheckpoint || op == control.OpSuspend {
		// gVisor writes the whole memory: seconds per GiB.
		timeout = checkpointTimeout
	}
	resp, err := control.Call(target.Socket, req, timeout)
	if out == "json" {
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
