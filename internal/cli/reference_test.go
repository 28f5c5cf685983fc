package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/golden"
)

// TestCLIReference: docs/reference/cli.md is the CLI's own help: each
// command with its arguments, its flags, which are required, and their
// defaults. Regenerate it with go test ./internal/cli -run TestCLIReference
// -update (make check runs this test).
func TestCLIReference(t *testing.T) {
	app := App()
	var b strings.Builder
	b.WriteString("<!-- Generated from the agentbox CLI (internal/cli): go test ./internal/cli -run TestCLIReference -update. Do not edit. -->\n\n")
	b.WriteString("# agentbox CLI reference\n\n" + app.Usage + ".\n\n")
	b.WriteString("```\nagentbox [GLOBAL OPTIONS] COMMAND [OPTIONS] [ARGUMENTS...]\n```\n\n## Global options\n\n")
	writeFlags(&b, app.Flags)
	for _, c := range app.Commands {
		writeCommand(&b, "agentbox", c, 2)
	}
	golden.Check(t, "../../docs/reference/cli.md", b.String(), *update, "go test ./internal/cli -run TestCLIReference -update")
}

func writeCommand(b *strings.Builder, parent string, c *cli.Command, depth int) {
	if c.Hidden {
		return
	}
	path := parent + " " + c.Name
	fmt.Fprintf(b, "%s %s\n\n%s\n\n", strings.Repeat("#", min(depth, 6)), path, strings.TrimSpace(c.Usage))
	if len(c.Subcommands) > 0 {
		fmt.Fprintf(b, "```\n%s COMMAND [OPTIONS]\n```\n\n", path)
	} else {
		usage := path
		if len(c.Flags) > 0 {
			usage += " [OPTIONS]"
		}
		if c.ArgsUsage != "" {
			usage += " " + c.ArgsUsage
		}
		fmt.Fprintf(b, "```\n%s\n```\n\n", usage)
	}
	if d := strings.TrimSpace(c.Description); d != "" {
		b.WriteString(d + "\n\n")
	}
	writeFlags(b, c.Flags)
	for _, s := range c.Subcommands {
		writeCommand(b, path, s, depth+1)
	}
}

func writeFlags(b *strings.Builder, flags []cli.Flag) {
	if len(flags) == 0 {
		return
	}
	b.WriteString("| option | meaning |\n| --- | --- |\n")
	for _, f := range flags {
		names := f.Names()
		spell := make([]string, len(names))
		for i, n := range names {
			if len(n) == 1 {
				spell[i] = "-" + n
			} else {
				spell[i] = "--" + n
			}
		}
		opt := "`" + strings.Join(spell, "`, `") + "`"
		if df, ok := f.(cli.DocGenerationFlag); ok && df.TakesValue() {
			opt += " VALUE"
		}
		var usage, def string
		if df, ok := f.(cli.DocGenerationFlag); ok {
			usage, def = df.GetUsage(), df.GetDefaultText()
		}
		if rf, ok := f.(cli.RequiredFlag); ok && rf.IsRequired() {
			usage = "**required.** " + usage
		}
		if def != "" && def != `""` && def != "false" {
			usage += fmt.Sprintf(" (default: %s)", def)
		}
		if mf, ok := f.(interface{ IsSliceFlag() bool }); ok && mf.IsSliceFlag() {
			usage += " (repeatable)"
		}
		fmt.Fprintf(b, "| %s | %s |\n", opt, strings.ReplaceAll(usage, "|", `\|`))
	}
	b.WriteString("\n")
}
