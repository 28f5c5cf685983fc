// Package policy is agentbox's role policy language: Role and RoleBinding
// objects loaded strictly from YAML files, bound to what the runtime can
// trust about a container, and compiled into a Profile that the shim
// enforces. Everything here is pure: no I/O outside the loader's file reads.
package policy

// APIVersion is the only policy API version.
const APIVersion = "agentbox.dev/v1"

// Object kinds.
const (
	KindRole        = "Role"
	KindRoleBinding = "RoleBinding"
)

// Rootfs modes.
const (
	RootfsReadOnly = "read-only" // the image's filesystem cannot be written
	RootfsOverlay  = "overlay"   // writes go to an in-memory overlay and vanish
)

// Egress modes.
const (
	EgressNone      = "none"
	EgressAllowlist = "allowlist"
	EgressOpen      = "open"
)

// header is what every policy object starts with.
type header struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
}

// Metadata names an object.
type Metadata struct {
	Name string `yaml:"name"`
}

// Role is what an agent claiming the role may do.
type Role struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       RoleSpec `yaml:"spec"`

	// Source is where the role was defined ("file:line").
	Source string `yaml:"-"`
}

// RoleSpec is a role's grants. Unset fields (nil) are inherited from the
// parent role, or take the least-privilege default.
type RoleSpec struct {
	// Inherits names a parent role whose spec this one refines.
	Inherits    string       `yaml:"inherits,omitempty"`
	Filesystem  *Filesystem  `yaml:"filesystem,omitempty"`
	Network     *Network     `yaml:"network,omitempty"`
	Process     *Process     `yaml:"process,omitempty"`
	Credentials *Credentials `yaml:"credentials,omitempty"`
	Limits      *Limits      `yaml:"limits,omitempty"`
	Audit       *Audit       `yaml:"audit,omitempty"`
}

// Audit selects what the audit trail records (all by default). Container
// starts and the shim's own decisions are always recorded.
type Audit struct {
	// Process: execve, clone, exit.
	Process *bool `yaml:"process,omitempty"`
	// File: open, openat, creat (with results), chdir.
	File *bool `yaml:"file,omitempty"`
	// Network: socket, connect, bind, listen, accept (with results).
	Network *bool `yaml:"network,omitempty"`
}

// Filesystem scope.
type Filesystem struct {
	// Rootfs is read-only (default) or overlay.
	Rootfs *string `yaml:"rootfs,omitempty"`
	// Writable are scratch directories (in-memory tmpfs) the agent may write.
	Writable []string `yaml:"writable,omitempty"`
	// NoExecWritable mounts the writable directories noexec (default true).
	NoExecWritable *bool `yaml:"noExecWritable,omitempty"`
	// HostMounts are the host paths a container may bind-mount; any other
	// bind mount makes the container fail to start.
	HostMounts []HostMount `yaml:"hostMounts,omitempty"`
	// MaskedPaths are hidden from the agent, in addition to the runtime's.
	MaskedPaths []string `yaml:"maskedPaths,omitempty"`
	// AllowExec names mount destinations (scratch, pod volumes, host
	// mounts, /dev/shm) where files the agent writes may run. Every other
	// writable place is noexec.
	AllowExec []string `yaml:"allowExec,omitempty"`
	// Devices are host device paths (linux.devices) a container may ask
	// for; any other device refuses the container.
	Devices []string `yaml:"devices,omitempty"`
}

// HostMount allows bind mounts from a host path (and below it).
type HostMount struct {
	Path     string `yaml:"path" json:"path"`
	ReadOnly *bool  `yaml:"readOnly,omitempty" json:"readOnly"`
}

// Network egress.
type Network struct {
	// Egress is none (default), allowlist or open.
	Egress *string `yaml:"egress,omitempty"`
	// Allow lists what allowlist egress may reach.
	Allow []EgressRule `yaml:"allow,omitempty"`
}

// EgressRule allows connections to a host name or a CIDR, on some ports
// (all ports when none are listed).
type EgressRule struct {
	Host  string `yaml:"host,omitempty" json:"host,omitempty"`
	CIDR  string `yaml:"cidr,omitempty" json:"cidr,omitempty"`
	Ports []int  `yaml:"ports,omitempty" json:"ports,omitempty"`
	// AllowPrivate lets a host rule open the private, loopback,
	// link-local and node addresses its name resolves to (refused by
	// default: a name must not become a way into the node or its network).
	AllowPrivate bool `yaml:"allowPrivate,omitempty" json:"allowPrivate,omitempty"`
}

// Process limits and identity.
type Process struct {
	// MaxProcesses caps the number of processes (RLIMIT_NPROC inside gVisor).
	MaxProcesses *int `yaml:"maxProcesses,omitempty"`
	// Capabilities the agent keeps (none by default), e.g. CAP_NET_BIND_SERVICE.
	Capabilities []string `yaml:"capabilities,omitempty"`
	// RunAsUser and RunAsGroup are the agent's uid and gid when the pod
	// names none (default 65532; the group defaults to the user).
	RunAsUser  *uint32 `yaml:"runAsUser,omitempty"`
	RunAsGroup *uint32 `yaml:"runAsGroup,omitempty"`
	// AllowUsers and AllowGroups are the uids and gids a pod may ask for
	// ("1000", "1000-1999"), besides runAsUser and runAsGroup (default:
	// any non-root id, "1-4294967294").
	AllowUsers  []string `yaml:"allowUsers,omitempty"`
	AllowGroups []string `yaml:"allowGroups,omitempty"`
	// AllowPrivilegeEscalation lets a pod run without no_new_privs
	// (allowPrivilegeEscalation: true), so setuid files take effect
	// (default false: no_new_privs always).
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation,omitempty"`
	// DeniedSyscalls fail with EPERM, enforced by gVisor's seccomp, in
	// addition to the baseline syscall policy.
	DeniedSyscalls []string `yaml:"deniedSyscalls,omitempty"`
	// AllowSyscalls names classes of the baseline syscall policy
	// (syscalls.go: namespaces, mount, ptrace, bpf, keyring, userfaultfd,
	// perf, memfd, kernel) that this role does not deny.
	AllowSyscalls []string `yaml:"allowSyscalls,omitempty"`
}

// Credentials scope.
type Credentials struct {
	Env *EnvPolicy `yaml:"env,omitempty"`
	// Secrets are injected as environment variables from files on the node.
	Secrets []Secret `yaml:"secrets,omitempty"`
	// ServiceAccountToken keeps Kubernetes service-account token mounts
	// (default false: they are removed).
	ServiceAccountToken *bool `yaml:"serviceAccountToken,omitempty"`
}

// EnvPolicy filters the environment.
type EnvPolicy struct {
	// Allow lists variable names, or prefixes ending in '*', that pass.
	Allow []string `yaml:"allow"`
}

// Secret injects the content of a node file as an environment variable.
type Secret struct {
	Env  string `yaml:"env" json:"env"`
	File string `yaml:"file" json:"file"`
}

// Limits on resources.
type Limits struct {
	// CPU in cores: "1", "0.5" or "500m".
	CPU *string `yaml:"cpu,omitempty"`
	// Memory in bytes with an optional suffix: "512Mi", "2Gi", "1G".
	Memory *string `yaml:"memory,omitempty"`
	// CPUTime is the CPU time a process may use (RLIMIT_CPU), e.g. "10m".
	CPUTime *string `yaml:"cpuTime,omitempty"`
	// OpenFiles caps open file descriptors per process (RLIMIT_NOFILE).
	OpenFiles *int `yaml:"openFiles,omitempty"`
	// WallClock is how long the sandbox may run before the shim stops it.
	WallClock *string `yaml:"wallClock,omitempty"`
}

// RoleBinding says who may claim a role.
type RoleBinding struct {
	APIVersion string          `yaml:"apiVersion"`
	Kind       string          `yaml:"kind"`
	Metadata   Metadata        `yaml:"metadata"`
	Spec       RoleBindingSpec `yaml:"spec"`

	Source string `yaml:"-"`
}

// RoleBindingSpec binds a role to subjects.
type RoleBindingSpec struct {
	Role     string    `yaml:"role"`
	Subjects []Subject `yaml:"subjects"`
}

// Subject matches containers by what the runtime can trust. Every field that
// is set must match; "*" matches any value. Pod annotations and service
// accounts are never bound on: the pod's author chooses the former, and the
// CRI does not show the runtime the latter.
type Subject struct {
	// Namespace is the pod's Kubernetes namespace (CRI pod metadata, set
	// by the API server).
	Namespace string `yaml:"namespace,omitempty" json:"namespace,omitempty"`
	// ContainerdNamespace is the containerd namespace (ctr -n, nerdctl).
	ContainerdNamespace string `yaml:"containerdNamespace,omitempty" json:"containerdNamespace,omitempty"`
	// RuntimeHandler is the handler named in the shim config serving the
	// container ([policy] handler), i.e. the RuntimeClass.
	RuntimeHandler string `yaml:"runtimeHandler,omitempty" json:"runtimeHandler,omitempty"`
}
