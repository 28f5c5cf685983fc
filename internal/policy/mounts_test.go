package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/ocispec"
)

const mountRoles = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: vols}
spec:
  filesystem:
    writable: [/tmp]
    hostMounts: [{path: /srv/data, readOnly: false}, {path: /srv/models}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: builder}
spec:
  inherits: vols
  filesystem: {allowExec: [/workspace]}
  credentials: {serviceAccountToken: true}
`

// TestMountClassification: each bind is accepted only from this pod's own
// directories or the role's host mounts, never by its name or by prefix
// text; accepted writable places are noexec.
func TestMountClassification(t *testing.T) {
	set := mustParse(t, mountRoles)
	pod := testEnv.PodDir
	sb := testEnv.SandboxRootDir
	// A node whose sockets lie below a role's host mount (an admin's
	// broad hostMounts entry).
	reserved := testEnv
	reserved.Reserved = []string{"/srv/data/agentbox/control"}
	cases := []struct {
		name, role string
		env        MountEnv
		m          specs.Mount
		// want is "" for refused, else the options that must be present.
		want    []string
		notWant []string
		refusal string
	}{
		{"pod hosts file", "vols", testEnv, bind(sb+"/hosts", "/etc/hosts", "rw"), []string{"ro", "nosuid", "nodev"}, []string{"rw"}, ""},
		{"pod hosts file at another place", "vols", testEnv, bind(sb+"/hosts", "/etc/passwd"), nil, nil, "not the one that belongs at /etc/passwd"},
		{"pod resolv.conf used as /etc/hosts", "vols", testEnv, bind(sb+"/resolv.conf", "/etc/hosts"), nil, nil, "not the one that belongs"},
		{"another pod's hosts file", "vols", testEnv, bind("/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/other/hosts", "/etc/hosts"), nil, nil, "not a mount the runtime made"},
		{"a file named hosts elsewhere", "vols", testEnv, bind("/tmp/evil/hosts", "/etc/hosts"), nil, nil, "not a mount the runtime made"},
		{"a directory named hostname", "vols", testEnv, bind("/etc/hostname", "/etc/hostname"), nil, nil, "not a mount the runtime made"},
		{"pod shm", "vols", testEnv, bind(testEnv.SandboxStateDir+"/shm", "/dev/shm", "rw"), []string{"noexec", "nosuid"}, []string{"rw"}, ""},
		{"pod shm elsewhere", "vols", testEnv, bind(testEnv.SandboxStateDir+"/shm", "/mnt"), nil, nil, "only its shm"},
		{"dot-dot out of the pod dir", "vols", testEnv, bind(pod+"/../../../../etc", "/host"), nil, nil, "not a clean absolute path"},
		{"dot-dot inside the pod dir", "vols", testEnv, bind(pod+"/volumes/../containers/c/x", "/dev/termination-log"), nil, nil, "not a clean"},
		{"double slash", "vols", testEnv, bind("/srv/data//x", "/data"), nil, nil, "not a clean"},
		{"relative source", "vols", testEnv, bind("srv/data/x", "/data"), nil, nil, "not a clean"},
		{"termination message", "vols", testEnv, bind(pod+"/containers/c/abc", "/dev/termination-log", "rw"), []string{"noexec"}, []string{"ro"}, ""},
		{"termination message dir", "vols", testEnv, bind(pod+"/containers/c", "/x"), nil, nil, "not a volume"},
		{"image volume of this container", "vols", testEnv, bind(testEnv.ContainerDir+"/volumes/0123abcd", "/var/lib/data", "rw"), []string{"noexec"}, nil, ""},
		{"image volume of another container", "vols", testEnv, bind("/var/lib/containerd/io.containerd.grpc.v1.cri/containers/other/volumes/0123abcd", "/data"), nil, nil, "not a mount the runtime made"},
		{"container dir beyond volumes", "vols", testEnv, bind(testEnv.ContainerDir+"/status", "/x"), nil, nil, "not one of its image volumes"},
		{"pod emptyDir", "vols", testEnv, bind(pod+"/volumes/kubernetes.io~empty-dir/scratch", "/work", "rw"), []string{"noexec", "nosuid", "nodev"}, nil, ""},
		{"pod emptyDir where the role allows exec", "builder", testEnv, bind(pod+"/volumes/kubernetes.io~empty-dir/ws", "/workspace", "rw"), []string{"nosuid"}, []string{"noexec"}, ""},
		{"recursive read-only (CRI rro)", "vols", testEnv, bind("/srv/data/x", "/data", "rro"), []string{"ro"}, []string{"rro", "rw", "noexec"}, ""},
		{"pod secret read-only", "vols", testEnv, bind(pod+"/volumes/kubernetes.io~secret/creds", "/creds", "ro"), []string{"ro"}, []string{"noexec"}, ""},
		{"pod configMap", "vols", testEnv, bind(pod+"/volumes/kubernetes.io~configmap/cfg", "/cfg", "ro"), []string{"ro"}, nil, ""},
		{"pod subPath", "vols", testEnv, bind(pod+"/volume-subpaths/cfg/c/0", "/etc/app.conf", "ro"), []string{"ro"}, nil, ""},
		{"pod csi volume", "vols", testEnv, bind(pod+"/volumes/kubernetes.io~csi/pv/mount", "/data"), nil, nil, "kubernetes.io~csi volume"},
		{"pod plugins dir", "vols", testEnv, bind(pod+"/plugins/x", "/x"), nil, nil, "not a volume"},
		{"another pod's secret", "vols", testEnv, bind("/var/lib/kubelet/pods/v/volumes/kubernetes.io~secret/creds", "/creds"), nil, nil, "not a mount the runtime made"},
		{"projected volume elsewhere", "vols", testEnv, bind(pod+"/volumes/kubernetes.io~projected/kube-api-access-x", "/tok"), nil, nil, "service-account token"},
		{"projected volume, role allows tokens", "builder", testEnv, bind(pod+"/volumes/kubernetes.io~projected/kube-api-access-x", "/tok", "ro"), []string{"ro"}, nil, ""},
		{"host mount rw", "vols", testEnv, bind("/srv/data/x", "/data", "rw"), []string{"noexec"}, nil, ""},
		{"host mount beside the node's sockets", "vols", reserved, bind("/srv/data/x", "/data", "rw"), []string{"noexec"}, nil, ""},
		{"host mount above the node's sockets", "vols", reserved, bind("/srv/data", "/data"), nil, nil, "reaches /srv/data/agentbox/control, which holds the node's sandbox sockets"},
		{"host mount of the node's sockets", "vols", reserved, bind("/srv/data/agentbox/control", "/c"), nil, nil, "reaches /srv/data/agentbox/control"},
		{"host mount below the node's sockets", "vols", reserved, bind("/srv/data/agentbox/control/x.sock", "/c"), nil, nil, "reaches /srv/data/agentbox/control"},
		{"host mount read-only by role", "vols", testEnv, bind("/srv/models/llama", "/models", "rw"), []string{"ro"}, []string{"rw", "noexec"}, ""},
		{"prefix text is not a parent", "vols", testEnv, bind("/srv/database", "/db"), nil, nil, "not a mount the runtime made"},
		{"k3s's containerd root, not the configured one", "vols", testEnv, bind("/var/lib/rancher/k3s/agent/containerd/io.containerd.grpc.v1.cri/sandboxes/x/resolv.conf", "/etc/resolv.conf"), nil, nil, "containerd's CRI files under /var/lib/rancher/k3s/agent/containerd, but the shim config's [cri] containerd_root is /var/lib/containerd"},
		{"another kubelet root", "vols", testEnv, bind("/var/snap/microk8s/common/var/lib/kubelet/pods/u/volumes/kubernetes.io~secret/s", "/s"), nil, nil, "[cri] kubelet_root is /var/lib/kubelet"},
		{"outside the CRI, pod files are nobody's", "vols", MountEnv{}, bind(sb+"/hosts", "/etc/hosts"), nil, nil, "not a mount the runtime made"},
		{"outside the CRI, kubelet volumes too", "vols", MountEnv{}, bind(pod+"/volumes/kubernetes.io~secret/creds", "/creds"), nil, nil, "not a mount the runtime made"},
		{"tmpfs with exec", "vols", MountEnv{}, specs.Mount{Destination: "/mnt", Type: "tmpfs", Source: "tmpfs", Options: []string{"exec"}}, nil, nil, "not a mount a runtime adds"},
		{"overlay", "vols", MountEnv{}, specs.Mount{Destination: "/x", Type: "overlay", Source: "overlay"}, nil, nil, "not a mount a runtime adds"},
		{"proc elsewhere", "vols", MountEnv{}, specs.Mount{Destination: "/host-proc", Type: "proc", Source: "proc"}, nil, nil, "not a mount a runtime adds"},
		{"tmpfs /dev/shm", "vols", MountEnv{}, specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"exec", "suid"}}, []string{"noexec", "nosuid", "nodev"}, []string{"exec", "suid"}, ""},
		{"sysfs", "vols", MountEnv{}, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"rw"}}, []string{"ro", "nosuid"}, []string{"rw"}, ""},
		{"unclean destination", "vols", MountEnv{}, specs.Mount{Destination: "/proc/../x", Type: "proc", Source: "proc"}, nil, nil, "destination"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := set.Profile(tc.role)
			if err != nil {
				t.Fatal(err)
			}
			s := &specs.Spec{Root: &specs.Root{}, Mounts: []specs.Mount{tc.m}}
			var staged []Bind
			env := tc.env
			env.Stage = func(b Bind) (string, error) { staged = append(staged, b); return "/staged", nil }
			_, err = p.rewriteMounts(env)(s)
			if tc.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("want refusal %q, got %v", tc.refusal, err)
				}
				if len(staged) != 0 {
					t.Fatalf("a refused mount was staged: %+v", staged)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got specs.Mount
			for _, m := range s.Mounts {
				if m.Destination == tc.m.Destination {
					got = m
				}
			}
			for _, o := range tc.want {
				if !contains(got.Options, o) {
					t.Errorf("options %v lack %s", got.Options, o)
				}
			}
			for _, o := range tc.notWant {
				if contains(got.Options, o) {
					t.Errorf("options %v have %s", got.Options, o)
				}
			}
			if isBind(tc.m) {
				if len(staged) != 1 || got.Source != "/staged" {
					t.Fatalf("an accepted bind must be staged and named by its staging path: %+v, %+v", staged, got)
				}
				b := staged[0]
				if filepath.Join(b.Root, b.Rel) != tc.m.Source || b.ReadOnly != contains(got.Options, "ro") || b.NoExec != contains(got.Options, "noexec") {
					t.Fatalf("staged %+v does not match the mount %+v", b, got)
				}
			}
		})
	}
}

func bind(src, dst string, opts ...string) specs.Mount {
	return specs.Mount{Source: src, Destination: dst, Type: "bind", Options: append([]string{"rbind"}, opts...)}
}

func TestHostOptionsRefused(t *testing.T) {
	set := mustParse(t, mountRoles+`---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: fuse}
spec: {filesystem: {devices: [/dev/fuse]}}
`)
	vols, _ := set.Profile("vols")
	fuse, _ := set.Profile("fuse")
	ok := func() *specs.Spec {
		s := baseSpec()
		s.Mounts = s.Mounts[:4]
		return s
	}
	cases := []struct {
		name string
		p    *Profile
		mod  func(s *specs.Spec)
		want string
	}{
		{"legitimate pod", vols, func(s *specs.Spec) {}, ""},
		{"host network", vols, func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[:3] }, "no network namespace (host network)"},
		{"host PID", vols, func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[1:] }, "no pid namespace (host PID)"},
		{"host IPC", vols, func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces[:1], s.Linux.Namespaces[2:]...)
		}, "no ipc namespace (host IPC)"},
		{"privileged", vols, func(s *specs.Spec) {
			s.Linux.Resources.Devices = []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
		}, "linux.resources.devices[0]: allows every device"},
		{"device", vols, func(s *specs.Spec) { s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/kvm"}} }, "linux.devices[0]: device /dev/kvm"},
		{"device the role allows", fuse, func(s *specs.Spec) { s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/fuse"}} }, ""},
		{"unsafe sysctl", vols, func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.msgmax": "1"} }, `linux.sysctl["kernel.msgmax"]`},
		{"safe sysctl", vols, func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"net.ipv4.ping_group_range": "0 1"} }, ""},
		{"no linux section", vols, func(s *specs.Spec) { s.Linux = nil }, "no linux section"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ok()
			tc.mod(s)
			_, err := ocispec.Apply(s, tc.p.SpecRewrites(nil, testEnv)...)
			if tc.want == "" && err != nil {
				t.Fatalf("legitimate spec refused: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}
}

// TestBaselineSyscallsGolden pins the seccomp rules every role gets, and
// asserts what they must contain so that -update cannot bless a hole.
func TestBaselineSyscallsGolden(t *testing.T) {
	set := mustParse(t, goldenRoles)
	p, _ := set.Profile("minimal")
	sp := p.Syscalls()
	got, _ := json.MarshalIndent(map[string]any{"policy": sp, "rules": sp.SeccompRules()}, "", "  ")
	checkGolden(t, "syscalls-baseline.golden.json", got)
	for _, n := range []string{"unshare", "setns", "mount", "umount2", "pivot_root", "bpf", "keyctl", "userfaultfd", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "memfd_create"} {
		if !contains(sp.Denied, n) {
			t.Errorf("baseline must deny %s", n)
		}
	}
	rules := sp.SeccompRules()
	var userns, clone3 bool
	for _, r := range rules {
		if contains(r.Names, "clone") && len(r.Args) == 1 && r.Args[0].Value == 0x10000000 && r.Args[0].Op == specs.OpMaskedEqual {
			userns = true
		}
		if contains(r.Names, "clone3") && r.ErrnoRet != nil && *r.ErrnoRet == 38 {
			clone3 = true
		}
		if contains(r.Names, "clone") && len(r.Args) == 0 {
			t.Errorf("clone must never be denied outright: %+v", r)
		}
	}
	if !userns || !clone3 {
		t.Errorf("clone(CLONE_NEWUSER) denied %v, clone3 ENOSYS %v", userns, clone3)
	}
}

func TestAllowSyscalls(t *testing.T) {
	set := mustParse(t, `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: browser}
spec: {process: {allowSyscalls: [memfd, namespaces], deniedSyscalls: [chroot]}}
`)
	p, err := set.Profile("browser")
	if err != nil {
		t.Fatal(err)
	}
	sp := p.Syscalls()
	if contains(sp.Denied, "memfd_create") || contains(sp.Denied, "unshare") || sp.CloneNamespaces || !contains(sp.Denied, "mount") || !contains(sp.Denied, "chroot") {
		t.Fatalf("policy %+v", sp)
	}
	_, err = Parse("x.yaml", []byte(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: typo}
spec: {process: {allowSyscalls: [memfd_create]}}
`))
	if err == nil || !strings.Contains(err.Error(), `process.allowSyscalls[0]: "memfd_create" is not a class`) {
		t.Fatalf("an unknown class must be refused naming the field: %v", err)
	}
}

func TestPolicyFileName(t *testing.T) {
	for name, want := range map[string]bool{
		"baseline.yaml": true, "roles.yml": true, ".#baseline.yaml": false, ".baseline.yaml.swp": false,
		"baseline.yaml~": false, "#baseline.yaml#": false, "..data": false, "README.md": false, "baseline.yaml.bak": false,
	} {
		if PolicyFileName(name) != want {
			t.Errorf("%s: want %v", name, want)
		}
	}
}

// A dangling editor lock file does not stop the directory from loading.
func TestEditorArtifactsIgnored(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "roles.yaml"), []byte(mountRoles), 0o644)
	os.Symlink("root@host.1234:1700000000", filepath.Join(dir, ".#roles.yaml"))
	os.WriteFile(filepath.Join(dir, "roles.yaml~"), []byte("not: [valid"), 0o644)
	var c Cache
	if _, err := c.Load(dir); err != nil {
		t.Fatalf("editor artifacts must be ignored: %v", err)
	}
	// A dangling policy file is an error, not a skip.
	os.Symlink("/nonexistent", filepath.Join(dir, "more.yaml"))
	if _, err := LoadPaths(dir); err == nil || !strings.Contains(err.Error(), "more.yaml") {
		t.Fatalf("a dangling policy file must be named: %v", err)
	}
}

// Refusals carry the kind containerd maps to a gRPC code.
func TestRefusalKinds(t *testing.T) {
	set := mustParse(t, mountRoles+`---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: b}
spec: {role: vols, subjects: [{namespace: team}]}
`)
	_, err := set.Select(Request{Annotations: map[string]string{RoleAnnotation: "vols"}, ContainerdNamespace: "k8s.io", PodNamespace: "other"})
	if !errdefs.IsPermissionDenied(err) {
		t.Errorf("unbound role: %v is not PermissionDenied", err)
	}
	_, err = set.Select(Request{Annotations: map[string]string{RoleAnnotation: "nope"}, ContainerdNamespace: "k8s.io"})
	if !errdefs.IsNotFound(err) {
		t.Errorf("undefined role: %v is not NotFound", err)
	}
	p, _ := set.Profile("vols")
	s := &specs.Spec{Root: &specs.Root{}, Mounts: []specs.Mount{bind("/etc", "/host")}}
	if _, err := p.rewriteMounts(testEnv)(s); !errdefs.IsPermissionDenied(err) {
		t.Errorf("refused mount: %v is not PermissionDenied", err)
	}
}

// A pod may narrow its role with agentbox.dev/* annotations, never widen
// it; an unknown key is refused naming the ones agentbox reads.
func TestTighten(t *testing.T) {
	set := mustParse(t, goldenRoles)
	for _, tc := range []struct {
		ann   map[string]string
		want  string // "" for accepted
		check func(p *Profile) bool
	}{
		{map[string]string{WallClockAnnotation: "2m"}, "", func(p *Profile) bool { return p.Limits.WallClock == 2*time.Minute }},
		{map[string]string{WallClockAnnotation: "2h"}, "would raise wall-clock", nil},
		{map[string]string{WallClockAnnotation: "soon"}, "is not a duration", nil},
		{map[string]string{MemoryAnnotation: "128Mi"}, "", func(p *Profile) bool { return p.Limits.MemoryBytes == 128<<20 }},
		{map[string]string{MemoryAnnotation: "8Mi"}, "below the 16Mi", nil},
		{map[string]string{MemoryAnnotation: "4Gi"}, "would raise memory", nil},
		{map[string]string{CPUAnnotation: "250m"}, "", func(p *Profile) bool { return p.Limits.CPUMillis == 250 }},
		{map[string]string{CPUAnnotation: "8"}, "would raise CPU", nil},
		{map[string]string{MaxProcessesAnnotation: "8"}, "", func(p *Profile) bool { return p.Process.MaxProcesses == 8 }},
		{map[string]string{MaxProcessesAnnotation: "9999"}, "would raise maxProcesses", nil},
		{map[string]string{MaxProcessesAnnotation: "-1"}, "not a positive number", nil},
		{map[string]string{EgressAnnotation: "none"}, "", func(p *Profile) bool { return p.Network.Egress == EgressNone && len(p.Network.Allow) == 0 }},
		{map[string]string{EgressAnnotation: "allowlist"}, "may only narrow egress", nil},
		{map[string]string{"agentbox.dev/wallclock": "1m"}, "unknown annotation (agentbox reads agentbox.dev/cpu, agentbox.dev/egress, agentbox.dev/max-processes, agentbox.dev/memory, agentbox.dev/restore-from, agentbox.dev/role, agentbox.dev/wall-clock)", nil},
	} {
		p, _ := set.Profile("full")
		digest := p.Digest
		err := p.tighten(tc.ann)
		switch {
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: want %q, got %v", tc.ann, tc.want, err)
		case tc.want == "" && (err != nil || !tc.check(p) || p.Digest == digest || len(p.Tightened) != 1):
			t.Errorf("%v: %v; profile %+v", tc.ann, err, p.Limits)
		}
	}
}
