package cli

import (
	"os"
	"testing"
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
	const path = "../../docs/reference/cli.md"
	if *update {
		if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != page {
		t.Fatalf("%s is stale: go test ./internal/cli -run TestCLIReference -update", path)
	}
}
