// Package naming is the rule a checkpoint's name keeps: a name in the
// node's store, never a path. Pure: the role compiler checks a template's
// name with it, without the store's file handling (internal/checkpoint).
package naming

import (
	"fmt"
	"regexp"
	"strings"
)

// nameRE is what a checkpoint name may be: a name, never a path.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Valid says why name cannot name a checkpoint (nil: it can).
func Valid(name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("checkpoint name %q: want 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit (a name in the node's store, never a path)", name)
	}
	return nil
}
