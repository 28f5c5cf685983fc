package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/checkpoint/naming"
)

// Profile is a role compiled to what the shim enforces: plain data, with
// every default filled in. Its Digest identifies it in logs and audit
// records.
type Profile struct {
	Role string `json:"role"`
	// Chain is the role followed by the roles it inherits from.
	Chain       []string           `json:"chain"`
	Filesystem  FilesystemProfile  `json:"filesystem"`
	Network     NetworkProfile     `json:"network"`
	Process     ProcessProfile     `json:"process"`
	Credentials CredentialsProfile `json:"credentials"`
	Limits      LimitsProfile      `json:"limits"`
	Audit       AuditProfile       `json:"audit"`
	// Template is the checkpoint new sandboxes under the role start from
	// ("" boot).
	Template string `json:"template,omitempty"`
	// Suspend is SuspendMemory when a suspend the cluster asks for keeps
	// the agent's memory ("": it does not).
	Suspend string `json:"suspend,omitempty"`
	// Tightened lists the pod annotations that narrowed the role.
	Tightened []string `json:"tightened,omitempty"`
	Digest    string   `json:"digest"`
}

// FilesystemProfile is the enforced filesystem scope.
type FilesystemProfile struct {
	Rootfs         string      `json:"rootfs"`
	Writable       []string    `json:"writable"`
	NoExecWritable bool        `json:"noExecWritable"`
	HostMounts     []HostMount `json:"hostMounts"`
	MaskedPaths    []string    `json:"maskedPaths"`
	AllowExec      []string    `json:"allowExec"`
	Devices        []string    `json:"devices"`
}

// NetworkProfile is the enforced egress policy.
type NetworkProfile struct {
	Egress string       `json:"egress"`
	Allow  []EgressRule `json:"allow"`
	// PortForward is the sandbox's ports the node's port-forward may
	// reach, ascending (none: port-forward reaches nothing).
	PortForward []int `json:"portForward,omitempty"`
}

// ProcessProfile is the enforced process identity and limits.
type ProcessProfile struct {
	MaxProcesses int      `json:"maxProcesses"`
	Capabilities []string `json:"capabilities"`
	RunAsUser    uint32   `json:"runAsUser"`
	RunAsGroup   uint32   `json:"runAsGroup"`
	// AllowUsers and AllowGroups are the ids a pod may ask for, besides
	// RunAsUser and RunAsGroup.
	AllowUsers               IDRanges `json:"allowUsers"`
	AllowGroups              IDRanges `json:"allowGroups"`
	AllowPrivilegeEscalation bool     `json:"allowPrivilegeEscalation"`
	DeniedSyscalls           []string `json:"deniedSyscalls"`
	AllowSyscalls            []string `json:"allowSyscalls"`
}

// CredentialsProfile is the enforced credential scope.
type CredentialsProfile struct {
	EnvAllow            []string `json:"envAllow"`
	Secrets             []Secret `json:"secrets"`
	ServiceAccountToken bool     `json:"serviceAccountToken"`
}

// AuditProfile is what the trail records.
type AuditProfile struct {
	Process bool `json:"process"`
	File    bool `json:"file"`
	Network bool `json:"network"`
	// Model is what a model call's record keeps: ModelCalls, ModelDigests
	// or ModelContent.
	Model string `json:"model"`
}

// What a model call's record keeps (audit.model).
const (
	ModelCalls   = "calls"
	ModelDigests = "digests"
	ModelContent = "content"
)

// LimitsProfile holds resource limits; 0 means no limit.
type LimitsProfile struct {
	CPUMillis      int64         `json:"cpuMillis"`
	MemoryBytes    int64         `json:"memoryBytes"`
	CPUTimeSeconds int64         `json:"cpuTimeSeconds"`
	OpenFiles      int           `json:"openFiles"`
	WallClock      time.Duration `json:"wallClockNanos"`
	// Model bounds the sandbox's model calls (zero: none); MCP its calls to
	// each MCP server.
	Model ModelBudget `json:"model"`
	MCP   MCPBudget   `json:"mcp,omitzero"`
}

// MCPBudget bounds a sandbox's tools/call to each MCP server; 0 (or no
// entry) means no bound.
type MCPBudget struct {
	Calls int64            `json:"calls,omitempty"`
	Tools map[string]int64 `json:"tools,omitempty"`
}

// Equal says whether b and c bound the same.
func (b MCPBudget) Equal(c MCPBudget) bool { return b.Calls == c.Calls && maps.Equal(b.Tools, c.Tools) }

// ModelBudget bounds a sandbox's model calls; 0 means no bound.
type ModelBudget struct {
	Tokens            int64 `json:"tokens,omitempty"`
	Requests          int64 `json:"requests,omitempty"`
	RequestsPerMinute int64 `json:"requestsPerMinute,omitempty"`
	// MaxOutput is the output cap set on a call that names none (with
	// Tokens only).
	MaxOutput int64 `json:"maxOutputTokens,omitempty"`
}

// DefaultModelMaxOutput is the output cap of a call that names none under
// a token budget, unless the role sets limits.model.maxOutputTokens.
const DefaultModelMaxOutput = 16384

// Any says whether b bounds anything.
func (b ModelBudget) Any() bool { return b.Tokens > 0 || b.Requests > 0 || b.RequestsPerMinute > 0 }

// Defaults a role gets for what neither it nor its parents set: least
// privilege, and limits that keep one agent from starving a node.
var (
	DefaultMaxProcesses = 64
	DefaultUID          = uint32(65532)
	DefaultEnvAllow     = []string{"PATH", "HOME", "LANG", "TERM", "HOSTNAME"}
	DefaultMemory       = int64(512 << 20)
	DefaultCPUMillis    = int64(1000)
	DefaultOpenFiles    = 1024
	DefaultWallClock    = 15 * time.Minute
)

// MinMemory is the least memory a sandbox boots with.
const MinMemory = 16 << 20

// Profile compiles the named role, with its parents applied, into a
// Profile. All problems are reported, each with its field path below spec.
func (s *Set) Profile(name string) (*Profile, error) {
	spec, err := s.resolve(name)
	if err != nil {
		return nil, err
	}
	p, err := compileSpec(spec)
	if err != nil {
		return nil, err
	}
	p.Role = name
	for n := name; n != ""; n = s.Roles[n].Spec.Inherits {
		p.Chain = append(p.Chain, n)
	}
	p.seal()
	return p, nil
}

func compileSpec(spec RoleSpec) (*Profile, error) {
	p := &Profile{}
	errs := p.compileFilesystem(deref(spec.Filesystem, Filesystem{}))
	errs = append(errs, p.compileNetwork(deref(spec.Network, Network{}))...)
	errs = append(errs, p.compileProcess(deref(spec.Process, Process{}))...)
	errs = append(errs, p.compileCredentials(deref(spec.Credentials, Credentials{}))...)
	errs = append(errs, p.compileLimits(deref(spec.Limits, Limits{}))...)
	errs = append(errs, p.compileAudit(deref(spec.Audit, Audit{}))...)
	if t := deref(spec.Template, ""); t != "" {
		if err := naming.Valid(t); err != nil {
			errs = append(errs, ferr("template", "%v", err))
		}
		p.Template = t
	}
	switch sus := deref(spec.Suspend, SuspendNone); sus {
	case SuspendMemory:
		p.Suspend = SuspendMemory
	case SuspendNone:
	default:
		errs = append(errs, ferr("suspend", "%q is not memory or none", sus))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// compileFilesystem fills the profile's filesystem section, with its defaults.
func (p *Profile) compileFilesystem(fs Filesystem) []error {
	var errs []error
	p.Filesystem.Rootfs = deref(fs.Rootfs, RootfsReadOnly)
	if p.Filesystem.Rootfs != RootfsReadOnly && p.Filesystem.Rootfs != RootfsOverlay {
		errs = append(errs, ferr("filesystem.rootfs", "%q is not read-only or overlay", p.Filesystem.Rootfs))
	}
	p.Filesystem.NoExecWritable = deref(fs.NoExecWritable, true)
	p.Filesystem.Writable = nonNil(fs.Writable)
	errs = append(errs, checkPaths("filesystem.writable", p.Filesystem.Writable)...)
	for i, hm := range fs.HostMounts {
		ro := deref(hm.ReadOnly, true)
		p.Filesystem.HostMounts = append(p.Filesystem.HostMounts, HostMount{Path: hm.Path, ReadOnly: &ro})
		if err := checkPath(fmt.Sprintf("filesystem.hostMounts[%d].path", i), hm.Path); err != nil {
			errs = append(errs, err)
		}
	}
	p.Filesystem.HostMounts = nonNil(p.Filesystem.HostMounts)
	p.Filesystem.MaskedPaths = nonNil(fs.MaskedPaths)
	errs = append(errs, checkPaths("filesystem.maskedPaths", p.Filesystem.MaskedPaths)...)
	for i, mp := range p.Filesystem.MaskedPaths {
		if inGVisorFS(mp) {
			if _, err := gvisorKind(mp); err != nil {
				errs = append(errs, fmt.Errorf("filesystem.maskedPaths[%d]: %w", i, err))
			}
		}
	}
	p.Filesystem.AllowExec = nonNil(fs.AllowExec)
	errs = append(errs, checkPaths("filesystem.allowExec", p.Filesystem.AllowExec)...)
	p.Filesystem.Devices = nonNil(fs.Devices)
	errs = append(errs, checkPaths("filesystem.devices", p.Filesystem.Devices)...)
	for i, d := range p.Filesystem.Devices {
		if !under(d, "/dev") || d == "/dev" {
			errs = append(errs, ferr(fmt.Sprintf("filesystem.devices[%d]", i), "%q is not a device path below /dev", d))
		}
	}
	return errs
}

// compileNetwork fills the profile's network section, with its defaults.
func (p *Profile) compileNetwork(nw Network) []error {
	var errs []error
	p.Network.Egress = deref(nw.Egress, EgressNone)
	p.Network.Allow = nonNil(nw.Allow)
	switch p.Network.Egress {
	case EgressNone, EgressOpen:
		if len(p.Network.Allow) > 0 {
			errs = append(errs, ferr("network.allow", "egress %s takes no allow list; use egress: allowlist", p.Network.Egress))
		}
	case EgressAllowlist:
		if len(p.Network.Allow) == 0 {
			errs = append(errs, ferr("network.allow", "egress allowlist needs at least one rule (or use egress: none)"))
		}
	default:
		errs = append(errs, ferr("network.egress", "%q is not none, allowlist or open", p.Network.Egress))
	}
	for i, r := range p.Network.Allow {
		errs = append(errs, checkEgressRule(fmt.Sprintf("network.allow[%d]", i), r)...)
	}
	p.Network.PortForward, errs = compilePortForward(nw.PortForward, errs)
	return errs
}

// maxPortForward bounds network.portForward: a listener each.
const maxPortForward = 16

// compilePortForward checks network.portForward: ports 1-65535, each
// once, at most maxPortForward; sorted.
func compilePortForward(ports []int, errs []error) ([]int, []error) {
	if len(ports) == 0 {
		return nil, errs
	}
	if len(ports) > maxPortForward {
		return nil, append(errs, ferr("network.portForward", "%d ports; at most %d", len(ports), maxPortForward))
	}
	out := slices.Clone(ports)
	slices.Sort(out)
	for i, port := range out {
		if port < 1 || port > 65535 {
			errs = append(errs, ferr("network.portForward", "port %d is not between 1 and 65535", port))
		} else if i > 0 && out[i-1] == port {
			errs = append(errs, ferr("network.portForward", "port %d is listed twice", port))
		}
	}
	return out, errs
}

// compileProcess fills the profile's process section, with its defaults.
func (p *Profile) compileProcess(pr Process) []error {
	var errs []error
	p.Process.MaxProcesses = deref(pr.MaxProcesses, DefaultMaxProcesses)
	if p.Process.MaxProcesses < 1 || p.Process.MaxProcesses > 1<<20 {
		errs = append(errs, ferr("process.maxProcesses", "%d is not between 1 and %d", p.Process.MaxProcesses, 1<<20))
	}
	p.Process.RunAsUser = deref(pr.RunAsUser, DefaultUID)
	p.Process.RunAsGroup = deref(pr.RunAsGroup, p.Process.RunAsUser)
	if p.Process.RunAsUser == math.MaxUint32 || p.Process.RunAsGroup == math.MaxUint32 {
		errs = append(errs, ferr("process.runAsUser", "4294967295 is not a valid id"))
	}
	var err error
	if p.Process.AllowUsers, err = parseIDRanges("process.allowUsers", pr.AllowUsers); err != nil {
		errs = append(errs, err)
	}
	if p.Process.AllowGroups, err = parseIDRanges("process.allowGroups", pr.AllowGroups); err != nil {
		errs = append(errs, err)
	}
	p.Process.AllowPrivilegeEscalation = deref(pr.AllowPrivilegeEscalation, false)
	p.Process.Capabilities = []string{}
	for i, c := range pr.Capabilities {
		name, ok := CapabilityName(c)
		if !ok {
			errs = append(errs, ferr(fmt.Sprintf("process.capabilities[%d]", i), "%q is not a Linux capability", c))
			continue
		}
		p.Process.Capabilities = append(p.Process.Capabilities, name)
		if name == "CAP_SYS_ADMIN" || name == "CAP_SYS_RESOURCE" {
			errs = append(errs, ferr(fmt.Sprintf("process.capabilities[%d]", i), "%s lets the agent exceed maxProcesses; agentbox does not grant it", name))
		}
	}
	sort.Strings(p.Process.Capabilities)
	p.Process.DeniedSyscalls = nonNil(pr.DeniedSyscalls)
	for i, sc := range p.Process.DeniedSyscalls {
		if !syscallRE.MatchString(sc) {
			errs = append(errs, ferr(fmt.Sprintf("process.deniedSyscalls[%d]", i), "%q is not a syscall name", sc))
		}
	}
	p.Process.AllowSyscalls = nonNil(pr.AllowSyscalls)
	for i, c := range p.Process.AllowSyscalls {
		if syscallClass(c) == nil {
			errs = append(errs, ferr(fmt.Sprintf("process.allowSyscalls[%d]", i), "%q is not a class of the baseline syscall policy (%s)", c, strings.Join(syscallClassNames(), ", ")))
		}
	}
	return errs
}

// compileLimits fills the profile's limits section, with its defaults.
func (p *Profile) compileLimits(li Limits) []error {
	var errs []error
	var err error
	if p.Limits.CPUMillis, err = parseCPU(li.CPU, DefaultCPUMillis); err != nil {
		errs = append(errs, ferr("limits.cpu", "%v", err))
	}
	if p.Limits.MemoryBytes, err = parseBytes(li.Memory, DefaultMemory); err != nil {
		errs = append(errs, ferr("limits.memory", "%v", err))
	} else if p.Limits.MemoryBytes < MinMemory {
		errs = append(errs, ferr("limits.memory", "%d bytes is below the %dMi a sandbox needs to boot", p.Limits.MemoryBytes, MinMemory>>20))
	}
	var cpuTime time.Duration
	if cpuTime, err = parseDuration(li.CPUTime, 0); err != nil {
		errs = append(errs, ferr("limits.cpuTime", "%v", err))
	} else if cpuTime > 0 && cpuTime < time.Second {
		errs = append(errs, ferr("limits.cpuTime", "%v is below the 1s granularity of RLIMIT_CPU", cpuTime))
	}
	p.Limits.CPUTimeSeconds = int64(cpuTime / time.Second)
	p.Limits.OpenFiles = deref(li.OpenFiles, DefaultOpenFiles)
	if p.Limits.OpenFiles < 16 || p.Limits.OpenFiles > 1<<20 {
		errs = append(errs, ferr("limits.openFiles", "%d is not between 16 and %d", p.Limits.OpenFiles, 1<<20))
	}
	if p.Limits.WallClock, err = parseDuration(li.WallClock, DefaultWallClock); err != nil {
		errs = append(errs, ferr("limits.wallClock", "%v", err))
	}
	if m := li.Model; m != nil {
		positive := func(field string, v *int64) int64 {
			if v == nil {
				return 0
			}
			if *v < 1 {
				errs = append(errs, ferr(field, "%d is not a bound (at least 1; leave it out for none)", *v))
			}
			return *v
		}
		p.Limits.Model.Tokens = positive("limits.model.tokens", m.Tokens)
		p.Limits.Model.Requests = positive("limits.model.requests", m.Requests)
		if m.PerMinute != nil {
			p.Limits.Model.RequestsPerMinute = positive("limits.model.perMinute.requests", m.PerMinute.Requests)
		}
		switch mb := &p.Limits.Model; {
		case m.MaxOutputTokens != nil && mb.Tokens == 0:
			errs = append(errs, ferr("limits.model.maxOutputTokens", "caps calls under a token budget only: set limits.model.tokens too"))
		case m.MaxOutputTokens != nil:
			mb.MaxOutput = positive("limits.model.maxOutputTokens", m.MaxOutputTokens)
			if mb.MaxOutput > mb.Tokens {
				errs = append(errs, ferr("limits.model.maxOutputTokens", "%d is more than limits.model.tokens (%d): a call naming no cap could never be made", mb.MaxOutput, mb.Tokens))
			}
		case mb.Tokens > 0:
			mb.MaxOutput = min(DefaultModelMaxOutput, mb.Tokens)
		}
		if !p.Limits.Model.Any() {
			errs = append(errs, ferr("limits.model", "bounds nothing: set tokens, requests or perMinute.requests"))
		}
		apis := false
		for _, r := range p.Network.Allow {
			apis = apis || IsModelAPI(r.API)
		}
		if !apis {
			errs = append(errs, ferr("limits.model", "no host rule names a model API (api:): the gateway would count no call"))
		}
	}
	return append(errs, p.compileMCPLimits(li.MCP)...)
}

// compileMCPLimits fills the profile's MCP budget.
func (p *Profile) compileMCPLimits(m *MCPLimits) []error {
	if m == nil {
		return nil
	}
	var errs []error
	if m.Calls != nil {
		if p.Limits.MCP.Calls = *m.Calls; *m.Calls < 1 {
			errs = append(errs, ferr("limits.mcp.calls", "%d is not a bound (at least 1; leave it out for none)", *m.Calls))
		}
	}
	for name, n := range m.Tools {
		field := "limits.mcp.tools." + name
		switch {
		case !toolRE.MatchString(name) || strings.HasSuffix(name, "*"):
			errs = append(errs, ferr(field, "%q is not a tool's name", name))
		case n < 1:
			errs = append(errs, ferr(field, "%d is not a bound (at least 1; leave it out for none)", n))
		}
	}
	p.Limits.MCP.Tools = maps.Clone(m.Tools)
	if m.Calls == nil && len(m.Tools) == 0 {
		errs = append(errs, ferr("limits.mcp", "bounds nothing: set calls or tools"))
	}
	if !slices.ContainsFunc(p.Network.Allow, func(r EgressRule) bool { return r.API == APIMCP }) {
		errs = append(errs, ferr("limits.mcp", "no host rule names an MCP server (api: mcp): the gateway would count no call"))
	}
	return errs
}

// compileAudit fills the profile's audit section, with its defaults.
func (p *Profile) compileAudit(au Audit) []error {
	var errs []error
	p.Audit = AuditProfile{Process: deref(au.Process, true), File: deref(au.File, true), Network: deref(au.Network, true), Model: deref(au.Model, ModelDigests)}
	switch p.Audit.Model {
	case ModelCalls, ModelDigests, ModelContent:
	default:
		errs = append(errs, ferr("audit.model", "%q is not calls, digests or content", p.Audit.Model))
	}
	return errs
}

func deref[T any](v *T, def T) T {
	if v == nil {
		return def
	}
	return *v
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// SecretToken is where a secret goes in an Inject's Format.
const SecretToken = "{secret}"

// seal computes the digest over everything but the digest itself.
func (p *Profile) seal() {
	p.Digest = ""
	b, _ := json.Marshal(p)
	sum := sha256.Sum256(b)
	p.Digest = "sha256:" + hex.EncodeToString(sum[:])
}

// ShortDigest abbreviates a profile's (or an image's) digest for people:
// its first 12 hex digits, without the algorithm.
func ShortDigest(digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}
