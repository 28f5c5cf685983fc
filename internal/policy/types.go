// Package policy is agentbox's role policy language: Role and RoleBinding
// objects loaded strictly from YAML files, bound to what the runtime can
// trust about a container, and compiled into a Profile that the shim
// enforces. Everything here is pure: no I/O outside the loader's file reads.
package policy

import "path/filepath"

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
	APIVersion string   `yaml:"apiVersion" json:"apiVersion"`
	Kind       string   `yaml:"kind" json:"kind"`
	Metadata   Metadata `yaml:"metadata" json:"metadata"`
}

// Metadata names an object.
type Metadata struct {
	Name string `yaml:"name" json:"name"`
}

// Role is what an agent claiming the role may do.
type Role struct {
	APIVersion string   `yaml:"apiVersion" json:"apiVersion"`
	Kind       string   `yaml:"kind" json:"kind"`
	Metadata   Metadata `yaml:"metadata" json:"metadata"`
	Spec       RoleSpec `yaml:"spec" json:"spec"`

	// Source is where the role was defined ("file:line").
	Source string `yaml:"-" json:"-"`
}

// RoleSpec is a role's grants. Unset fields (nil) are inherited from the
// parent role, or take the least-privilege default.
type RoleSpec struct {
	// Inherits names a parent role whose spec this one refines.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`
	Inherits    string       `yaml:"inherits,omitempty" json:"inherits,omitempty"`
	Filesystem  *Filesystem  `yaml:"filesystem,omitempty" json:"filesystem,omitempty"`
	Network     *Network     `yaml:"network,omitempty" json:"network,omitempty"`
	Process     *Process     `yaml:"process,omitempty" json:"process,omitempty"`
	Credentials *Credentials `yaml:"credentials,omitempty" json:"credentials,omitempty"`
	Limits      *Limits      `yaml:"limits,omitempty" json:"limits,omitempty"`
	Audit       *Audit       `yaml:"audit,omitempty" json:"audit,omitempty"`
	// Template names a checkpoint in the node's store (agentbox sandbox
	// checkpoint) that new sandboxes under this role are restored from
	// instead of booting: an agent with its interpreter warmed. Its wall
	// clock starts afresh. A pod's agentbox.dev/restore-from wins.
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9._-]{0,62}$`
	Template *string `yaml:"template,omitempty" json:"template,omitempty"`
	// Suspend says what a suspend that the cluster asks for keeps (an
	// agent-sandbox Sandbox set to operatingMode: Suspended): "memory"
	// (the node agent checkpoints the sandbox before its pod is deleted,
	// and the Sandbox's next pod resumes from it) or "none" (the default:
	// the pod is deleted, as without agentbox).
	// +kubebuilder:validation:Enum=memory;none
	Suspend *string `yaml:"suspend,omitempty" json:"suspend,omitempty"`
}

// What a role's suspend keeps.
const (
	SuspendMemory = "memory"
	SuspendNone   = "none"
)

// Audit selects what the audit trail records (all by default). Container
// starts and the shim's own decisions are always recorded.
type Audit struct {
	// Process: execve, clone, exit.
	Process *bool `yaml:"process,omitempty" json:"process,omitempty"`
	// File: open, openat, creat (with results), chdir.
	File *bool `yaml:"file,omitempty" json:"file,omitempty"`
	// Network: socket, connect, bind, listen, accept (with results).
	Network *bool `yaml:"network,omitempty" json:"network,omitempty"`
	// Model is what a model call's record keeps (host rules with api:):
	// calls (the model, tokens, stop reason, tool call names), digests
	// (default: also each tool call's input and the digest of what the
	// model was sent) or content (also the newest messages of what the
	// model was sent, up to 16 KiB, scrubbed).
	// +kubebuilder:validation:Enum=calls;digests;content
	Model *string `yaml:"model,omitempty" json:"model,omitempty"`
}

// Filesystem scope.
type Filesystem struct {
	// Rootfs is read-only (default) or overlay.
	// +kubebuilder:validation:Enum=read-only;overlay
	Rootfs *string `yaml:"rootfs,omitempty" json:"rootfs,omitempty"`
	// Writable are scratch directories (in-memory tmpfs) the agent may write.
	Writable []string `yaml:"writable,omitempty" json:"writable,omitempty"`
	// NoExecWritable mounts the writable directories noexec (default true).
	NoExecWritable *bool `yaml:"noExecWritable,omitempty" json:"noExecWritable,omitempty"`
	// HostMounts are the host paths a container may bind-mount; any other
	// bind mount makes the container fail to start.
	HostMounts []HostMount `yaml:"hostMounts,omitempty" json:"hostMounts,omitempty"`
	// MaskedPaths are hidden from the agent, in addition to the runtime's.
	MaskedPaths []string `yaml:"maskedPaths,omitempty" json:"maskedPaths,omitempty"`
	// AllowExec names mount destinations (scratch, pod volumes, host
	// mounts, /dev/shm) where files the agent writes may run. Every other
	// writable place is noexec.
	AllowExec []string `yaml:"allowExec,omitempty" json:"allowExec,omitempty"`
	// Devices are host device paths (linux.devices) a container may ask
	// for; any other device refuses the container.
	Devices []string `yaml:"devices,omitempty" json:"devices,omitempty"`
}

// HostMount allows bind mounts from a host path (and below it).
type HostMount struct {
	// Path is an absolute host path; binds from it and below it are allowed.
	Path string `yaml:"path" json:"path"`
	// ReadOnly makes such binds read-only (default true).
	// +optional
	ReadOnly *bool `yaml:"readOnly,omitempty" json:"readOnly"`
}

// Network egress.
//
// +kubebuilder:validation:XValidation:rule="!has(self.allow) || size(self.allow) == 0 || !has(self.egress) || self.egress == 'allowlist'",message="allow is only for egress: allowlist (set here, or inherited)"
type Network struct {
	// Egress is none (default), allowlist or open.
	// +kubebuilder:validation:Enum=none;allowlist;open
	Egress *string `yaml:"egress,omitempty" json:"egress,omitempty"`
	// Allow lists what allowlist egress may reach.
	Allow []EgressRule `yaml:"allow,omitempty" json:"allow,omitempty"`
	// PortForward lists the sandbox's ports the node's port-forward
	// (kubectl port-forward, crictl port-forward, agent-sandbox's SDK)
	// may reach; none by default. It is inbound, and no egress.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	PortForward []int `yaml:"portForward,omitempty" json:"portForward,omitempty"`
}

// EgressRule allows connections to a host name or a CIDR, on some ports
// (all ports when none are listed).
type EgressRule struct {
	// Host is a DNS name, or "*.suffix" for the names below suffix; the
	// pod's resolver answers it and the answers open the filter.
	Host string `yaml:"host,omitempty" json:"host,omitempty"`
	// CIDR is an IPv4 or IPv6 network ("10.0.0.0/8", "2001:db8::/32").
	CIDR string `yaml:"cidr,omitempty" json:"cidr,omitempty"`
	// Ports are TCP and UDP destination ports (all ports when empty).
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	Ports []int `yaml:"ports,omitempty" json:"ports,omitempty"`
	// AllowPrivate lets a host rule open the private, loopback,
	// link-local and node addresses its name resolves to (refused by
	// default: a name must not become a way into the node or its network).
	AllowPrivate bool `yaml:"allowPrivate,omitempty" json:"allowPrivate,omitempty"`
	// HTTP restricts a host rule's requests to some methods and paths. The
	// gateway then terminates the rule's TLS (with the sandbox's own CA)
	// to see each request.
	HTTP *HTTPRule `yaml:"http,omitempty" json:"http,omitempty"`
	// WebSocket lets the rule's requests upgrade to a WebSocket (off by
	// default): the gateway forwards an Upgrade to websocket only under
	// it, and no other Upgrade (h2c) under any rule. An open WebSocket
	// carries whatever the agent writes to the name, unseen, until it is
	// idle for the gateway's idle timeout, the role drops the rule, or the
	// sandbox is quarantined.
	WebSocket bool `yaml:"websocket,omitempty" json:"websocket,omitempty"`
	// API names the model API the host serves: anthropic, openai (the
	// Responses and Chat Completions formats, and any server that speaks
	// them) or gemini. The gateway then inspects the rule and records each
	// model call: the model, its tokens, why it stopped and the tool calls
	// it asked for.
	//
	// api: mcp names a remote MCP server (the streamable HTTP transport,
	// and the older SSE one) instead: the gateway inspects the rule and
	// passes tools/call only of the tools it allows (tools), answering
	// any other with a JSON-RPC error, and lists only those.
	// +kubebuilder:validation:Enum=anthropic;openai;gemini;mcp
	API string `yaml:"api,omitempty" json:"api,omitempty"`
	// Tools are the tools an api: mcp rule allows (required there, and
	// only there).
	Tools *ToolsRule `yaml:"tools,omitempty" json:"tools,omitempty"`
}

// APIMCP is the api of a rule that names a remote MCP server.
const APIMCP = "mcp"

// ToolsRule is what tools of an MCP server a rule allows: names, or
// prefixes ending in '*'. Deny wins over allow.
type ToolsRule struct {
	Allow []string `yaml:"allow" json:"allow"`
	Deny  []string `yaml:"deny,omitempty" json:"deny,omitempty"`
}

// HTTPRule is what requests a host rule lets through. Empty lists allow
// any method or path.
type HTTPRule struct {
	// Methods are HTTP methods in upper case ("GET", "POST").
	Methods []string `yaml:"methods,omitempty" json:"methods,omitempty"`
	// Paths are exact paths ("/v1/models") or prefixes ending in '*'
	// ("/repos/org/*"), matched against the request's decoded path; a
	// path with "." or ".." segments, "//" or an encoded '/' is refused.
	Paths []string `yaml:"paths,omitempty" json:"paths,omitempty"`
}

// Process limits and identity.
type Process struct {
	// MaxProcesses caps the number of processes (RLIMIT_NPROC inside gVisor).
	// +kubebuilder:validation:Minimum=1
	MaxProcesses *int `yaml:"maxProcesses,omitempty" json:"maxProcesses,omitempty"`
	// Capabilities are the most a container may hold (none by default),
	// e.g. CAP_NET_BIND_SERVICE: what it asks within them it keeps.
	Capabilities []string `yaml:"capabilities,omitempty" json:"capabilities,omitempty"`
	// RunAsUser is the agent's uid when the pod names none (default 65532).
	RunAsUser *uint32 `yaml:"runAsUser,omitempty" json:"runAsUser,omitempty"`
	// RunAsGroup is the agent's gid when the pod names none (default:
	// runAsUser).
	RunAsGroup *uint32 `yaml:"runAsGroup,omitempty" json:"runAsGroup,omitempty"`
	// AllowUsers are the uids a pod may ask for ("1000", "1000-1999"),
	// besides runAsUser (default: any non-root id, "1-4294967294").
	AllowUsers []string `yaml:"allowUsers,omitempty" json:"allowUsers,omitempty"`
	// AllowGroups are the gids (primary and supplemental) a pod may ask
	// for, besides runAsGroup (default: any non-root id).
	AllowGroups []string `yaml:"allowGroups,omitempty" json:"allowGroups,omitempty"`
	// AllowPrivilegeEscalation lets a pod run without no_new_privs
	// (allowPrivilegeEscalation: true), so setuid files take effect
	// (default false: no_new_privs always).
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation,omitempty" json:"allowPrivilegeEscalation,omitempty"`
	// DeniedSyscalls fail with EPERM, enforced by gVisor's seccomp, in
	// addition to the baseline syscall policy.
	DeniedSyscalls []string `yaml:"deniedSyscalls,omitempty" json:"deniedSyscalls,omitempty"`
	// AllowSyscalls names classes of the baseline syscall policy
	// (syscalls.go: namespaces, mount, ptrace, bpf, keyring, userfaultfd,
	// perf, memfd, kernel) that this role does not deny.
	AllowSyscalls []string `yaml:"allowSyscalls,omitempty" json:"allowSyscalls,omitempty"`
}

// Credentials scope.
type Credentials struct {
	Env *EnvPolicy `yaml:"env,omitempty" json:"env,omitempty"`
	// Secrets are injected as environment variables from files on the node.
	Secrets []Secret `yaml:"secrets,omitempty" json:"secrets,omitempty"`
	// ServiceAccountToken keeps Kubernetes service-account token mounts
	// (default false: they are removed).
	ServiceAccountToken *bool `yaml:"serviceAccountToken,omitempty" json:"serviceAccountToken,omitempty"`
}

// EnvPolicy filters the environment.
type EnvPolicy struct {
	// Allow lists variable names, or prefixes ending in '*', that pass.
	Allow []string `yaml:"allow" json:"allow"`
}

// Secret is the content of a node file given to the agent: as an
// environment variable, or (with Inject) only to one host's requests, by the
// egress gateway, so that it never enters the sandbox.
type Secret struct {
	// Env is the variable's name. With Inject it is optional, and the
	// sandbox sees a placeholder there, never the secret.
	Env string `yaml:"env,omitempty" json:"env,omitempty"`
	// File is the node file whose content is the secret.
	File string `yaml:"file,omitempty" json:"file,omitempty"`
	// SecretRef names a key of a Kubernetes Secret whose value is the
	// secret, instead of a file: the node agent (agentbox sync) keeps it
	// in a root-only directory on each node, outside every pod, and a
	// rotated value reaches the gateway's next requests. Only for a secret
	// the gateway injects.
	SecretRef *SecretRef `yaml:"secretRef,omitempty" json:"secretRef,omitempty"`
	// FromClaim names a key a SandboxClaim of an agent-sandbox warm pool
	// gives its task, instead of a file or a secretRef: the claim's
	// agentbox.dev/key.NAME annotation names a Secret's key in the claim's
	// own namespace ("SECRET/KEY"). Before its claim the sandbox's
	// requests to the host carry no key; from the claim on, the gateway
	// injects that key. Only for a secret the gateway injects, in a
	// cluster AgentRole (the broker gives the key).
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$`
	FromClaim string `yaml:"fromClaim,omitempty" json:"fromClaim,omitempty"`
	// Inject has the gateway set a header to the secret on every request
	// to one host (over TLS, which it then terminates).
	Inject *Inject `yaml:"inject,omitempty" json:"inject,omitempty"`
}

// SecretRef is a key of a Kubernetes Secret.
type SecretRef struct {
	Namespace string `yaml:"namespace" json:"namespace"`
	Name      string `yaml:"name" json:"name"`
	Key       string `yaml:"key" json:"key"`
}

// String is NAMESPACE/NAME[KEY].
func (r SecretRef) String() string { return r.Namespace + "/" + r.Name + "[" + r.Key + "]" }

// Path is where a node keeps the key's value, under dir.
func (r SecretRef) Path(dir string) string { return filepath.Join(dir, r.Namespace, r.Name, r.Key) }

// Source says where a secret's value comes from.
func (s Secret) Source() string {
	if s.FromClaim != "" {
		return "the claim's key " + s.FromClaim
	}
	if s.SecretRef != nil {
		return "Secret " + s.SecretRef.String()
	}
	return s.File
}

// Inject is where the gateway puts a secret.
type Inject struct {
	// Host is the exact name whose requests carry the secret; a host rule
	// of the role must allow it.
	Host string `yaml:"host" json:"host"`
	// Header is the request header set to the secret ("Authorization").
	Header string `yaml:"header" json:"header"`
	// Format is the header's value, with {secret} where the secret goes
	// (default "{secret}"; "Bearer {secret}").
	Format string `yaml:"format,omitempty" json:"format,omitempty"`
}

// Limits on resources.
type Limits struct {
	// CPU in cores: "1", "0.5" or "500m".
	CPU *string `yaml:"cpu,omitempty" json:"cpu,omitempty"`
	// Memory in bytes with an optional suffix: "512Mi", "2Gi", "1G".
	Memory *string `yaml:"memory,omitempty" json:"memory,omitempty"`
	// CPUTime is the CPU time a process may use (RLIMIT_CPU), e.g. "10m".
	CPUTime *string `yaml:"cpuTime,omitempty" json:"cpuTime,omitempty"`
	// OpenFiles caps open file descriptors per process (RLIMIT_NOFILE).
	OpenFiles *int `yaml:"openFiles,omitempty" json:"openFiles,omitempty"`
	// WallClock is how long the sandbox may run before the shim stops it.
	WallClock *string `yaml:"wallClock,omitempty" json:"wallClock,omitempty"`
	// Model bounds the sandbox's model use, counted by the egress gateway
	// from the model hosts' own responses (host rules with api:). Past a
	// bound, the gateway answers the client as the vendor does when a
	// quota is spent (429), and records it.
	Model *ModelLimits `yaml:"model,omitempty" json:"model,omitempty"`
	// MCP bounds the sandbox's tools/call to each remote MCP server (each
	// api: mcp rule's host), counted by the gateway. Past a bound, the
	// call gets a JSON-RPC error and never reaches the server.
	MCP *MCPLimits `yaml:"mcp,omitempty" json:"mcp,omitempty"`
}

// MCPLimits bounds a sandbox's MCP calls, on each server (unset: no
// bound).
type MCPLimits struct {
	// Calls bounds the tools/call to one server.
	// +kubebuilder:validation:Minimum=1
	Calls *int64 `yaml:"calls,omitempty" json:"calls,omitempty"`
	// Tools bounds the calls of a tool, by its exact name, on one server.
	Tools map[string]int64 `yaml:"tools,omitempty" json:"tools,omitempty"`
}

// ModelLimits bounds a sandbox's model calls (unset: no bound).
type ModelLimits struct {
	// Tokens bounds the tokens (prompt and completion) of all its calls.
	// +kubebuilder:validation:Minimum=1
	Tokens *int64 `yaml:"tokens,omitempty" json:"tokens,omitempty"`
	// Requests bounds the number of its calls.
	// +kubebuilder:validation:Minimum=1
	Requests *int64 `yaml:"requests,omitempty" json:"requests,omitempty"`
	// PerMinute bounds its calls in any minute.
	PerMinute *ModelRate `yaml:"perMinute,omitempty" json:"perMinute,omitempty"`
	// MaxOutputTokens is the output cap the gateway sets on a call that
	// names none, under a token budget (default 16384, or tokens if
	// less): each call reserves its input and its cap before it goes.
	// +kubebuilder:validation:Minimum=1
	MaxOutputTokens *int64 `yaml:"maxOutputTokens,omitempty" json:"maxOutputTokens,omitempty"`
}

// ModelRate is a bound per minute.
type ModelRate struct {
	// Requests bounds the calls in any minute.
	// +kubebuilder:validation:Minimum=1
	Requests *int64 `yaml:"requests,omitempty" json:"requests,omitempty"`
}

// RoleBinding says who may claim a role.
type RoleBinding struct {
	APIVersion string          `yaml:"apiVersion" json:"apiVersion"`
	Kind       string          `yaml:"kind" json:"kind"`
	Metadata   Metadata        `yaml:"metadata" json:"metadata"`
	Spec       RoleBindingSpec `yaml:"spec" json:"spec"`

	Source string `yaml:"-" json:"-"`
}

// RoleBindingSpec binds a role to subjects.
type RoleBindingSpec struct {
	// Role is the role's name.
	// +kubebuilder:validation:MinLength=1
	Role string `yaml:"role" json:"role"`
	// Subjects: a container matching any of them may claim the role.
	// +kubebuilder:validation:MinItems=1
	Subjects []Subject `yaml:"subjects" json:"subjects"`
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
