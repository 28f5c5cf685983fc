package cli

import (
	"os"
	"testing"

	"agentbox.dev/agentbox/internal/config"
)

// TestMain points every command the tests run at testdata/shim.toml
// unless the test names another config: the machine's own config and
// control directory hold whatever runs on it (the checks run beside the
// end-to-end tests, whose sandboxes explain would list).
func TestMain(m *testing.M) {
	os.Setenv(config.PathEnv, "testdata/shim.toml")
	os.Exit(m.Run())
}
