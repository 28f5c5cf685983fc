package cli

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/config"
)

// configFlag is --config: the agentbox config (the shim's own file: its
// policy and audit directories, control sockets, checkpoint store, runsc).
// The app has it, and so does every command that reads the config, so it
// may come before the command or after it; AGENTBOX_CONFIG names it when
// no flag does.
func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", Usage: fmt.Sprintf("the agentbox config (default: $%s, else %s)", config.PathEnv, config.DefaultPath)}
}

// configPath is the config a command reads, and whether it was named (a
// named config must exist; the default may be absent, and then the
// defaults apply): the innermost --config given, else AGENTBOX_CONFIG,
// else the default path.
func configPath(c *cli.Context) (string, bool) {
	for _, ctx := range c.Lineage() {
		if slices.Contains(ctx.LocalFlagNames(), "config") {
			return ctx.String("config"), true
		}
	}
	if p := os.Getenv(config.PathEnv); p != "" {
		return p, true
	}
	return config.DefaultPath, false
}

// loadConfig reads the config a command names.
func loadConfig(c *cli.Context) (*config.Config, error) {
	return config.Load(configPath(c))
}

// kubeconfigFlag is --kubeconfig, for the commands that reach the API
// server (kubeClient).
func kubeconfigFlag() cli.Flag {
	return &cli.StringFlag{Name: "kubeconfig", EnvVars: []string{"KUBECONFIG"}, Usage: "kubeconfig (default: the pod's service account)"}
}

// outputFlag is -o/--output, one of formats (the first is the default).
func outputFlag(formats ...string) cli.Flag {
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: formats[0], Usage: strings.Join(formats, ", ")}
}

// output is the format a command was asked for; one it does not write is
// refused, naming the flag (exit 2).
func output(c *cli.Context, formats ...string) (string, error) {
	o := c.String("output")
	if !slices.Contains(formats, o) {
		return "", cli.Exit(fmt.Sprintf("--output %q: want %s", o, strings.Join(formats, " or ")), 2)
	}
	return o, nil
}
