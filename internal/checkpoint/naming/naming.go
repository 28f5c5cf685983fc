// Package naming is the rule a checkpoint's name keeps: a name in the
// node's store, never a path. Pure: the role compiler checks a template's
// name with it, without the store's file handling (internal/checkpoint).
package naming

import (
	"fmt"
	"strings"
)

// plainName says whether name is what a checkpoint name may be: 1 to 63
// of a-z, 0-9, '.', '_' and '-', starting with a letter or digit. (A loop,
// not a regular expression: this package is in every shim process, and
// compiling one with a repetition count cost each of them 0.3 ms at init.)
func plainName(name string) bool {
	if len(name) == 0 || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// Valid says why name cannot name a checkpoint (nil: it can).
func Valid(name string) error {
	if !plainName(name) || strings.Contains(name, "..") {
		return fmt.Errorf("checkpoint name %q: want 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit (a name in the node's store, never a path)", name)
	}
	return nil
}
