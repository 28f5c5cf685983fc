package policy

import (
	"encoding/json"
	"path/filepath"
	"runtime"
	"testing"
)

func repoPolicies(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "policies")
}

// TestShippedPolicies loads every file in policies/ and checks what the
// docs promise about the shipped roles.
func TestShippedPolicies(t *testing.T) {
	set, err := LoadPaths(repoPolicies(t))
	if err != nil {
		t.Fatalf("shipped policies do not load:\n%v", err)
	}
	if len(set.Files) < 4 {
		t.Fatalf("loaded %v", set.Files)
	}
	for _, name := range []string{"baseline", "coder", "researcher"} {
		if _, err := set.Profile(name); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	b, _ := set.Profile("baseline")
	if b.Network.Egress != EgressNone || b.Filesystem.Rootfs != RootfsReadOnly || b.Process.MaxProcesses != 64 ||
		b.Limits.MemoryBytes != 512<<20 || b.Limits.WallClock.Minutes() != 15 || !b.Filesystem.NoExecWritable ||
		len(b.Filesystem.Writable) != 1 || b.Filesystem.Writable[0] != "/tmp" || len(b.Process.Capabilities) != 0 {
		t.Fatalf("baseline is not what the docs say: %+v", b)
	}
	// baseline is claimable by every pod and every ctr container.
	for _, req := range []Request{{PodNamespace: "anything", ContainerdNamespace: "k8s.io"}, {ContainerdNamespace: "default"}} {
		if err := set.Authorize("baseline", req); err != nil {
			t.Errorf("baseline not bound for %+v: %v", req, err)
		}
	}
	if err := set.Authorize("coder", Request{PodNamespace: "agents", ContainerdNamespace: "k8s.io"}); err != nil {
		t.Error(err)
	}
	if err := set.Authorize("coder", Request{PodNamespace: "default", ContainerdNamespace: "k8s.io"}); err == nil {
		t.Error("coder must not be bound to namespace default")
	}
}

// A compiled profile reads back from its JSON as it was (a checkpoint
// keeps the profile it was taken under, and a restore compares with it).
func TestProfileJSONRoundTrip(t *testing.T) {
	set, err := LoadPaths(repoPolicies(t))
	if err != nil {
		t.Fatal(err)
	}
	for name := range set.Roles {
		p, err := set.Profile(name)
		if err != nil {
			continue
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var back Profile
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b2, _ := json.Marshal(&back)
		if string(b) != string(b2) {
			t.Errorf("%s: the profile changed through JSON:\n%s\n%s", name, b, b2)
		}
	}
}
