// Package structure holds the tests of the module's structure: which
// packages may depend on which, through any chain of imports (go list
// -deps), and that no file outgrows the length one reader can hold. It has
// no code of its own.
package structure
