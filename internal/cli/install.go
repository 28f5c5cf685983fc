package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/install"
)

func installFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "root", Value: "/", Usage: "install below this directory as a tree of its own (an image build, a test): the configs name the files below it"},
		&cli.StringFlag{Name: "host-root", Usage: "the node's root filesystem is mounted here (an installer pod's hostPath /): write below it, and name the files in the configs as the node sees them"},
		&cli.StringFlag{Name: "containerd-config", Value: "/etc/containerd/config.toml", Usage: "containerd's main config, below --root"},
		&cli.StringFlag{Name: "handler", Value: "agentbox", Usage: "CRI runtime handler (the RuntimeClass's handler)"},
		&cli.BoolFlag{Name: "dry-run", Usage: "say what would change, change nothing"},
	}
}

func installCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name:  "install",
			Usage: "put agentbox on this node: the shim, runsc and this CLI, its config and policies where absent, and the runtime handler as a containerd drop-in",
			Flags: append(installFlags(),
				&cli.StringFlag{Name: "shim", Usage: "the shim binary (default: containerd-shim-agentbox-v1 beside this binary, else on PATH)"},
				&cli.StringFlag{Name: "runsc", Usage: "a static runsc built with hack/patches (default: runsc on PATH)"},
			),
			Action: func(c *cli.Context) error {
				o, err := optionsOf(c)
				if err != nil {
					return cli.Exit(err, 2)
				}
				if o.Shim, err = binary(c.String("shim"), "containerd-shim-agentbox-v1"); err != nil {
					return cli.Exit(err, 2)
				}
				if o.Runsc, err = binary(c.String("runsc"), "runsc"); err != nil {
					return cli.Exit(err, 2)
				}
				// The CLI itself goes on the node too: doctor, policy,
				// audit and uninstall run there.
				if o.CLI, err = os.Executable(); err != nil {
					return cli.Exit(fmt.Errorf("this agentbox binary: %w", err), 2)
				}
				acts, err := install.Install(o)
				next := "restart containerd, then check with: agentbox doctor --config " + install.ConfigFile(o)
				if l := install.DetectLayout(o.Root); l.Template {
					next = fmt.Sprintf("%s node: restart %s (it regenerates containerd's config from %s), then check with: agentbox doctor --config %s", l.Name, l.Name, l.ContainerdConfig, install.ConfigFile(o))
				}
				return reportActions(c, acts, err, next)
			},
		},
		{
			Name:  "uninstall",
			Usage: "reverse `agentbox install`: remove what it created and its containerd import (files that existed before stay)",
			Flags: installFlags(),
			Action: func(c *cli.Context) error {
				o, err := optionsOf(c)
				if err != nil {
					return cli.Exit(err, 2)
				}
				acts, err := install.Uninstall(o)
				return reportActions(c, acts, err, "restart containerd")
			},
		},
	}
}

func optionsOf(c *cli.Context) (install.Options, error) {
	o := install.Options{Root: c.String("root"), ContainerdConfig: c.String("containerd-config"), Handler: c.String("handler"), DryRun: c.Bool("dry-run")}
	if h := c.String("host-root"); h != "" {
		if c.IsSet("root") {
			return o, fmt.Errorf("--root and --host-root: give one")
		}
		o.Root, o.HostRoot = h, true
	}
	if !filepath.IsAbs(o.Root) {
		return o, fmt.Errorf("--root/--host-root %q: not an absolute path", o.Root)
	}
	return o, nil
}

// binary finds a binary: the flag's path, else beside this executable,
// else on PATH.
func binary(flag, name string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), name); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found beside agentbox or on PATH: name it with --shim or --runsc", name)
	}
	return p, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func reportActions(c *cli.Context, acts []install.Action, err error, next string) error {
	changed := false
	for _, a := range acts {
		fmt.Fprintln(c.App.Writer, a)
		changed = changed || (a.What != "unchanged" && a.What != "kept")
	}
	if err != nil {
		return cli.Exit(err, 1)
	}
	if changed && !c.Bool("dry-run") {
		fmt.Fprintln(c.App.Writer, "next: "+next)
	}
	return nil
}
