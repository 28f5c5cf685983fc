package manager

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// containerd's CRI offers recursive read-only mounts only to runtimes
// whose features list "rro".
func TestInfoAdvertisesRRO(t *testing.T) {
	info, err := (&manager{}).Info(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := typeurl.UnmarshalAny(info.Features)
	if err != nil {
		t.Fatal(err)
	}
	f, ok := v.(*features.Features)
	if !ok || !slices.Contains(f.MountOptions, "rro") || !slices.Contains(f.MountOptions, "ro") {
		t.Fatalf("features %+v", v)
	}
}
