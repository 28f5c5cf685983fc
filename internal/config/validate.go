package config

// Validate: what a config must hold, every field checked and each error
// naming its key.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"agentbox.dev/agentbox/internal/policy"
)

var (
	flagName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	// handlerName: a CRI runtime handler (a RuntimeClass's handler).
	handlerName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
)

// Validate checks every field and joins all problems into one error.
func (c *Config) Validate() error {
	var errs []error
	if c.Version != 1 {
		errs = append(errs, fmt.Errorf("version: must be 1, got %d", c.Version))
	}
	if c.Runsc.Binary == "" {
		errs = append(errs, errors.New("runsc.binary: must not be empty"))
	} else if strings.Contains(c.Runsc.Binary, "/") && !filepath.IsAbs(c.Runsc.Binary) {
		errs = append(errs, fmt.Errorf("runsc.binary: %q must be an absolute path or a bare name looked up on PATH", c.Runsc.Binary))
	}
	if c.Runsc.Root != "" && !filepath.IsAbs(c.Runsc.Root) {
		errs = append(errs, fmt.Errorf("runsc.root: %q must be an absolute path", c.Runsc.Root))
	}
	for _, k := range sortedKeys(c.Runsc.Flags) {
		if !flagName.MatchString(k) {
			errs = append(errs, fmt.Errorf("runsc.flags.%s: not a runsc flag name (lower-case letters, digits and dashes, no leading dash)", k))
			continue
		}
		if why := checkRunscFlag(k); why != "" {
			errs = append(errs, fmt.Errorf("runsc.flags.%s: %s", k, why))
		}
	}
	if !filepath.IsAbs(c.Policy.Dir) {
		errs = append(errs, fmt.Errorf("policy.dir: %q must be an absolute path", c.Policy.Dir))
	}
	if c.Policy.DefaultRole != "" && !policy.ValidRoleName(c.Policy.DefaultRole) {
		errs = append(errs, fmt.Errorf("policy.default_role: %q is not a role name (lower-case letters, digits and '-', at most 63)", c.Policy.DefaultRole))
	}
	if c.Policy.Handler != "" && !handlerName.MatchString(c.Policy.Handler) {
		errs = append(errs, fmt.Errorf("policy.handler: %q is not a runtime handler name", c.Policy.Handler))
	}
	if !cleanAbs(c.Policy.SecretsDir) {
		errs = append(errs, fmt.Errorf("policy.secrets_dir: %q must be a clean absolute path", c.Policy.SecretsDir))
	}
	if !cleanAbs(c.Checkpoint.Dir) {
		errs = append(errs, fmt.Errorf("checkpoint.dir: %q must be a clean absolute path", c.Checkpoint.Dir))
	}
	keys := 0
	for _, v := range []string{c.Checkpoint.SharedKeyFile, c.Checkpoint.SharedPublicKey} {
		if v != "" {
			keys++
		}
	}
	switch {
	case c.Checkpoint.SharedDir != "" && keys != 1:
		errs = append(errs, errors.New("checkpoint.shared_dir: set exactly one of checkpoint.shared_public_key (the cluster broker's key) and checkpoint.shared_key_file"))
	case c.Checkpoint.SharedDir == "" && keys != 0:
		errs = append(errs, errors.New("checkpoint.shared_public_key and checkpoint.shared_key_file: only with checkpoint.shared_dir"))
	}
	if !cleanAbs(c.Checkpoint.KeysDir) {
		errs = append(errs, fmt.Errorf("checkpoint.keys_dir: %q must be a clean absolute path", c.Checkpoint.KeysDir))
	}
	for _, f := range []struct{ k, v string }{{"shared_dir", c.Checkpoint.SharedDir}, {"shared_key_file", c.Checkpoint.SharedKeyFile}, {"shared_public_key", c.Checkpoint.SharedPublicKey}} {
		if f.v != "" && !cleanAbs(f.v) {
			errs = append(errs, fmt.Errorf("checkpoint.%s: %q must be a clean absolute path", f.k, f.v))
		}
	}
	if !cleanAbs(c.Checkpoint.KeyFile) {
		errs = append(errs, fmt.Errorf("checkpoint.key_file: %q must be a clean absolute path", c.Checkpoint.KeyFile))
	}
	if d := c.Runsc.PauseImageDir; d != "none" && !cleanAbs(d) {
		errs = append(errs, fmt.Errorf("runsc.pause_image_dir: %q must be a clean absolute path, or \"none\"", d))
	}
	if d := c.Shim.ControlDir; !cleanAbs(d) || len(d) > 80 {
		errs = append(errs, fmt.Errorf("shim.control_dir: %q must be a clean absolute path of at most 80 characters (unix socket paths are short)", d))
	}
	for k, v := range map[string]string{"audit.dir": c.Audit.Dir, "audit.socket_dir": c.Audit.SocketDir} {
		if !filepath.IsAbs(v) {
			errs = append(errs, fmt.Errorf("%s: %q must be an absolute path", k, v))
		}
	}
	if len(c.Audit.SocketDir) > 60 {
		errs = append(errs, fmt.Errorf("audit.socket_dir: %q is too long for unix socket paths (at most 60 characters)", c.Audit.SocketDir))
	}
	if c.Audit.SentrySendBuffer < 0 || c.Audit.SentrySendBuffer > MaxSentrySendBuffer {
		errs = append(errs, fmt.Errorf("audit.sentry_send_buffer: %d is not between 0 (the kernel's default) and %d bytes", c.Audit.SentrySendBuffer, MaxSentrySendBuffer))
	}
	if c.Audit.SentryRetries < 0 || c.Audit.SentryRetries > 30 {
		errs = append(errs, fmt.Errorf("audit.sentry_retries: %d is not between 0 and 30", c.Audit.SentryRetries))
	}
	if c.Audit.MaxFileBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("audit.max_file_bytes: %d is below 1 MiB", c.Audit.MaxFileBytes))
	}
	if a := c.Audit; a.MaxSandboxBytes < 0 || a.MinFreeBytes < 0 || a.MaxTotalBytes < 0 || a.MaxEventsPerSecond < 0 {
		errs = append(errs, errors.New("audit: max_sandbox_bytes, min_free_bytes, max_total_bytes and max_events_per_second must not be negative"))
	}
	if c.Audit.ReserveBytes < 512<<10 {
		errs = append(errs, fmt.Errorf("audit.reserve_bytes: %d is below 512 KiB (a held batch and the end record must fit)", c.Audit.ReserveBytes))
	}
	if c.Audit.MaxSandboxBytes > 0 && c.Audit.MaxSandboxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("audit.max_sandbox_bytes: %d is below 1 MiB", c.Audit.MaxSandboxBytes))
	}
	if c.Audit.OnFull != "stop" && c.Audit.OnFull != "stall" {
		errs = append(errs, fmt.Errorf("audit.on_full: %q is not stop or stall", c.Audit.OnFull))
	}
	if c.Audit.FullGraceSeconds < 1 || c.Audit.FullGraceSeconds > 3600 {
		errs = append(errs, fmt.Errorf("audit.full_grace_seconds: %d is not between 1 and 3600", c.Audit.FullGraceSeconds))
	}
	for i, re := range c.Audit.Redact {
		if _, err := regexp.Compile(re); err != nil {
			errs = append(errs, fmt.Errorf("audit.redact[%d]: %v", i, err))
		}
	}
	if w := c.Audit.Webhook; w.URL != "" {
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("audit.webhook.url: %q is not an http(s) URL", w.URL))
		}
		if w.SpoolDir != "" && !filepath.IsAbs(w.SpoolDir) {
			errs = append(errs, fmt.Errorf("audit.webhook.spool_dir: %q must be an absolute path", w.SpoolDir))
		}
		if w.MaxSpoolBytes < 1<<20 {
			errs = append(errs, fmt.Errorf("audit.webhook.max_spool_bytes: %d is below 1 MiB", w.MaxSpoolBytes))
		}
		if w.BatchRecords < 1 || w.BatchRecords > 100000 {
			errs = append(errs, fmt.Errorf("audit.webhook.batch_records: %d is not between 1 and 100000", w.BatchRecords))
		}
		if w.Format != "" && w.Format != "ndjson" && w.Format != "otlp" {
			errs = append(errs, fmt.Errorf("audit.webhook.format: %q is neither \"ndjson\" nor \"otlp\"", w.Format))
		}
	}
	if _, _, err := c.Network.ResolverAddrs(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Network.ClusterPrefixes(); err != nil {
		errs = append(errs, err)
	}
	for i, u := range c.Network.Upstreams {
		if _, err := parseUpstream(u); err != nil {
			errs = append(errs, fmt.Errorf("network.upstreams[%d]: %w", i, err))
		}
	}
	if c.Network.MinTTLSeconds < 1 || c.Network.MaxTTLSeconds < c.Network.MinTTLSeconds || c.Network.MaxTTLSeconds > 86400 {
		errs = append(errs, fmt.Errorf("network.min_ttl_seconds %d and max_ttl_seconds %d: need 1 <= min <= max <= 86400", c.Network.MinTTLSeconds, c.Network.MaxTTLSeconds))
	}
	if f := c.Egress.UpstreamCAFile; f != "" && !cleanAbs(f) {
		errs = append(errs, fmt.Errorf("egress.upstream_ca_file: %q must be a clean absolute path", f))
	}
	if !regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,75}$`).MatchString(c.CRI.Namespace) {
		errs = append(errs, fmt.Errorf("cri.namespace: %q is not a containerd namespace", c.CRI.Namespace))
	}
	for k, v := range map[string]string{"cri.containerd_root": c.CRI.ContainerdRoot, "cri.kubelet_root": c.CRI.KubeletRoot, "cri.containerd_state": c.CRI.ContainerdState} {
		if (v != "" || k != "cri.containerd_state") && !cleanAbs(v) {
			errs = append(errs, fmt.Errorf("%s: %q must be a clean absolute path", k, v))
		}
	}
	switch c.Shim.LogLevel {
	case "trace", "debug", "info", "warn", "warning", "error":
	default:
		errs = append(errs, fmt.Errorf("shim.log_level: %q is not one of trace, debug, info, warn, error", c.Shim.LogLevel))
	}
	return errors.Join(errs...)
}

// cleanAbs says whether p is an absolute path in its clean form.
func cleanAbs(p string) bool { return filepath.IsAbs(p) && filepath.Clean(p) == p }

// RunscRoot returns the runsc state root for a containerd instance reached at
// containerdAddress. An explicit runsc.root wins.
func (c *Config) RunscRoot(containerdAddress string) string {
	if c.Runsc.Root != "" {
		return c.Runsc.Root
	}
	return InstanceRunscRoot(containerdAddress)
}

// PolicyStoreDir is the node's store of loaded policy sets
// (policystore.Dir): inside the control directory, which is root's alone and
// which no sandbox may mount.
func (c *Config) PolicyStoreDir() string { return filepath.Join(c.Shim.ControlDir, "policy-store") }

// InstanceRunscRoot is the default runsc root of the containerd instance
// reached at containerdAddress: short (runsc puts sockets below it) and
// distinct per instance.
func InstanceRunscRoot(containerdAddress string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(containerdAddress)))
	return filepath.Join(DefaultRunscRootBase, hex.EncodeToString(sum[:6]))
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
