package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/checkpoint"
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
}

// LimitsProfile holds resource limits; 0 means no limit.
type LimitsProfile struct {
	CPUMillis      int64         `json:"cpuMillis"`
	MemoryBytes    int64         `json:"memoryBytes"`
	CPUTimeSeconds int64         `json:"cpuTimeSeconds"`
	OpenFiles      int           `json:"openFiles"`
	WallClock      time.Duration `json:"wallClockNanos"`
}

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

// ValidRoleName reports whether name can name a role.
func ValidRoleName(name string) bool { return nameRE.MatchString(name) }

// fieldError is a problem with a field, by path below spec.
type fieldError struct{ path, msg string }

func (e fieldError) Error() string { return e.path + ": " + e.msg }

func ferr(path, format string, args ...any) error {
	return fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	envPatRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*\*?$|^\*$`)
	syscallRE = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)
	subjectRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)
	hostRE    = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.?$`)
)

// validateHeader checks what every object carries.
func validateHeader(apiVersion, name string) []fieldError {
	var errs []fieldError
	if apiVersion != APIVersion {
		errs = append(errs, fieldError{"apiVersion", fmt.Sprintf("%q is not %q", apiVersion, APIVersion)})
	}
	if !nameRE.MatchString(name) {
		errs = append(errs, fieldError{"metadata.name", fmt.Sprintf("%q is not a valid name (lower-case letters, digits and '-', at most 63)", name)})
	}
	return errs
}

func validateRole(r *Role) []fieldError {
	errs := validateHeader(r.APIVersion, r.Metadata.Name)
	if p := r.Spec.Inherits; p != "" && !nameRE.MatchString(p) {
		errs = append(errs, fieldError{"spec.inherits", fmt.Sprintf("%q is not a valid role name", p)})
	}
	if p := r.Spec.Inherits; p == r.Metadata.Name {
		errs = append(errs, fieldError{"spec.inherits", "a role cannot inherit from itself"})
	}
	return errs
}

func validateBinding(b *RoleBinding) []fieldError {
	errs := validateHeader(b.APIVersion, b.Metadata.Name)
	if b.Spec.Role == "" {
		errs = append(errs, fieldError{"spec.role", "missing"})
	}
	if len(b.Spec.Subjects) == 0 {
		errs = append(errs, fieldError{"spec.subjects", "missing: a binding without subjects binds nobody"})
	}
	for i, s := range b.Spec.Subjects {
		p := fmt.Sprintf("spec.subjects[%d]", i)
		if s.Namespace == "" && s.ContainerdNamespace == "" && s.RuntimeHandler == "" {
			errs = append(errs, fieldError{p, "sets none of namespace, containerdNamespace, runtimeHandler"})
		}
		for k, v := range map[string]string{"namespace": s.Namespace, "containerdNamespace": s.ContainerdNamespace, "runtimeHandler": s.RuntimeHandler} {
			if v != "" && v != "*" && !subjectRE.MatchString(v) {
				errs = append(errs, fieldError{p + "." + k, fmt.Sprintf("%q is not a valid name or \"*\"", v)})
			}
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].path < errs[j].path })
	return errs
}

// resolve returns the role's spec with its parents' applied, and the chain.
func (s *Set) resolve(name string) (RoleSpec, error) {
	var chain []*Role
	seen := map[string]bool{}
	for n := name; n != ""; {
		r, ok := s.Roles[n]
		if !ok {
			return RoleSpec{}, fmt.Errorf("role %q is not defined", n)
		}
		if seen[n] {
			var names []string
			for _, c := range chain {
				names = append(names, c.Metadata.Name)
			}
			return RoleSpec{}, fmt.Errorf("inheritance cycle: %s -> %s", strings.Join(names, " -> "), n)
		}
		seen[n] = true
		chain = append(chain, r)
		n = r.Spec.Inherits
	}
	var spec RoleSpec
	for i := len(chain) - 1; i >= 0; i-- {
		spec = mergeSpec(spec, chain[i].Spec)
	}
	return spec, nil
}

// mergeSpec applies child over parent: every field the child sets wins;
// lists replace, they do not append.
func mergeSpec(parent, child RoleSpec) RoleSpec {
	out := parent
	out.Inherits = child.Inherits
	if c := child.Filesystem; c != nil {
		m := Filesystem{}
		if parent.Filesystem != nil {
			m = *parent.Filesystem
		}
		pick(&m.Rootfs, c.Rootfs)
		pick(&m.NoExecWritable, c.NoExecWritable)
		pickSlice(&m.Writable, c.Writable)
		pickSlice(&m.HostMounts, c.HostMounts)
		pickSlice(&m.MaskedPaths, c.MaskedPaths)
		pickSlice(&m.AllowExec, c.AllowExec)
		pickSlice(&m.Devices, c.Devices)
		out.Filesystem = &m
	}
	if c := child.Network; c != nil {
		m := Network{}
		if parent.Network != nil {
			m = *parent.Network
		}
		pick(&m.Egress, c.Egress)
		pickSlice(&m.Allow, c.Allow)
		out.Network = &m
	}
	if c := child.Process; c != nil {
		m := Process{}
		if parent.Process != nil {
			m = *parent.Process
		}
		pick(&m.MaxProcesses, c.MaxProcesses)
		pick(&m.RunAsUser, c.RunAsUser)
		pick(&m.RunAsGroup, c.RunAsGroup)
		pickSlice(&m.AllowUsers, c.AllowUsers)
		pickSlice(&m.AllowGroups, c.AllowGroups)
		pick(&m.AllowPrivilegeEscalation, c.AllowPrivilegeEscalation)
		pickSlice(&m.Capabilities, c.Capabilities)
		pickSlice(&m.DeniedSyscalls, c.DeniedSyscalls)
		pickSlice(&m.AllowSyscalls, c.AllowSyscalls)
		out.Process = &m
	}
	if c := child.Credentials; c != nil {
		m := Credentials{}
		if parent.Credentials != nil {
			m = *parent.Credentials
		}
		if c.Env != nil {
			m.Env = c.Env
		}
		pickSlice(&m.Secrets, c.Secrets)
		pick(&m.ServiceAccountToken, c.ServiceAccountToken)
		out.Credentials = &m
	}
	if c := child.Audit; c != nil {
		m := Audit{}
		if parent.Audit != nil {
			m = *parent.Audit
		}
		pick(&m.Process, c.Process)
		pick(&m.File, c.File)
		pick(&m.Network, c.Network)
		out.Audit = &m
	}
	if c := child.Limits; c != nil {
		m := Limits{}
		if parent.Limits != nil {
			m = *parent.Limits
		}
		pick(&m.CPU, c.CPU)
		pick(&m.Memory, c.Memory)
		pick(&m.CPUTime, c.CPUTime)
		pick(&m.OpenFiles, c.OpenFiles)
		pick(&m.WallClock, c.WallClock)
		out.Limits = &m
	}
	pick(&out.Template, child.Template)
	return out
}

func pick[T any](dst **T, v *T) {
	if v != nil {
		*dst = v
	}
}

func pickSlice[T any](dst *[]T, v []T) {
	if v != nil {
		*dst = v
	}
}

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
		if err := checkpoint.ValidName(t); err != nil {
			errs = append(errs, ferr("template", "%v", err))
		}
		p.Template = t
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
	return errs
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

// compileCredentials fills the profile's credentials section, with its defaults.
func (p *Profile) compileCredentials(cr Credentials) []error {
	var errs []error
	p.Credentials.EnvAllow = DefaultEnvAllow
	if cr.Env != nil {
		p.Credentials.EnvAllow = nonNil(cr.Env.Allow)
	}
	for i, pat := range p.Credentials.EnvAllow {
		if !envPatRE.MatchString(pat) {
			errs = append(errs, ferr(fmt.Sprintf("credentials.env.allow[%d]", i), "%q is not a variable name or a prefix ending in '*'", pat))
		}
	}
	p.Credentials.Secrets = nonNil(cr.Secrets)
	seenEnv := map[string]bool{}
	seenInject := map[string]bool{}
	for i, sec := range p.Credentials.Secrets {
		ip := fmt.Sprintf("credentials.secrets[%d]", i)
		switch {
		case sec.Env == "" && sec.Inject == nil:
			errs = append(errs, ferr(ip, "names neither env (the agent holds the secret) nor inject (the gateway adds it to one host's requests)"))
		case sec.Env != "" && !envNameRE.MatchString(sec.Env):
			errs = append(errs, ferr(ip+".env", "%q is not an environment variable name", sec.Env))
		case sec.Env != "" && seenEnv[sec.Env]:
			errs = append(errs, ferr(ip+".env", "%q is injected twice", sec.Env))
		}
		if sec.Env != "" {
			seenEnv[sec.Env] = true
		}
		if err := checkPath(ip+".file", sec.File); err != nil {
			errs = append(errs, err)
		}
		if in := sec.Inject; in != nil {
			errs = append(errs, checkInject(ip+".inject", *in)...)
			key := strings.ToLower(in.Host) + " " + http.CanonicalHeaderKey(in.Header)
			if seenInject[key] {
				errs = append(errs, ferr(ip+".inject", "header %s of %s is injected twice", in.Header, in.Host))
			}
			seenInject[key] = true
			if !p.hostAllowed(in.Host) {
				errs = append(errs, ferr(ip+".inject.host", "%q is not allowed by any host rule in network.allow: the secret would never be sent", in.Host))
			}
		}
	}
	p.Credentials.ServiceAccountToken = deref(cr.ServiceAccountToken, false)
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
	return errs
}

// compileAudit fills the profile's audit section, with its defaults.
func (p *Profile) compileAudit(au Audit) []error {
	var errs []error
	p.Audit = AuditProfile{Process: deref(au.Process, true), File: deref(au.File, true), Network: deref(au.Network, true)}
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

func checkPath(field, p string) error {
	if !path.IsAbs(p) {
		return ferr(field, "%q is not an absolute path", p)
	}
	if path.Clean(p) != p {
		return ferr(field, "%q is not clean (want %q)", p, path.Clean(p))
	}
	return nil
}

func checkPaths(field string, ps []string) []error {
	var errs []error
	seen := map[string]bool{}
	for i, p := range ps {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := checkPath(f, p); err != nil {
			errs = append(errs, err)
		} else if p == "/" {
			errs = append(errs, ferr(f, "\"/\" is the whole filesystem"))
		} else if seen[p] {
			errs = append(errs, ferr(f, "%q is listed twice", p))
		}
		seen[p] = true
	}
	return errs
}

func checkEgressRule(field string, r EgressRule) []error {
	var errs []error
	switch {
	case r.Host != "" && r.CIDR != "":
		errs = append(errs, ferr(field, "sets both host and cidr; use one rule each"))
	case r.Host == "" && r.CIDR == "":
		errs = append(errs, ferr(field, "sets neither host nor cidr"))
	case r.Host != "":
		if net.ParseIP(r.Host) != nil {
			errs = append(errs, ferr(field+".host", "%q is an address; use cidr: %s/32", r.Host, r.Host))
		} else if !hostRE.MatchString(r.Host) || len(r.Host) > 253 {
			errs = append(errs, ferr(field+".host", "%q is not a DNS name", r.Host))
		}
		if len(r.Ports) == 0 {
			errs = append(errs, ferr(field+".ports", "a host rule names its ports (like [443]): the egress gateway serves TLS and HTTP to the name on those ports only"))
		}
		for i, port := range r.Ports {
			if port == 53 {
				errs = append(errs, ferr(fmt.Sprintf("%s.ports[%d]", field, i), "port 53 is the pod's resolver; a host rule cannot name it"))
			}
		}
		if r.HTTP != nil {
			errs = append(errs, checkHTTP(field+".http", *r.HTTP)...)
		}
	default:
		if r.HTTP != nil {
			errs = append(errs, ferr(field+".http", "only a host rule takes it: the gateway decides requests by name"))
		}
		if r.AllowPrivate {
			errs = append(errs, ferr(field+".allowPrivate", "only a host rule takes it; a CIDR rule names its addresses already"))
		}
		if r.WebSocket {
			errs = append(errs, ferr(field+".websocket", "only a host rule takes it: the gateway decides upgrades by name, and a CIDR rule's connections do not pass it"))
		}
		if _, _, err := net.ParseCIDR(r.CIDR); err != nil {
			errs = append(errs, ferr(field+".cidr", "%q is not a CIDR (like 10.0.0.0/8)", r.CIDR))
		}
	}
	for i, port := range r.Ports {
		if port < 1 || port > 65535 {
			errs = append(errs, ferr(fmt.Sprintf("%s.ports[%d]", field, i), "%d is not a port (1-65535)", port))
		}
	}
	return errs
}

// hopHeaders are the request headers a secret may not be injected as: the
// gateway or the HTTP framing owns them.
var hopHeaders = map[string]bool{
	"Host": true, "Connection": true, "Content-Length": true, "Transfer-Encoding": true, "Te": true,
	"Trailer": true, "Upgrade": true, "Keep-Alive": true, "Proxy-Connection": true, "Expect": true,
}

// headerRE is an HTTP header name (RFC 9110 token).
var headerRE = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")

func checkInject(field string, in Inject) []error {
	var errs []error
	switch {
	case in.Host == "":
		errs = append(errs, ferr(field+".host", "is empty: name the host whose requests carry the secret"))
	case strings.HasPrefix(in.Host, "*"):
		errs = append(errs, ferr(field+".host", "%q is a pattern: a secret goes to one exact name", in.Host))
	case net.ParseIP(in.Host) != nil || !hostRE.MatchString(in.Host) || len(in.Host) > 253:
		errs = append(errs, ferr(field+".host", "%q is not a DNS name", in.Host))
	}
	switch {
	case !headerRE.MatchString(in.Header):
		errs = append(errs, ferr(field+".header", "%q is not an HTTP header name", in.Header))
	case hopHeaders[http.CanonicalHeaderKey(in.Header)]:
		errs = append(errs, ferr(field+".header", "%s is the HTTP framing's or the gateway's; a secret cannot be sent as it", http.CanonicalHeaderKey(in.Header)))
	}
	if in.Format != "" {
		if strings.Count(in.Format, SecretToken) != 1 {
			errs = append(errs, ferr(field+".format", "%q must hold %s once", in.Format, SecretToken))
		}
		for _, c := range in.Format {
			if c < 0x20 || c == 0x7f {
				errs = append(errs, ferr(field+".format", "%q holds a control character", in.Format))
				break
			}
		}
	}
	return errs
}

// SecretToken is where a secret goes in an Inject's Format.
const SecretToken = "{secret}"

// hostAllowed says whether a host rule of the profile allows name (the
// gateway's matching: exact, or "*.suffix" for the names below suffix).
func (p *Profile) hostAllowed(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, r := range p.Network.Allow {
		if h := strings.TrimSuffix(strings.ToLower(r.Host), "."); h != "" && HostMatches(h, name) {
			return true
		}
	}
	return false
}

// HostMatches says whether a host rule's pattern (lower case, no trailing
// dot) matches name: the name itself, or "*.suffix" for the names below
// suffix. The resolver, the gateway and validation decide by it alike.
func HostMatches(pattern, name string) bool {
	if suffix, wild := strings.CutPrefix(pattern, "*"); wild {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return name == pattern
}

// checkHTTP checks a host rule's http section.
func checkHTTP(field string, h HTTPRule) []error {
	var errs []error
	if len(h.Methods) == 0 && len(h.Paths) == 0 {
		errs = append(errs, ferr(field, "restricts nothing: list methods or paths, or drop http"))
	}
	for i, m := range h.Methods {
		if !methodRE.MatchString(m) {
			errs = append(errs, ferr(fmt.Sprintf("%s.methods[%d]", field, i), "%q is not an HTTP method in upper case (GET, POST, ...)", m))
		} else if m == "CONNECT" {
			errs = append(errs, ferr(fmt.Sprintf("%s.methods[%d]", field, i), "CONNECT is never served by the gateway"))
		}
	}
	for i, pt := range h.Paths {
		f := fmt.Sprintf("%s.paths[%d]", field, i)
		base := strings.TrimSuffix(pt, "*")
		switch {
		case !strings.HasPrefix(pt, "/"):
			errs = append(errs, ferr(f, "%q does not start with /", pt))
		case strings.Contains(base, "*"):
			errs = append(errs, ferr(f, "%q has '*' inside it; only a final '*' (a prefix) is understood", pt))
		case !CanonicalPath(base) && base != "/":
			errs = append(errs, ferr(f, "%q is not a clean path (no '.', '..' or empty segments)", pt))
		case strings.ContainsAny(pt, "?#%"):
			errs = append(errs, ferr(f, "%q holds '?', '#' or '%%': paths are matched decoded, without the query", pt))
		}
	}
	return errs
}

var methodRE = regexp.MustCompile(`^[A-Z][A-Z-]{0,19}$`)

// CanonicalPath reports whether p (decoded, starting with '/') has no '.',
// '..' or empty segments: the path that is checked is the path the server
// sees. A trailing '/' is allowed.
func CanonicalPath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || (s == "" && i != len(segs)-1) {
			return false
		}
	}
	return true
}

// PathAllowed says whether the decoded, canonical path p is one of the
// patterns (exact, or a prefix ending in '*'); no patterns allow any.
func PathAllowed(patterns []string, p string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, pt := range patterns {
		if prefix, ok := strings.CutSuffix(pt, "*"); ok {
			if strings.HasPrefix(p, prefix) {
				return true
			}
		} else if p == pt {
			return true
		}
	}
	return false
}

// parseCPU parses cores: "2", "0.5", "500m".
func parseCPU(v *string, def int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	s := strings.TrimSpace(*v)
	var m float64
	if strings.HasSuffix(s, "m") {
		n, err := strconv.ParseInt(strings.TrimSuffix(s, "m"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a CPU amount (like 1, 0.5 or 500m)", *v)
		}
		m = float64(n)
	} else {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%q is not a CPU amount (like 1, 0.5 or 500m)", *v)
		}
		m = f * 1000
	}
	if m < 10 || m > 1024*1000 {
		return 0, fmt.Errorf("%q is not between 10m and 1024 cores", *v)
	}
	return int64(m), nil
}

var byteUnits = map[string]int64{
	"": 1, "k": 1000, "K": 1000, "M": 1000 * 1000, "G": 1000 * 1000 * 1000, "T": 1000 * 1000 * 1000 * 1000,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}

var bytesRE = regexp.MustCompile(`^([0-9]{1,15})([kKMGT]i?)?$`)

// parseBytes parses "512Mi", "2Gi", "1G", "1048576".
func parseBytes(v *string, def int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	m := bytesRE.FindStringSubmatch(strings.TrimSpace(*v))
	if m == nil {
		return 0, fmt.Errorf("%q is not an amount of memory (like 512Mi or 2Gi)", *v)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	unit := byteUnits[m[2]]
	if n > math.MaxInt64/unit {
		return 0, fmt.Errorf("%q is too large", *v)
	}
	return n * unit, nil
}

// parseDuration parses a positive Go duration ("30m", "1h30m").
func parseDuration(v *string, def time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(*v))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (like 90s, 30m or 1h)", *v)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q must be positive", *v)
	}
	return d, nil
}

// seal computes the digest over everything but the digest itself.
func (p *Profile) seal() {
	p.Digest = ""
	b, _ := json.Marshal(p)
	sum := sha256.Sum256(b)
	p.Digest = "sha256:" + hex.EncodeToString(sum[:])
}

var knownCapabilities = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range strings.Fields(`CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID
		CAP_KILL CAP_SETGID CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE
		CAP_NET_BROADCAST CAP_NET_ADMIN CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE
		CAP_SYS_RAWIO CAP_SYS_CHROOT CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT
		CAP_SYS_NICE CAP_SYS_RESOURCE CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE
		CAP_AUDIT_WRITE CAP_AUDIT_CONTROL CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG
		CAP_WAKE_ALARM CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE`) {
		m[c] = true
	}
	return m
}()

// ParseCPU parses a CPU amount as roles and Kubernetes write it ("2",
// "0.5", "500m") into millicores.
func ParseCPU(s string) (int64, error) { return parseCPU(&s, 0) }

// ParseMemory parses an amount of memory as roles and Kubernetes write it
// ("512Mi", "2Gi", "1G") into bytes.
func ParseMemory(s string) (int64, error) { return parseBytes(&s, 0) }

// CapabilityName spells a capability as the OCI spec does ("net_admin",
// "NET_ADMIN" and "CAP_NET_ADMIN" are CAP_NET_ADMIN), and reports whether
// it is a Linux capability.
func CapabilityName(c string) (string, bool) {
	name := strings.ToUpper(c)
	if !strings.HasPrefix(name, "CAP_") {
		name = "CAP_" + name
	}
	return name, knownCapabilities[name]
}

// AllCapabilities lists every Linux capability agentbox knows, sorted.
func AllCapabilities() []string {
	out := make([]string, 0, len(knownCapabilities))
	for c := range knownCapabilities {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}
