package manager

import (
	"debug/buildinfo"
	"flag"
	"strconv"
	"strings"
)

// containerdV3 reports whether the containerd whose binary is bin (the
// -publish-binary it ran `shim start` with) takes a shim of version 3
// (task API v3). 2.x is built from the module
// github.com/containerd/containerd/v2, 1.7 (which refuses a version above 2)
// from github.com/containerd/containerd. Anything unreadable or unknown is
// answered as 1.7: version 2 works with every containerd, only slower.
func containerdV3(bin string) bool {
	if bin == "" {
		return false
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return false
	}
	return takesV3(bi.Main.Path)
}

// takesV3 reports whether containerd built from module takes a version 3
// shim: github.com/containerd/containerd/v2 and later majors do.
func takesV3(module string) bool {
	major, ok := strings.CutPrefix(module, "github.com/containerd/containerd/v")
	n, err := strconv.Atoi(major)
	return ok && err == nil && n >= 2
}

// publishBinary is the -publish-binary containerd's shim library parsed
// from the command line (pkg/shim registers it in the flag set before
// Start runs); "" when it was not given.
func publishBinary() string {
	if f := flag.Lookup("publish-binary"); f != nil {
		return f.Value.String()
	}
	return ""
}
