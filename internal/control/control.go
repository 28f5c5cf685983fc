// Package control is the node-local control path to running sandboxes: each
// sandbox's shim serves a unix socket (mode 0600, in a directory of mode
// 0700) on which root, and only root, asks it what it runs and tells it to
// quarantine, release, freeze, thaw or stop the sandbox. The peer is
// checked with SO_PEERCRED on every connection, whatever the file modes
// say. A sandbox cannot reach the socket: runsc gives it no host unix
// sockets (host-uds is refused in the shim config) and no mount of the
// node's /run.
//
// One request per connection: a JSON object on one line, answered by one.
package control

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/policy"
)

// The operations a request names.
const (
	OpInfo       = "info"
	OpQuarantine = "quarantine"
	OpRelease    = "release"
	OpFreeze     = "freeze"
	OpThaw       = "thaw"
	OpStop       = "stop"
	// OpCheckpoint writes the sandbox's memory into the node's checkpoint
	// store and leaves it running; OpSuspend does the same and stops it.
	OpCheckpoint = "checkpoint"
	OpSuspend    = "suspend"
	// OpOwner tells the shim which agent-sandbox Sandbox its pod belongs
	// to (the node agent, from the API server).
	OpOwner = "owner"
)

// MaxReason bounds a request's reason (it goes into the trail).
const MaxReason = 1024

// ClipReason bounds a reason to MaxReason bytes, on a character's edge.
func ClipReason(s string) string {
	if len(s) <= MaxReason {
		return s
	}
	n := MaxReason
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// maxRequest bounds what a server reads of a request.
const maxRequest = 16 << 10

// Request is what an admin asks of a sandbox.
type Request struct {
	Op string `json:"op"`
	// Reason is why (required for quarantine, freeze and stop).
	Reason string `json:"reason,omitempty"`
	// Name is the checkpoint's name in the node's store (checkpoint and
	// suspend; optional: the shim names one).
	Name string `json:"name,omitempty"`
	// Owner is what the pod belongs to (owner).
	Owner *Owner `json:"owner,omitempty"`
}

// Owner is the kubernetes-sigs/agent-sandbox Sandbox a pod belongs to, and
// what holds that Sandbox, as the node agent read them from the API
// server: the pod's controller is the Sandbox (by UID), in the pod's
// namespace, and the Sandbox names the pod as its own.
type Owner struct {
	Sandbox ObjectRef `json:"sandbox"`
	// Holder is the Sandbox's own controller: the SandboxClaim that
	// claimed it, or the SandboxWarmPool keeping it warm (nil: none).
	Holder *ObjectRef `json:"holder,omitempty"`
	// Claim is the task a SandboxClaim holder names (the broker read it);
	// ClaimRefused says why the claim's identity was not bound. Both only
	// with a SandboxClaim holder.
	Claim        *Claim `json:"claim,omitempty"`
	ClaimRefused string `json:"claimRefused,omitempty"`
	// ForkOf is the fork image the Sandbox is a proven copy of: its source
	// Sandbox's answer (agentbox.dev/forked, which the broker writes)
	// names it, by name and UID ("": none). Its pod may restore that
	// image, which is another Sandbox's.
	ForkOf string `json:"forkOf,omitempty"`
	// Ready: the pod's Ready condition is True (its probes passed). A warm
	// pool's Sandbox whose pod is ready only waits: the shim caps its CPU.
	Ready bool `json:"ready,omitempty"`
}

// SameHolder says whether o and p name the same Sandbox, held by the same
// object (or neither by any).
func (o *Owner) SameHolder(p *Owner) bool {
	return o.Sandbox == p.Sandbox && (o.Holder == nil) == (p.Holder == nil) && (o.Holder == nil || *o.Holder == *p.Holder)
}

// ClaimRead says whether o carries what its claim's identity is: bound,
// or refused.
func (o *Owner) ClaimRead() bool { return o.Claim != nil || o.ClaimRefused != "" }

// Same says whether o and p say the same in every field.
func (o *Owner) Same(p *Owner) bool {
	return o.SameHolder(p) && (o.Claim == nil) == (p.Claim == nil) && (o.Claim == nil || o.Claim.Equal(p.Claim)) && o.ClaimRefused == p.ClaimRefused && o.ForkOf == p.ForkOf && o.Ready == p.Ready
}

// Claim is who a claimed sandbox works for, from its SandboxClaim.
type Claim struct {
	Subject string `json:"subject,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	Task    string `json:"task,omitempty"`
	// Role is the role the claim's task runs under from the claim on
	// (agentbox.dev/role on the claim): the shim takes it only when it is
	// bound to the pod and no looser than what the sandbox runs under.
	Role string `json:"role,omitempty"`
	// Keys are the keys the claim gives its task, for the role's
	// fromClaim secrets: the gateway injects them from the claim on.
	Keys []ClaimKey `json:"keys,omitempty"`
}

// ClaimKey is one key a claim gives: the role's fromClaim name, and the
// Secret's key (in the claim's namespace) the node agent keeps on the node.
type ClaimKey struct {
	Name   string           `json:"name"`
	Secret policy.SecretRef `json:"secret"`
}

// MaxClaimKeys bounds the keys one claim gives.
const MaxClaimKeys = 16

// Equal says whether c and d bind the same task and keys.
func (c *Claim) Equal(d *Claim) bool {
	return c.Subject == d.Subject && c.Tenant == d.Tenant && c.Task == d.Task && c.Role == d.Role && slices.Equal(c.Keys, d.Keys)
}

// MaxClaimValue bounds each of a Claim's values (they go into every record
// of the trail).
const MaxClaimValue = 256

// CheckClaimValue says what is wrong with a claim's identity value: empty,
// too long, or not printable UTF-8 text (a newline would forge a line of
// a report).
func CheckClaimValue(v string) error {
	switch {
	case v == "":
		return errors.New("empty")
	case len(v) > MaxClaimValue:
		return fmt.Errorf("%d bytes, more than %d", len(v), MaxClaimValue)
	case !utf8.ValidString(v):
		return errors.New("not UTF-8")
	}
	for _, r := range v {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("holds a character that is not printable (%U)", r)
		}
	}
	return nil
}

func (c *Claim) validate() error {
	for _, f := range []struct{ name, v string }{{"subject", c.Subject}, {"tenant", c.Tenant}, {"task", c.Task}} {
		if f.v == "" {
			continue
		}
		if err := CheckClaimValue(f.v); err != nil {
			return fmt.Errorf("owner.claim.%s: %v", f.name, err)
		}
	}
	if c.Role != "" && !policy.ValidRoleName(c.Role) {
		return fmt.Errorf("owner.claim.role: %q is not a role's name", c.Role)
	}
	if len(c.Keys) > MaxClaimKeys {
		return fmt.Errorf("owner.claim.keys: %d, at most %d", len(c.Keys), MaxClaimKeys)
	}
	seen := map[string]bool{}
	for i, k := range c.Keys {
		if err := policy.ValidClaimKey(k.Name); err != nil {
			return fmt.Errorf("owner.claim.keys[%d].name: %v", i, err)
		}
		if seen[k.Name] {
			return fmt.Errorf("owner.claim.keys[%d].name: %q twice", i, k.Name)
		}
		seen[k.Name] = true
		if err := policy.ValidateSecretRef(k.Secret); err != nil {
			return fmt.Errorf("owner.claim.keys[%d].%v", i, err)
		}
	}
	return nil
}

// ObjectRef names a Kubernetes object.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// String is KIND NAMESPACE/NAME.
func (r ObjectRef) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }

// validate names the field of r that is not a Kubernetes object's.
func (r ObjectRef) validate(field string) error {
	for _, f := range []struct{ name, v string }{{"kind", r.Kind}, {"namespace", r.Namespace}, {"name", r.Name}, {"uid", r.UID}} {
		if f.v == "" || len(f.v) > 253 {
			return fmt.Errorf("%s.%s: %d bytes (1 to 253)", field, f.name, len(f.v))
		}
		for _, c := range f.v {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				return fmt.Errorf("%s.%s: %q is not a Kubernetes name", field, f.name, f.v)
			}
		}
	}
	return nil
}

// Validate names the field a request gets wrong.
func (r Request) Validate() error {
	switch r.Op {
	case OpInfo, OpRelease, OpThaw, OpCheckpoint:
	case OpOwner:
		if r.Owner == nil {
			return errors.New("owner: owner needs the Sandbox")
		}
		if err := r.Owner.Sandbox.validate("owner.sandbox"); err != nil {
			return err
		}
		if r.Owner.Sandbox.Kind != "Sandbox" {
			return fmt.Errorf("owner.sandbox.kind: %q, not Sandbox", r.Owner.Sandbox.Kind)
		}
		if h := r.Owner.Holder; h != nil {
			if err := h.validate("owner.holder"); err != nil {
				return err
			}
			if h.Namespace != r.Owner.Sandbox.Namespace {
				return fmt.Errorf("owner.holder.namespace: %q, not the Sandbox's %q", h.Namespace, r.Owner.Sandbox.Namespace)
			}
		}
		if c := r.Owner.Claim; c != nil || r.Owner.ClaimRefused != "" {
			if h := r.Owner.Holder; h == nil || h.Kind != "SandboxClaim" {
				return errors.New("owner.claim: only with a SandboxClaim holder")
			}
			if c != nil && r.Owner.ClaimRefused != "" {
				return errors.New("owner.claim: both a claim and why it was refused")
			}
			if c != nil {
				if err := c.validate(); err != nil {
					return err
				}
			}
			if len(r.Owner.ClaimRefused) > MaxReason {
				return fmt.Errorf("owner.claimRefused: more than %d bytes", MaxReason)
			}
		}
	case OpQuarantine, OpFreeze, OpStop, OpSuspend:
		if strings.TrimSpace(r.Reason) == "" {
			return fmt.Errorf("reason: %s needs a reason (it goes into the sandbox's trail)", r.Op)
		}
	case "":
		return errors.New("op: missing")
	default:
		return fmt.Errorf("op: %q is not one of info, quarantine, release, freeze, thaw, stop, checkpoint, suspend, owner", r.Op)
	}
	if r.Owner != nil && r.Op != OpOwner {
		return fmt.Errorf("owner: only owner takes one, not %s", r.Op)
	}
	if r.Name != "" {
		if r.Op != OpCheckpoint && r.Op != OpSuspend {
			return fmt.Errorf("name: only checkpoint and suspend take a name, not %s", r.Op)
		}
		if err := checkpoint.ValidName(r.Name); err != nil {
			return fmt.Errorf("name: %w", err)
		}
	}
	if len(r.Reason) > MaxReason {
		return fmt.Errorf("reason: %d bytes, at most %d", len(r.Reason), MaxReason)
	}
	for _, c := range r.Reason {
		if unicode.IsControl(c) {
			return fmt.Errorf("reason: control character %q", c)
		}
	}
	return nil
}

// Peer is who connected, as the kernel says (SO_PEERCRED).
type Peer struct {
	UID uint32 `json:"uid"`
	PID int32  `json:"pid"`
}

// Sandbox is what a shim says of one sandbox.
type Sandbox struct {
	ID string `json:"id"`
	// Namespace is the containerd namespace; Pod is NAMESPACE/NAME for a
	// Kubernetes pod ("" otherwise).
	Namespace string `json:"namespace"`
	Pod       string `json:"pod,omitempty"`
	// PodUID is the pod's UID, as the kubelet gave it ("" otherwise).
	PodUID string `json:"pod_uid,omitempty"`
	Role   string `json:"role"`
	// StartDigest is the policy digest the sandbox started under;
	// LiveDigest the one it runs under now.
	StartDigest string `json:"start_digest"`
	LiveDigest  string `json:"live_digest"`
	// Egress is the role's egress mode; EgressNow what holds now ("none
	// (quarantined)" while quarantined).
	Egress    string `json:"egress"`
	EgressNow string `json:"egress_now"`
	// State is running, frozen or stopping; Quarantined says whether its
	// egress is cut, and why.
	State            string    `json:"state"`
	Quarantined      bool      `json:"quarantined"`
	QuarantineReason string    `json:"quarantine_reason,omitempty"`
	Containers       []string  `json:"containers"`
	Trail            string    `json:"trail"`
	Started          time.Time `json:"started"`
	// WallClockLeft is what is left of the role's wall-clock limit
	// ("" without one).
	WallClockLeft string `json:"wall_clock_left,omitempty"`
	// Owner is the agent-sandbox Sandbox its pod belongs to, as the node
	// agent last said (nil: none said).
	Owner *Owner `json:"owner,omitempty"`
	// Suspend is the role's: "memory" when a Sandbox set to Suspended is
	// to be checkpointed before its pod goes ("" otherwise).
	Suspend string `json:"suspend,omitempty"`
	// RestoredFrom names the checkpoint the sandbox was restored from.
	RestoredFrom string `json:"restored_from,omitempty"`
}

// Response answers a request.
type Response struct {
	OK      bool     `json:"ok"`
	Error   string   `json:"error,omitempty"`
	Message string   `json:"message,omitempty"`
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	// Checkpoint is what a checkpoint or suspend wrote.
	Checkpoint *Checkpointed `json:"checkpoint,omitempty"`
	// Micros is how long the shim took to apply the request.
	Micros int64 `json:"micros,omitempty"`
}

// Checkpointed describes a checkpoint just written.
type Checkpointed struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	Dir    string `json:"dir"`
	Bytes  int64  `json:"bytes"`
	// Millis is how long gVisor took to write it; Suspended says the
	// sandbox was stopped after.
	Millis    int64 `json:"millis"`
	Suspended bool  `json:"suspended"`
	// SharedBytes and SharedMillis say what writing it, encrypted, to
	// the cluster's shared store took (0: not written there).
	SharedBytes  int64 `json:"shared_bytes,omitempty"`
	SharedMillis int64 `json:"shared_millis,omitempty"`
}

// SocketPath is the control socket of sandbox id under the containerd
// instance at containerdAddress: short, since unix socket paths are, and
// distinct per instance.
func SocketPath(dir, containerdAddress, id string) string {
	sum := sha256.Sum256([]byte(containerdAddress + "\x00" + id))
	return filepath.Join(dir, hex.EncodeToString(sum[:8])+".sock")
}
