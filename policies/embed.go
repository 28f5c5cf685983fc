// Package policies holds the shipped roles and bindings, embedded so that
// `agentbox install` can put them on a node.
package policies

import "embed"

// Files are the shipped *.yaml policy files.
//
//go:embed *.yaml
var Files embed.FS
