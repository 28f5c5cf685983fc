package explain

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/policy"
)

func TestParseImageUser(t *testing.T) {
	for in, want := range map[string]ImageUser{"0": {0, 0}, "1000": {1000, 0}, "1000:2000": {1000, 2000}} {
		if got, err := ParseImageUser(in); err != nil || got != want {
			t.Errorf("%q: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "root", "1000:", "1000:staff", "-1", "4294967296"} {
		if _, err := ParseImageUser(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A manifest is a v1 Pod with containers; a field the model does not know
// is refused with its path, not ignored.
func TestReadPod(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"not a pod", "apiVersion: v1\nkind: Service\n", `kind "Service"`},
		{"no containers", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n", "spec.containers"},
		{"an unknown security field", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {runAsUsr: 0}\n  containers: [{name: a, image: x}]\n",
			"securityContext.runAsUsr: unknown field"},
	} {
		pod, err := readPod("-", strings.NewReader(tc.yaml))
		if err == nil && pod != nil {
			_, _, err = pod.containers(func() *specs.Spec { return SampleSpec(policy.Request{}) }, policy.MountEnv{}, ImageUser{})
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	pod, err := readPod("-", strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: x}]\n"))
	if err != nil || pod.Metadata.Namespace != "default" {
		t.Fatalf("a minimal pod: %+v %v", pod, err)
	}
}

// The sample is a CRI pod's container only when the request names a pod
// namespace.
func TestSampleSpec(t *testing.T) {
	if a := SampleSpec(policy.Request{}).Annotations; a != nil {
		t.Errorf("a ctr request got CRI annotations: %v", a)
	}
	if a := SampleSpec(policy.Request{PodNamespace: "team-a"}).Annotations; len(a) != 2 {
		t.Errorf("a pod request: %v", a)
	}
}
