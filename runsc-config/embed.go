// Package runscconfig holds the shipped shim config, embedded so that
// `agentbox install` can put it on a node.
package runscconfig

import _ "embed"

// ConfigTOML is runsc-config/config.toml.
//
//go:embed config.toml
var ConfigTOML []byte
