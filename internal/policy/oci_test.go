package policy

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/ocispec"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const goldenRoles = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: minimal}
spec: {}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: full}
spec:
  filesystem:
    rootfs: overlay
    writable: [/workspace, /tmp]
    noExecWritable: false
    hostMounts: [{path: /srv/models}, {path: /srv/cache, readOnly: false}]
    maskedPaths: [/proc/kallsyms]
  network: {egress: open}
  process:
    maxProcesses: 100
    capabilities: [NET_BIND_SERVICE]
    runAsUser: 1000
    runAsGroup: 2000
    deniedSyscalls: [ptrace, mount]
  credentials:
    env: {allow: [PATH, "AGENT_*"]}
    secrets: [{env: API_TOKEN, file: /etc/agentbox/secrets/api}]
    serviceAccountToken: true
  limits: {cpu: 1500m, memory: 1Gi, cpuTime: 90s, openFiles: 4096, wallClock: 1h}
`

// baseSpec is a CRI-like container spec: runtime mounts, a service-account
// token, host volumes, a seccomp profile, an environment with a secret.
func baseSpec() *specs.Spec {
	return &specs.Spec{
		Root: &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args:         []string{"agent"},
			User:         specs.User{UID: 0, GID: 0, AdditionalGids: []uint32{10}},
			Env:          []string{"PATH=/bin", "AGENT_MODE=fast", "AWS_SECRET_ACCESS_KEY=x", "API_TOKEN=from-image"},
			Capabilities: &specs.LinuxCapabilities{Bounding: RuntimeDefaultCapabilities, Effective: RuntimeDefaultCapabilities, Permitted: RuntimeDefaultCapabilities},
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}, {Type: "RLIMIT_CORE", Hard: 0, Soft: 0}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/etc/hosts", Type: "bind", Source: testEnv.SandboxRootDir + "/hosts", Options: []string{"rbind", "rw"}},
			{Destination: "/dev/shm", Type: "bind", Source: testEnv.SandboxStateDir + "/shm", Options: []string{"rbind", "rw"}},
			{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: testEnv.PodDir + "/volumes/kubernetes.io~projected/kube-api-access-x", Options: []string{"rbind", "ro"}},
			{Destination: "/models", Type: "bind", Source: "/srv/models/llama", Options: []string{"rbind", "rw"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-x"}},
			Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: ptr(int64(8 << 30))}},
			Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{
				{Names: []string{"read", "ptrace", "write"}, Action: specs.ActAllow},
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// testEnv is a CRI pod's directories, as the shim proves them: containerd's
// for sandbox "sb", the kubelet's for pod UID "u".
var testEnv = MountEnv{
	SandboxRootDir:  "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/sb",
	SandboxStateDir: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/sb",
	ContainerDir:    "/var/lib/containerd/io.containerd.grpc.v1.cri/containers/ctr",
	PodDir:          "/var/lib/kubelet/pods/u",
}

// TestSpecGolden compiles roles onto baseSpec and compares the resulting
// spec, changes and runsc flags with testdata/<role>.golden.json.
func TestSpecGolden(t *testing.T) {
	set := mustParse(t, goldenRoles)
	for _, role := range []string{"minimal", "full"} {
		t.Run(role, func(t *testing.T) {
			p, err := set.Profile(role)
			if err != nil {
				t.Fatal(err)
			}
			s := baseSpec()
			if role == "minimal" {
				s.Mounts = s.Mounts[:4] // no host volume nor tmpfs: minimal allows neither
			}
			secrets := map[string]string{"API_TOKEN": "s3cr3t"}
			changes, err := ocispec.Apply(s, p.SpecRewrites(secrets, testEnv)...)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.MarshalIndent(map[string]any{"changes": changes, "spec": s, "runscFlags": p.RunscFlags()}, "", "  ")
			checkGolden(t, role+".golden.json", got)
		})
	}
}

// checkGolden compares got with testdata/name, rewriting it under -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden := filepath.Join("testdata", name)
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if strings.TrimSpace(string(want)) != strings.TrimSpace(string(got)) {
		t.Fatalf("differs from %s (go test -update to accept):\n%s", golden, got)
	}
}

// The properties the golden files encode, asserted directly so a careless
// -update cannot bless a regression.
func TestSpecProperties(t *testing.T) {
	set := mustParse(t, goldenRoles)
	min, _ := set.Profile("minimal")
	s := baseSpec()
	s.Mounts = s.Mounts[:4]
	if _, err := ocispec.Apply(s, min.SpecRewrites(nil, testEnv)...); err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly {
		t.Error("minimal: rootfs must be read-only")
	}
	if s.Process.User.UID != DefaultUID || len(s.Process.User.AdditionalGids) != 0 || !s.Process.NoNewPrivileges {
		t.Errorf("minimal: user %+v nnp %v", s.Process.User, s.Process.NoNewPrivileges)
	}
	if c := s.Process.Capabilities; len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Ambient)+len(c.Inheritable) != 0 {
		t.Errorf("minimal: capabilities %+v", c)
	}
	for _, m := range s.Mounts {
		if strings.Contains(m.Destination, "serviceaccount") {
			t.Error("minimal: service-account token must be removed")
		}
		if m.Destination == "/etc/hosts" && !contains(m.Options, "ro") {
			t.Error("/etc/hosts must be read-only")
		}
	}
	for _, kv := range s.Process.Env {
		if strings.HasPrefix(kv, "AWS_") || strings.HasPrefix(kv, "AGENT_") || strings.HasPrefix(kv, "API_TOKEN") {
			t.Errorf("minimal: %s must be filtered", kv)
		}
	}
	if *s.Linux.Resources.Memory.Limit != DefaultMemory {
		t.Errorf("memory %d: the role's limit must cap the spec's", *s.Linux.Resources.Memory.Limit)
	}
	rl := map[string]uint64{}
	for _, r := range s.Process.Rlimits {
		rl[r.Type] = r.Hard
	}
	if rl["RLIMIT_NPROC"] != 64 || rl["RLIMIT_NOFILE"] != 1024 || rl["RLIMIT_CORE"] != 0 {
		t.Errorf("rlimits %v", rl)
	}
	if f := min.RunscFlags(); f["network"] != "none" {
		t.Errorf("flags %v", f)
	}
	// Port-forward needs gVisor's netstack on the pod's interface (netpolicy
	// then drops all the sandbox sends).
	pf := *min
	pf.Network.PortForward = []int{8080}
	if f := pf.RunscFlags(); f["network"] != "" {
		t.Errorf("egress none with port-forward: flags %v", f)
	}

	full, _ := set.Profile("full")
	s = baseSpec()
	if _, err := ocispec.Apply(s, full.SpecRewrites(map[string]string{"API_TOKEN": "s3cr3t"}, testEnv)...); err != nil {
		t.Fatal(err)
	}
	env := strings.Join(s.Process.Env, " ")
	if !strings.Contains(env, "API_TOKEN=s3cr3t") || strings.Contains(env, "from-image") || !strings.Contains(env, "AGENT_MODE=fast") || strings.Contains(env, "AWS_") {
		t.Errorf("full env %v", s.Process.Env)
	}
	var sawModels, sawToken bool
	for _, m := range s.Mounts {
		switch m.Destination {
		case "/models":
			sawModels = contains(m.Options, "ro") && !contains(m.Options, "rw")
		case "/var/run/secrets/kubernetes.io/serviceaccount":
			sawToken = true
		case "/tmp":
			if m.Type != "tmpfs" || contains(m.Options, "noexec") {
				t.Errorf("full /tmp %+v: scratch replaces the spec's, exec allowed", m)
			}
		}
	}
	if !sawModels || !sawToken {
		t.Errorf("full: host mount read-only %v, token kept %v", sawModels, sawToken)
	}
	// The policy's rules come first (first match wins); the pod's own
	// profile follows, without the syscalls the policy denies.
	rules := s.Linux.Seccomp.Syscalls
	last := rules[len(rules)-1]
	if rules[0].Action != specs.ActErrno || !contains(rules[0].Names, "mount") || !contains(rules[0].Names, "ptrace") ||
		contains(last.Names, "ptrace") || !contains(last.Names, "read") || last.Action != specs.ActAllow {
		t.Errorf("seccomp rules %+v", rules)
	}
	if f := full.RunscFlags(); f["overlay2"] != "root:memory" || f["oci-seccomp"] != "true" || f["network"] != "" {
		t.Errorf("flags %v", f)
	}
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func TestHostMountRefused(t *testing.T) {
	set := mustParse(t, goldenRoles)
	p, _ := set.Profile("minimal")
	s := baseSpec() // carries /srv/models/llama -> /models
	_, err := ocispec.Apply(s, p.SpecRewrites(nil, testEnv)...)
	if err == nil || !strings.Contains(err.Error(), "/srv/models/llama -> /models") || !strings.Contains(err.Error(), "the role's host mounts: none") {
		t.Fatalf("want the mount refused and named, got %v", err)
	}
	// A bind mount pretending to be /etc/hosts from an arbitrary source is
	// not a runtime mount.
	s = baseSpec()
	s.Mounts = []specs.Mount{{Destination: "/etc/hosts", Type: "bind", Source: "/etc/shadow"}}
	if _, err := ocispec.Apply(s, p.SpecRewrites(nil, testEnv)...); err == nil {
		t.Fatal("host file disguised as /etc/hosts must be refused")
	}
	full, _ := set.Profile("full")
	s = baseSpec()
	if _, err := ocispec.Apply(s, full.SpecRewrites(nil, testEnv)...); err == nil || !strings.Contains(err.Error(), "secret API_TOKEN") {
		t.Fatalf("a missing secret must refuse the container: %v", err)
	}
}

func TestFilterEnvNeverLeaksValues(t *testing.T) {
	p := &Profile{Credentials: CredentialsProfile{EnvAllow: []string{"PATH", "AGENT_*"}}}
	kept, dropped := p.FilterEnv([]string{"PATH=/bin", "AGENT_X=1", "AGENTX=2", "TOKEN=hunter2", "NOVALUE"})
	if strings.Join(kept, ",") != "PATH=/bin,AGENT_X=1" {
		t.Errorf("kept %v", kept)
	}
	if strings.Join(dropped, ",") != "AGENTX,TOKEN,NOVALUE" {
		t.Errorf("dropped %v (names only)", dropped)
	}
}
