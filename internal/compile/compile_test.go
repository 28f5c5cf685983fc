package compile

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const sandboxDir = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/sb"

// criSpec is a CRI pod sandbox's spec as containerd makes it, with a pod
// author's hostile dev.gvisor annotation and a low oom_score_adj.
func criSpec() *specs.Spec {
	adj := -998
	return &specs.Spec{
		Root: &specs.Root{Path: "rootfs"},
		Annotations: map[string]string{
			"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-namespace": "agents",
			"dev.gvisor.flag.network": "host",
		},
		Process: &specs.Process{Args: []string{"/pause"}, Env: []string{"PATH=/bin", "GITHUB_TOKEN=x"}, OOMScoreAdj: &adj},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: sandboxDir + "/resolv.conf", Options: []string{"rbind", "rw"}},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.MountNamespace},
			{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"}}},
	}
}

func input(t *testing.T, role, namespace string) Input {
	t.Helper()
	set, err := policy.LoadPaths("../../policies")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Runsc.Flags = map[string]string{"platform": "systrap"}
	floor := 0
	return Input{
		Config: cfg, Policies: set, OOMFloor: &floor,
		Request: policy.Request{Annotations: map[string]string{policy.RoleAnnotation: role}, ContainerdNamespace: "k8s.io", PodNamespace: namespace, Handler: "agentbox"},
		Mounts:  policy.MountEnv{SandboxRootDir: sandboxDir},
	}
}

// TestCompileGolden pins everything the shim applies for two pods: the
// spec, its changes, runsc's flags, the egress plan and the audit points.
func TestCompileGolden(t *testing.T) {
	for _, tc := range []struct{ name, role, ns string }{{"baseline", "baseline", "team"}, {"coder", "coder", "agents"}} {
		t.Run(tc.name, func(t *testing.T) {
			spec := criSpec()
			res, err := Compile(input(t, tc.role, tc.ns), spec)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.MarshalIndent(map[string]any{"result": res, "spec": spec}, "", "  ")
			golden := filepath.Join("testdata", tc.name+".golden.json")
			if *update {
				os.WriteFile(golden, append(got, '\n'), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update)", err)
			}
			if strings.TrimSpace(string(want)) != strings.TrimSpace(string(got)) {
				t.Fatalf("differs from %s (go test -update to accept):\n%s", golden, got)
			}
			// What a careless -update must not bless.
			if _, ok := spec.Annotations["dev.gvisor.flag.network"]; ok || *spec.Process.OOMScoreAdj != 0 || res.RunscFlags["platform"] != "systrap" || res.RunscFlags["oci-seccomp"] != "true" {
				t.Fatalf("fixed rewrites or flags missing: %+v %v", spec.Annotations, res.RunscFlags)
			}
			if strings.Contains(strings.Join(spec.Process.Env, " "), "GITHUB_TOKEN") {
				t.Fatal("the environment was not filtered")
			}
		})
	}
}

// A refusal still names the role it selected.
func TestCompileRefusalKeepsTheProfile(t *testing.T) {
	spec := criSpec()
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/etc", Options: []string{"rbind"}})
	res, err := Compile(input(t, "baseline", "team"), spec)
	if !errdefs.IsPermissionDenied(err) || res == nil || res.Profile == nil || res.Profile.Role != "baseline" {
		t.Fatalf("want a PermissionDenied refusal with the profile: %v %+v", err, res)
	}
	_, err = Compile(input(t, "coder", "team"), criSpec())
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), `role "coder" is not bound`) {
		t.Fatalf("unbound role: %v", err)
	}
}
