package manager

import (
	"debug/buildinfo"
	"strconv"
	"strings"
)

// containerdV3 reports whether the containerd that ran `shim start` takes
// a shim of version 3 (task API v3). Every containerd passes its own
// binary as -publish-binary; 2.x is built from the module
// github.com/containerd/containerd/v2, 1.7 (which refuses a version above 2)
// from github.com/containerd/containerd. Anything unreadable or unknown is
// answered as 1.7: version 2 works with every containerd, only slower.
func containerdV3(args []string) bool {
	bin := publishBinary(args)
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

// publishBinary is the value of -publish-binary in a shim's arguments.
func publishBinary(args []string) string {
	for i, a := range args {
		for _, name := range []string{"-publish-binary", "--publish-binary"} {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}
