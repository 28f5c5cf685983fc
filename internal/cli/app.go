// Package cli is the agentbox admin command line.
package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/version"
)

// App returns the agentbox command.
func App() *cli.App {
	return &cli.App{
		Name:  "agentbox",
		Usage: "run AI agents under gVisor with least-privilege roles",
		Flags: []cli.Flag{configFlag()},
		Commands: append([]*cli.Command{
			{
				Name:  "version",
				Usage: "print the agentbox version",
				Action: func(c *cli.Context) error {
					fmt.Fprintf(c.App.Writer, "agentbox %s", version.Version)
					if version.Revision != "" {
						fmt.Fprintf(c.App.Writer, " (%s)", version.Revision)
					}
					fmt.Fprintln(c.App.Writer)
					return nil
				},
			},
			doctorCommand(),
			probeClone3Command(),
			policyCommand(),
			auditCommand(),
			syncCommand(),
			brokerCommand(),
			sandboxCommand(),
		}, installCommands()...),
	}
}
