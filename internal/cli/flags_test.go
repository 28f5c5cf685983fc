package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/config"
)

// --config before the command or after it, AGENTBOX_CONFIG, or the
// default: one answer, and whether the config was named.
func TestConfigPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   string
		args  []string
		want  string
		named bool
	}{
		{"nothing", "", []string{"cmd"}, config.DefaultPath, false},
		{"the variable", "/etc/x.toml", []string{"cmd"}, "/etc/x.toml", true},
		{"before the command", "/etc/x.toml", []string{"--config", "/a.toml", "cmd"}, "/a.toml", true},
		{"after the command", "", []string{"cmd", "--config", "/b.toml"}, "/b.toml", true},
		{"both: the command's", "", []string{"--config", "/a.toml", "cmd", "--config", "/b.toml"}, "/b.toml", true},
	} {
		t.Setenv(config.PathEnv, tc.env)
		var got string
		var named bool
		app := &cli.App{Name: "agentbox", Flags: []cli.Flag{configFlag()}, Writer: io.Discard, Commands: []*cli.Command{{
			Name: "cmd", Flags: []cli.Flag{configFlag()},
			Action: func(c *cli.Context) error { got, named = configPath(c); return nil },
		}}}
		if err := app.Run(append([]string{"agentbox"}, tc.args...)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want || named != tc.named {
			t.Errorf("%s: %q named=%v, want %q named=%v", tc.name, got, named, tc.want, tc.named)
		}
	}
}

// A format a command does not write is refused with exit 2, naming the
// flag; -o picks one it does.
func TestOutput(t *testing.T) {
	run := func(args ...string) (string, error) {
		var got string
		app := &cli.App{Name: "agentbox", Writer: io.Discard, ExitErrHandler: func(*cli.Context, error) {}, Commands: []*cli.Command{{
			Name: "cmd", Flags: []cli.Flag{outputFlag("text", "json")},
			Action: func(c *cli.Context) (err error) { got, err = output(c, "text", "json"); return err },
		}}}
		err := app.Run(append([]string{"agentbox", "cmd"}, args...))
		return got, err
	}
	if got, err := run(); got != "text" || err != nil {
		t.Errorf("default: %q %v", got, err)
	}
	if got, err := run("-o", "json"); got != "json" || err != nil {
		t.Errorf("-o json: %q %v", got, err)
	}
	_, err := run("--output", "yaml")
	var exit cli.ExitCoder
	if err == nil || !strings.Contains(err.Error(), `--output "yaml": want text or json`) || !asExit(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("-o yaml: %v", err)
	}
}

func asExit(err error, target *cli.ExitCoder) bool {
	e, ok := err.(cli.ExitCoder) //nolint:errorlint // cli returns the ExitCoder itself
	*target = e
	return ok
}
