package manager

import (
	"flag"
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

// publishBinary reads the flag containerd's shim library registered and
// parsed, as it parsed it.
func TestPublishBinary(t *testing.T) {
	if got := publishBinary(); got != "" {
		t.Errorf("publishBinary() without the flag registered = %q, want \"\"", got)
	}
	var v string
	flag.StringVar(&v, "publish-binary", "", "")
	if err := flag.CommandLine.Parse([]string{"-publish-binary", "/usr/bin/containerd", "start"}); err != nil {
		t.Fatal(err)
	}
	if got := publishBinary(); got != "/usr/bin/containerd" {
		t.Errorf("publishBinary() = %q, want /usr/bin/containerd", got)
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
		if containerdV3(bin) {
			t.Errorf("containerdV3 with -publish-binary %s: want false", bin)
		}
	}
	if containerdV3("") {
		t.Error("containerdV3 without -publish-binary: want false")
	}
}
