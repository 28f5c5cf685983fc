// Package version carries the build's version, set with -ldflags -X.
package version

var (
	// Version is the release version, or "dev".
	Version = "dev"
	// Revision is the VCS revision the binary was built from.
	Revision = ""
)
