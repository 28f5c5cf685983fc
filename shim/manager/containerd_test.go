package manager

import (
	"os"
	"testing"
)

func TestTakesV3(t *testing.T) {
	for module, want := range map[string]bool{
		"github.com/containerd/containerd/v2":  true,
		"github.com/containerd/containerd/v3":  true,
		"github.com/containerd/containerd":     false, // 1.7 refuses version 3
		"github.com/containerd/containerd/v":   false,
		"github.com/containerd/containerd/v1":  false,
		"github.com/containerd/containerd/vx":  false,
		"github.com/containerd/containerd/v2x": false,
		"example.com/containerd/v2":            false,
		"":                                     false,
	} {
		if got := takesV3(module); got != want {
			t.Errorf("takesV3(%q) = %v, want %v", module, got, want)
		}
	}
}

func TestPublishBinary(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"shim", "-namespace", "k8s.io", "-address", "/a", "-publish-binary", "/usr/bin/containerd", "-id", "x", "start"}, "/usr/bin/containerd"},
		{[]string{"shim", "--publish-binary=/opt/containerd", "start"}, "/opt/containerd"},
		{[]string{"shim", "-publish-binary"}, ""},
		{[]string{"shim", "-namespace", "k8s.io", "start"}, ""},
	} {
		if got := publishBinary(c.args); got != c.want {
			t.Errorf("publishBinary(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// A binary that is not containerd's, or no binary at all, is answered as
// containerd 1.7: version 2, which every containerd takes.
func TestContainerdV3FallsBackToV2(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{self, "/nonexistent/containerd", "/etc/hostname"} {
		if containerdV3([]string{"shim", "-publish-binary", bin, "start"}) {
			t.Errorf("containerdV3 with -publish-binary %s: want false", bin)
		}
	}
	if containerdV3([]string{"shim", "start"}) {
		t.Error("containerdV3 without -publish-binary: want false")
	}
}
