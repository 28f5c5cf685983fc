package shim

// What Create reads from a container's spec and request: its claims, its
// namespaces, the CRI's mount environment, its config's path, and the
// runsc options file it writes.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	task "github.com/containerd/containerd/api/runtime/task/v2"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/oomadj"
	"agentbox.dev/agentbox/internal/policy"
)

// oomFloor is the lowest oom_score_adj this host allows, when it refuses
// to go lower.
func oomFloor() *int {
	if adj := oomadj.Host(); adj.Refused != nil {
		return &adj.Floor
	}
	return nil
}

// effectiveLimits are the memory limit (bytes) and CPU limit (millicores)
// a sandbox root's spec asks runsc for: its role's, or the pod's own when
// lower (0: none).
func effectiveLimits(spec *specs.Spec) (memory, cpuMillis int64) {
	if spec.Linux == nil {
		return 0, 0
	}
	mem, q := limitsOf(spec.Linux.Resources)
	return mem, q.Millis()
}

// pathKinds says what masked paths are at start: beneath a staged bind
// source, or in the container's image layers (read when first needed:
// the runtime's own masked paths are all gVisor's).
func pathKinds(layers func() (mountguard.Layers, error)) func(root, rel string) (policy.PathKind, string, error) {
	return func(root, rel string) (policy.PathKind, string, error) {
		if root != "" {
			k, err := mountguard.KindBeneath(root, rel)
			return k, "", err
		}
		l, err := layers()
		if err != nil {
			return 0, "", fmt.Errorf("cannot tell what it is in the image: %w", err)
		}
		return l.Lookup(rel)
	}
}

// criMountEnv is where the runtime made this pod's files: containerd's CRI
// directories for its sandbox id and for the container's own id, the
// kubelet's for the pod's UID.
func criMountEnv(cfg *config.Config, bundle, containerID, sandboxID, podUID string) policy.MountEnv {
	const cri = "io.containerd.grpc.v1.cri"
	env := policy.MountEnv{
		SandboxRootDir: filepath.Join(cfg.CRI.ContainerdRoot, cri, "sandboxes", sandboxID),
		ContainerDir:   filepath.Join(cfg.CRI.ContainerdRoot, cri, "containers", containerID),
	}
	state := cfg.CRI.ContainerdState
	if state == "" {
		// containerd puts bundles at STATE/io.containerd.runtime.v2.task/NS/ID.
		if tasks := filepath.Dir(filepath.Dir(bundle)); filepath.Base(tasks) == "io.containerd.runtime.v2.task" {
			state = filepath.Dir(tasks)
		}
	}
	if state != "" {
		env.SandboxStateDir = filepath.Join(state, cri, "sandboxes", sandboxID)
	}
	if podUID != "" {
		env.PodDir = filepath.Join(cfg.CRI.KubeletRoot, "pods", podUID)
	}
	return env
}

// hostNamespaces refuses a container that joins one of the shim's own (the
// host's) network, PID or IPC namespaces by path. A missing namespace is
// the policy's to refuse (checkHostOptions).
func hostNamespaces(spec *specs.Spec) error {
	if spec.Linux == nil {
		return nil
	}
	for _, ns := range spec.Linux.Namespaces {
		var own string
		switch ns.Type {
		case specs.NetworkNamespace:
			own = "/proc/self/ns/net"
		case specs.PIDNamespace:
			own = "/proc/self/ns/pid"
		case specs.IPCNamespace:
			own = "/proc/self/ns/ipc"
		default:
			continue
		}
		if ns.Path == "" {
			continue
		}
		var a, b unix.Stat_t
		if err := unix.Stat(ns.Path, &a); err != nil {
			return fmt.Errorf("linux.namespaces: %s namespace %s: %w", ns.Type, ns.Path, err)
		}
		if err := unix.Stat(own, &b); err == nil && a.Dev == b.Dev && a.Ino == b.Ino {
			return fmt.Errorf("linux.namespaces: %s namespace %s is the host's: agentbox does not run pods in the host's namespaces", ns.Type, ns.Path)
		}
	}
	return nil
}

func netnsPath(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// agentboxAnnotations returns the agentbox.dev/* annotations. A key that
// is agentbox.dev/ in another case is refused: it would otherwise be
// ignored, and the pod run looser than its author meant.
func agentboxAnnotations(ann map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range ann {
		if strings.HasPrefix(k, policy.AnnotationPrefix) {
			out[k] = v
		} else if strings.HasPrefix(strings.ToLower(k), policy.AnnotationPrefix) {
			return nil, fmt.Errorf("annotation %s: agentbox reads %s* keys in lower case only", k, policy.AnnotationPrefix)
		}
	}
	return out, nil
}

func sameClaims(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// configPathOf returns the config file containerd named for this container,
// or config.UnnamedPath() when it named none.
func configPathOf(r *task.CreateTaskRequest) (path string, named bool, err error) {
	if r.Options == nil || len(r.Options.GetValue()) == 0 && r.Options.GetTypeUrl() == "" {
		return config.UnnamedPath(), false, nil
	}
	if r.Options.GetTypeUrl() != runtimeOptionsTypeURL {
		return "", false, fmt.Errorf("unsupported runtime options type %q: agentbox takes %q with a ConfigPath (ctr --runtime-config-path, CRI options.ConfigPath)", r.Options.GetTypeUrl(), runtimeOptionsTypeURL)
	}
	var o runtimeoptions.Options
	if err := proto.Unmarshal(r.Options.GetValue(), &o); err != nil {
		return "", false, fmt.Errorf("decode runtime options: %w", err)
	}
	if o.ConfigPath == "" {
		return config.UnnamedPath(), false, nil
	}
	return o.ConfigPath, true, nil
}

// gvisorOptions mirrors the fields of gVisor's runsc.Options that the shim
// sets; gVisor's task service reads them back from the file.
type gvisorOptions struct {
	BinaryName  string            `toml:"binary_name"`
	Root        string            `toml:"root"`
	LogLevel    string            `toml:"log_level,omitempty"`
	RunscConfig map[string]string `toml:"runsc_config,omitempty"`
}

func writeRunscOptions(path string, cfg *config.Config, root string, flags map[string]string) error {
	b, err := toml.Marshal(gvisorOptions{
		BinaryName:  cfg.Runsc.Binary,
		Root:        root,
		LogLevel:    cfg.Shim.LogLevel,
		RunscConfig: flags,
	})
	if err != nil {
		return fmt.Errorf("encode runsc options: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write runsc options: %w", err)
	}
	return nil
}
