// Package config loads the agentbox shim configuration: a TOML file named by
// containerd's runtime options (ConfigPath), /etc/agentbox/config.toml when
// none is named.
//
// Loading is strict: unknown keys, bad values and a named file that is
// missing are errors, never silent defaults.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// DefaultPath is read when containerd names no ConfigPath and
// $AGENTBOX_CONFIG (in containerd's environment) is unset.
const DefaultPath = "/etc/agentbox/config.toml"

// PathEnv, when set in the shim's environment (inherited from containerd),
// replaces DefaultPath.
const PathEnv = "AGENTBOX_CONFIG"

// DefaultPolicyDir holds the role policies when the config names none.
const DefaultPolicyDir = "/etc/agentbox/policies"

// UnnamedPath is the config read when containerd names none.
func UnnamedPath() string {
	if p := os.Getenv(PathEnv); p != "" {
		return p
	}
	return DefaultPath
}

// DefaultRunscRootBase is the parent of the per-containerd runsc roots when
// the config names no root.
const DefaultRunscRootBase = "/run/agentbox/runsc"

// Config is the shim configuration.
type Config struct {
	// Version of the file format; only 1 exists.
	Version int `toml:"version"`
	// Runsc configures the runsc binary the shim drives.
	Runsc Runsc `toml:"runsc"`
	// Shim configures the shim process itself.
	Shim Shim `toml:"shim"`
	// Policy configures role selection.
	Policy Policy `toml:"policy"`
	// Audit configures the audit trail.
	Audit Audit `toml:"audit"`
	// Network configures egress enforcement's per-pod DNS resolver.
	Network Network `toml:"network"`
	// Egress configures the per-pod egress gateway.
	Egress Egress `toml:"egress"`
	// CRI says which containers are Kubernetes pods and where the files
	// the runtime makes for them live.
	CRI CRI `toml:"cri"`
	// Checkpoint configures where sandboxes' memory images are kept.
	Checkpoint Checkpoint `toml:"checkpoint"`

	// Source is the file the config was read from; empty for built-in defaults.
	Source string `toml:"-"`
}

// Runsc configures runsc.
type Runsc struct {
	// Binary is an absolute path or a name looked up on PATH.
	Binary string `toml:"binary"`
	// Root is runsc's state directory. Empty: a directory under
	// DefaultRunscRootBase derived from the containerd instance's address, so
	// two containerd daemons on one machine never share runsc state.
	Root string `toml:"root"`
	// Flags are runsc global flags (without the leading dashes), applied to
	// every sandbox this config starts.
	Flags map[string]string `toml:"flags"`
	// PauseImageDir holds the node's read-only EROFS images of pod sandbox
	// (pause) images, root's alone: a pod's pause container is served from
	// one with no gofer process. "none": serve it through a gofer, as
	// gVisor does by default.
	PauseImageDir string `toml:"pause_image_dir"`
}

// DefaultPauseImageDir is where the pause images are kept unless the
// config says otherwise.
const DefaultPauseImageDir = "/run/agentbox/pause-images"

// Shim configures the shim process.
type Shim struct {
	// LogLevel is one of trace, debug, info, warn, error.
	LogLevel string `toml:"log_level"`
	// ControlDir holds each running sandbox's control socket (agentbox
	// sandbox list, quarantine, freeze, thaw, stop): root only.
	ControlDir string `toml:"control_dir"`
}

// Checkpoint configures the node's checkpoint store (agentbox sandbox
// checkpoint, ctr task checkpoint; restored by agentbox.dev/restore-from).
type Checkpoint struct {
	// Dir holds one directory per checkpoint: root only (0700). An image
	// holds the agent's whole memory, secrets included.
	Dir string `toml:"dir"`
	// KeyFile is the node's key (32 bytes, 0600, made on first use): it
	// signs every image's manifest, and a restore refuses an image it did
	// not sign.
	KeyFile string `toml:"key_file"`
	// SharedDir is a directory every node mounts (a ReadWriteMany
	// PersistentVolume, NFS): a suspend's image is also written there,
	// encrypted with a data key of its own that travels wrapped beside it,
	// and a node whose store lacks an image a pod asks for takes it from
	// there. "" (the default): images stay on the node that made them. Set
	// exactly one of SharedPublicKey (Kubernetes) and SharedKeyFile.
	SharedDir string `toml:"shared_dir"`
	// SharedPublicKey is the cluster broker's public key (PEM, RSA of at
	// least 3072 bits; the node agent keeps it from the broker): it wraps
	// each image's data key, and only the broker unwraps one, for a node a
	// pod of the image's Sandbox is bound to. The node agent places the
	// unwrapped key in KeysDir.
	SharedPublicKey string `toml:"shared_public_key"`
	// KeysDir is where the node agent places the data keys the broker
	// unwrapped for this node (one file per image, 0600); a restore waits
	// up to 60 s for its image's key.
	KeysDir string `toml:"keys_dir"`
	// SharedKeyFile is a checkpoint key every node holds (32 bytes, 0600)
	// that wraps each image's data key: every node can read every image.
	// For hosts outside Kubernetes, one trust domain; in a cluster, use
	// SharedPublicKey.
	SharedKeyFile string `toml:"shared_key_file"`
}

// DefaultKeysDir is Checkpoint.KeysDir unless configured.
const DefaultKeysDir = "/var/lib/agentbox/checkpoint-keys"

// DefaultControlDir is where the sandboxes' control sockets are when the
// config names no shim.control_dir.
const DefaultControlDir = "/run/agentbox/control"

// Policy configures where roles come from and which one applies when a
// container claims none.
type Policy struct {
	// Dir holds the Role and RoleBinding files (*.yaml).
	Dir string `toml:"dir"`
	// DefaultRole applies when a container has no agentbox.dev/role.
	DefaultRole string `toml:"default_role"`
	// Handler is the runtime handler (RuntimeClass) this config serves,
	// matched by RoleBinding subjects' runtimeHandler. Each handler has its
	// own ConfigPath in containerd's config, so the config is what
	// identifies it.
	Handler string `toml:"handler"`
	// SecretsDir is where the node agent keeps the Kubernetes Secrets
	// roles name (secretRef), one file per key: NAMESPACE/NAME/KEY,
	// root's alone.
	SecretsDir string `toml:"secrets_dir"`
}

// DefaultSecretsDir is Policy.SecretsDir unless configured.
const DefaultSecretsDir = "/var/lib/agentbox/secrets"

// DefaultSentrySendBuffer is gVisor's audit socket buffer unless the
// config says otherwise: about 3,000 events (an event takes ~1.3 KiB of
// socket memory), where the kernel's default holds ~160, which a burst of
// opens fills in a few milliseconds. MaxSentrySendBuffer bounds it.
const (
	DefaultSentrySendBuffer = 4 << 20
	MaxSentrySendBuffer     = 64 << 20
)

// Audit configures where audit trails go.
type Audit struct {
	// Dir holds one trail per sandbox (SANDBOX.jsonl, rotated segments).
	Dir string `toml:"dir"`
	// SocketDir holds the per-sandbox sockets gVisor reports to.
	SocketDir string `toml:"socket_dir"`
	// MaxFileBytes rotates a trail file when it would pass this size.
	MaxFileBytes int64 `toml:"max_file_bytes"`
	// SentryRetries is how often gVisor retries writing an event to a full
	// audit socket (backing off from 25µs to 10ms) before dropping it.
	SentryRetries int `toml:"sentry_retries"`
	// SentrySendBuffer sizes gVisor's end of the audit socket (bytes; 0:
	// the kernel's default, net.core.wmem_default): how many events queue
	// for the shim before a write finds the socket full and the sandbox's
	// task sleeps in the retry backoff.
	SentrySendBuffer int `toml:"sentry_send_buffer"`
	// Redact are extra regular expressions redacted from argv in records
	// (a first capture group, if any, is kept).
	Redact []string `toml:"redact"`
	// Webhook, when its URL is set, also ships every record to an HTTP
	// endpoint, spooling to disk while it is down.
	Webhook Webhook `toml:"webhook"`
	// MaxSandboxBytes is one sandbox's quota of audit storage (all its
	// segments); 0: none.
	MaxSandboxBytes int64 `toml:"max_sandbox_bytes"`
	// MinFreeBytes is the free space every trail leaves on the audit
	// filesystem, for other sandboxes and new ones.
	MinFreeBytes int64 `toml:"min_free_bytes"`
	// ReserveBytes is preallocated per trail for its own records (the
	// shim's decisions, gaps, limits, the end record).
	ReserveBytes int64 `toml:"reserve_bytes"`
	// MaxTotalBytes bounds the audit directory: when a trail starts past
	// it, ended trails are removed, oldest first (never one whose webhook
	// spool is not delivered); 0: no retention.
	MaxTotalBytes int64 `toml:"max_total_bytes"`
	// OnFull is what happens to a sandbox whose records do not fit for
	// FullGraceSeconds: "stop" (killed, the reason recorded) or "stall"
	// (held back for as long as it lasts).
	OnFull string `toml:"on_full"`
	// FullGraceSeconds is how long a sandbox whose records do not fit is
	// held back before OnFull applies.
	FullGraceSeconds int `toml:"full_grace_seconds"`
	// MaxEventsPerSecond bounds how fast the shim takes a sandbox's events;
	// beyond it the sandbox is slowed (gVisor retries a full socket), not
	// its events dropped. 0: no bound.
	MaxEventsPerSecond int `toml:"max_events_per_second"`
}

// Webhook is the network audit sink.
type Webhook struct {
	// URL is where batches are POSTed (http or https); "": no webhook.
	URL string `toml:"url"`
	// SpoolDir holds records not yet delivered (default: DIR/spool).
	SpoolDir string `toml:"spool_dir"`
	// MaxSpoolBytes bounds the spool; records past it are lost, and say so.
	MaxSpoolBytes int64 `toml:"max_spool_bytes"`
	// BatchRecords is the most records one POST carries.
	BatchRecords int `toml:"batch_records"`
	// Format is how a batch is sent: "ndjson" (the records as lines, the
	// default) or "otlp" (OTLP/HTTP JSON logs to a collector's /v1/logs,
	// each record a log record whose body is the record's line).
	Format string `toml:"format"`
}

// CRI locates what containerd's CRI and the kubelet make for a pod, so
// that the shim accepts a pod's own mounts by where they provably are, never
// by their names.
type CRI struct {
	// Namespace is containerd's CRI namespace. Only containers in it are
	// pods: only they bind by pod namespace and get their pod's files and
	// kubelet volumes.
	Namespace string `toml:"namespace"`
	// ContainerdRoot is containerd's root directory (its config's root);
	// a pod's hosts, hostname and resolv.conf are under
	// ROOT/io.containerd.grpc.v1.cri/sandboxes/SANDBOX_ID.
	ContainerdRoot string `toml:"containerd_root"`
	// ContainerdState is containerd's state directory (its shm is under
	// STATE/io.containerd.grpc.v1.cri/sandboxes/SANDBOX_ID). Empty: the
	// directory containerd put the container's bundle in.
	ContainerdState string `toml:"containerd_state"`
	// KubeletRoot is the kubelet's --root-dir: a pod's volumes are under
	// ROOT/pods/POD_UID.
	KubeletRoot string `toml:"kubelet_root"`
}

// Network configures the DNS resolver each allowlist pod gets.
type Network struct {
	// ResolverAddress is the IPv4 address the pod's resolv.conf names; the
	// pod's side of the link to the resolver takes the next address. It
	// must not be an address the pod reaches otherwise.
	ResolverAddress string `toml:"resolver_address"`
	// Upstreams are the servers allowed names are resolved with ("ip" or
	// "ip:port"), asked from the host's network namespace. Empty: the
	// nameservers of the host's /etc/resolv.conf.
	Upstreams []string `toml:"upstreams"`
	// MinTTLSeconds and MaxTTLSeconds bound how long an answered address
	// stays allowed. The floor exists because the filter is stateless: a
	// connection outliving its address's allowance stalls.
	MinTTLSeconds int `toml:"min_ttl_seconds"`
	// MaxTTLSeconds is the ceiling (see MinTTLSeconds).
	MaxTTLSeconds int `toml:"max_ttl_seconds"`
	// ClusterCIDRs are the cluster's pod and service ranges, and any other
	// range no host rule may open unless it sets allowPrivate (the private,
	// loopback and link-local ranges and the node's own addresses are
	// refused without being listed).
	ClusterCIDRs []string `toml:"cluster_cidrs"`
}

// Egress configures the egress gateway that serves host rules.
type Egress struct {
	// UpstreamCAFile is a PEM file of CA certificates the gateway trusts,
	// besides the node's roots, for the servers behind the rules it
	// inspects (a corporate CA). Passthrough rules are verified by the
	// agent itself.
	UpstreamCAFile string `toml:"upstream_ca_file"`
}

// DefaultResolverAddress is link-local and outside the metadata addresses.
const DefaultResolverAddress = "169.254.53.53"

// Default returns the built-in configuration used when no file is named and
// DefaultPath does not exist.
func Default() *Config {
	return &Config{
		Version: 1,
		Runsc:   Runsc{Binary: "runsc", Flags: map[string]string{}, PauseImageDir: DefaultPauseImageDir},
		Shim:    Shim{LogLevel: "info", ControlDir: DefaultControlDir},
		Policy:  Policy{Dir: DefaultPolicyDir, DefaultRole: "baseline", SecretsDir: DefaultSecretsDir},
		Audit: Audit{Dir: "/var/log/agentbox/audit", SocketDir: "/run/agentbox/audit", MaxFileBytes: 64 << 20, SentryRetries: 10, SentrySendBuffer: DefaultSentrySendBuffer,
			Webhook:         Webhook{MaxSpoolBytes: 1 << 30, BatchRecords: 512},
			MaxSandboxBytes: 1 << 30, MinFreeBytes: 256 << 20, ReserveBytes: 1 << 20, MaxTotalBytes: 0,
			OnFull: "stop", FullGraceSeconds: 5, MaxEventsPerSecond: 0},
		Network:    Network{ResolverAddress: DefaultResolverAddress, MinTTLSeconds: 300, MaxTTLSeconds: 3600},
		CRI:        CRI{Namespace: "k8s.io", ContainerdRoot: "/var/lib/containerd", KubeletRoot: "/var/lib/kubelet"},
		Checkpoint: Checkpoint{Dir: "/var/lib/agentbox/checkpoints", KeyFile: "/var/lib/agentbox/node.key", KeysDir: DefaultKeysDir},
	}
}

// Load reads the config at path. named says whether the path was chosen by
// the caller (containerd's ConfigPath): a named file must exist, while a
// missing DefaultPath yields Default().
func Load(path string, named bool) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !named {
			return Default(), nil
		}
		return nil, fmt.Errorf("agentbox config %s: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("agentbox config %s: %w", path, err)
	}
	c.Source = path
	return c, nil
}

// Parse decodes and validates a config. Every problem found is reported.
func Parse(data []byte) (*Config, error) {
	c := Default()
	c.Version = 0
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, describeDecodeError(err)
	}
	if c.Runsc.Flags == nil {
		c.Runsc.Flags = map[string]string{}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func describeDecodeError(err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var msgs []string
		for _, e := range strict.Errors {
			row, col := e.Position()
			msgs = append(msgs, fmt.Sprintf("line %d column %d: unknown key %q", row, col, strings.Join(e.Key(), ".")))
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		return fmt.Errorf("line %d column %d: %s", row, col, de.Error())
	}
	return err
}
