package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/doclinks"
)

// documentedCommands are the agentbox command lines in the docs' and the
// README's code blocks, by "file:line".
func documentedCommands(t *testing.T) map[string]string {
	t.Helper()
	pages, err := doclinks.Pages("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range doclinks.Commands(pages, "agentbox") {
		out[c.At] = c.Line
	}
	return out
}

// shellWords splits a command line as sh would, quotes and all, up to a
// comment, a redirection or a pipe.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case !inWord && (r == '#' || r == '>' || r == '|' || r == '<'):
			return words
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// stubbed is the CLI with every action replaced: a command line is parsed
// (its command, its flags and their values, the required ones) and nothing
// runs.
func stubbed() *cli.App {
	app := App()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	app.ExitErrHandler = func(*cli.Context, error) {}
	var walk func([]*cli.Command)
	walk = func(cs []*cli.Command) {
		for _, c := range cs {
			c.Before, c.After = nil, nil
			if len(c.Subcommands) > 0 {
				c.Action = func(ctx *cli.Context) error {
					return fmt.Errorf("%q needs a subcommand", ctx.Command.FullName())
				}
			} else {
				c.Action = func(*cli.Context) error { return nil }
			}
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
	return app
}

// TestDocumentedCommandsParse: every agentbox command the docs show is one
// the CLI accepts as written: its command exists, each flag is one of its
// own with a value where it takes one, and its required flags are there.
// (A command refused for what it does, not how it is written, is the e2e
// suite's to find.)
func TestDocumentedCommandsParse(t *testing.T) {
	cmds := documentedCommands(t)
	if len(cmds) < 15 {
		t.Fatalf("found only %d documented commands: the walk is wrong", len(cmds))
	}
	t.Logf("%d documented agentbox command lines", len(cmds))
	for at, line := range cmds {
		var errOut bytes.Buffer
		app := stubbed()
		app.ErrWriter = &errOut
		if err := app.Run(shellWords(line)); err != nil {
			t.Errorf("%s: %q: %v %s", at, line, err, strings.TrimSpace(errOut.String()))
		}
	}
	// The check can fail: a flag no command has, a missing required one.
	for _, bad := range []string{"agentbox policy diff --trail x", "agentbox audit tail --no-such-flag", "agentbox nosuch"} {
		if err := stubbed().Run(shellWords(bad)); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestShellWords(t *testing.T) {
	got := shellWords(`agentbox sandbox suspend --name r --reason "waiting for review" --pod a/b   # comment`)
	want := []string{"agentbox", "sandbox", "suspend", "--name", "r", "--reason", "waiting for review", "--pod", "a/b"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("%q", got)
	}
	if got := shellWords(`agentbox audit report -o html DIR > a.html`); len(got) != 6 {
		t.Fatalf("%q", got)
	}
}
