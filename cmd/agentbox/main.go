// Command agentbox is the admin CLI: version, doctor.
package main

import (
	"fmt"
	"os"

	"agentbox.dev/agentbox/internal/cli"
)

func main() {
	if err := cli.App().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "agentbox:", err)
		os.Exit(1)
	}
}
