package cli

import (
	"testing"

	"agentbox.dev/agentbox/internal/golden"
)

// TestCLIReference: docs/reference/cli.md is the CLI's own help, as
// urfave/cli renders it; regenerate it with go test ./internal/cli -run
// TestCLIReference -update (make check runs this test).
func TestCLIReference(t *testing.T) {
	md, err := App().ToMarkdown()
	if err != nil {
		t.Fatal(err)
	}
	page := "<!-- Generated from the agentbox CLI (internal/cli): go test ./internal/cli -run TestCLIReference -update. Do not edit. -->\n\n" +
		"# agentbox CLI reference\n\n" + md
	golden.Check(t, "../../docs/reference/cli.md", page, *update, "go test ./internal/cli -run TestCLIReference -update")
}
