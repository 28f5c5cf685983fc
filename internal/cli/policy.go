package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/compile"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/explain"
	"agentbox.dev/agentbox/internal/policy"
)

func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: "validate and explain role policies; write one from a trail",
		Subcommands: []*cli.Command{
			{
				Name:      "validate",
				Usage:     "load policy files or directories as one set; print every problem",
				ArgsUsage: "PATH...",
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return cli.Exit("usage: agentbox policy validate PATH... (files or directories of *.yaml)", 2)
					}
					set, err := policy.LoadPaths(c.Args().Slice()...)
					if err != nil {
						errs := policy.Errors(err)
						for _, e := range errs {
							fmt.Fprintln(c.App.ErrWriter, e)
						}
						return cli.Exit(fmt.Sprintf("%d problem(s) found", len(errs)), 1)
					}
					fmt.Fprintf(c.App.Writer, "ok: %d role(s), %d binding(s) in %d file(s)\n", len(set.Roles), len(set.Bindings), len(set.Files))
					return nil
				},
			},
			{
				Name:  "explain",
				Usage: "show the effective profile of a role for a pod, and what it changes in an OCI spec and runsc's flags",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "role", Usage: "role to explain (default: the config's default role)"},
					&cli.StringFlag{Name: "namespace", Usage: "the pod's Kubernetes namespace (CRI)"},
					&cli.StringFlag{Name: "containerd-namespace", Value: "k8s.io", Usage: "containerd namespace"},
					&cli.StringFlag{Name: "handler", Usage: "runtime handler (default: the config's policy.handler)"},
					policyPathsFlag(),
					configFlag(),
					&cli.StringSliceFlag{Name: "annotation", Usage: "pod annotation KEY=VALUE (agentbox.dev/* tighten the role)"},
					&cli.StringFlag{Name: "pod", Usage: "a Kubernetes v1 Pod manifest (YAML or JSON, - for stdin): explain what each of its containers asks for and gets, or why it is refused; its namespace and annotations claim the role"},
					&cli.StringFlag{Name: "image-user", Value: "0", Usage: "with --pod: the image's USER as UID[:GID], which explain cannot read"},
					outputFlag("text", "json"),
				},
				Action: policyExplain,
			},
			policySuggestCommand(),
			policyDiffCommand(),
		},
	}
}

func policyExplain(c *cli.Context) error {
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
	req := policy.Request{
		Annotations:         map[string]string{},
		ContainerdNamespace: c.String("containerd-namespace"),
		PodNamespace:        c.String("namespace"),
		Handler:             cfg.Policy.Handler,
		DefaultRole:         cfg.Policy.DefaultRole,
	}
	if c.IsSet("handler") {
		req.Handler = c.String("handler")
	}
	for _, a := range c.StringSlice("annotation") {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return cli.Exit(fmt.Sprintf("--annotation %q: want KEY=VALUE", a), 2)
		}
		req.Annotations[k] = v
	}
	if r := c.String("role"); r != "" {
		req.Annotations[policy.RoleAnnotation] = r
	}
	out, err := output(c, "text", "json")
	if err != nil {
		return err
	}
	var ex explain.Explanation
	if file := c.String("pod"); file != "" {
		for _, f := range []string{"role", "namespace", "annotation"} {
			if c.IsSet(f) {
				return cli.Exit(fmt.Sprintf("--%s with --pod: the pod's metadata gives its namespace and annotations", f), 2)
			}
		}
		img, err := explain.ParseImageUser(c.String("image-user"))
		if err != nil {
			return cli.Exit(err, 2)
		}
		if ex, err = explain.Pod(cfg, set, req, file, c.App.Reader, img); err != nil {
			return cli.Exit(err, 1)
		}
	} else {
		spec := explain.SampleSpec(req)
		res, err := compile.Compile(compile.Input{
			Config: cfg, Policies: set, Request: req,
			Mounts: policy.MountEnv{SandboxRootDir: explain.SampleSandboxDir, SandboxStateDir: explain.SampleSandboxStateDir},
		}, spec)
		if err != nil {
			return cli.Exit(err, 1)
		}
		ex = explain.Explanation{Request: req, Profile: res.Profile, SpecChange: explain.WithResolver(res), Spec: spec, RunscFlags: res.RunscFlags}
	}
	if ex.Profile != nil {
		ex.Running = runningUnder(cfg.Shim.ControlDir, ex.Profile.Role)
	}
	var refused int
	if ex.Pod != nil {
		for _, ce := range ex.Pod.Containers {
			if ce.Refused != "" {
				refused++
			}
		}
	}
	if out == "json" {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(ex); err != nil {
			return err
		}
	} else {
		explain.Write(c.App.Writer, ex)
	}
	if refused > 0 {
		return cli.Exit(fmt.Sprintf("%d of %d container(s) would not start", refused, len(ex.Pod.Containers)), 1)
	}
	return nil
}

// runningUnder lists this node's running sandboxes under role, where the
// control sockets can be read (root); nothing otherwise.
func runningUnder(dir, role string) []control.Sandbox {
	listed, err := control.List(dir, 2*time.Second)
	if err != nil {
		return nil
	}
	var out []control.Sandbox
	for _, l := range listed {
		if l.Sandbox != nil && l.Sandbox.Role == role {
			out = append(out, *l.Sandbox)
		}
	}
	return out
}

// flagOr is the string flag name when it was given, else def (the
// config's value).
// policyPathsFlag names the policy files a command loads: directories or
// files, as many as given (a role written to a file, beside the shipped
// roles it inherits).
func policyPathsFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: "policy-dir", Usage: "policy directory or file; repeat to load several (default: the config's policy.dir)"}
}

// policyPaths is what --policy-dir names, or def.
func policyPaths(c *cli.Context, def string) []string {
	if c.IsSet("policy-dir") {
		return c.StringSlice("policy-dir")
	}
	return []string{def}
}

func flagOr(c *cli.Context, name, def string) string {
	if c.IsSet(name) {
		return c.String(name)
	}
	return def
}
