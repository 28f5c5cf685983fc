package policy

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/errkind"
)

// A role is a ceiling on what a container asks for, not a costume: what
// the request asks at or below the role is kept, what it leaves to the
// runtime's defaults gets the role's, and what exceeds the role is refused
// with the spec field named. Where the runtime cannot tell a request from a
// default (the OCI spec carries no mark of which is which), the rule is
// stated at the function that applies it.

// IDRange is an inclusive range of user or group ids.
type IDRange struct{ Min, Max uint32 }

func (r IDRange) String() string {
	if r.Min == r.Max {
		return strconv.FormatUint(uint64(r.Min), 10)
	}
	return fmt.Sprintf("%d-%d", r.Min, r.Max)
}

// MarshalText writes the range as a policy file spells it.
func (r IDRange) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads what MarshalText writes (a compiled profile kept
// with a checkpoint is read back).
func (r *IDRange) UnmarshalText(b []byte) error {
	lo, hi, isRange := strings.Cut(string(b), "-")
	min, err := parseID(lo)
	if err != nil {
		return fmt.Errorf("id range %q: %w", b, err)
	}
	max := min
	if isRange {
		if max, err = parseID(hi); err != nil {
			return fmt.Errorf("id range %q: %w", b, err)
		}
	}
	if min > max {
		return fmt.Errorf("id range %q: empty", b)
	}
	r.Min, r.Max = min, max
	return nil
}

// IDRanges is a set of ids.
type IDRanges []IDRange

// Contains reports whether id is in one of the ranges.
func (rs IDRanges) Contains(id uint32) bool {
	for _, r := range rs {
		if id >= r.Min && id <= r.Max {
			return true
		}
	}
	return false
}

func (rs IDRanges) String() string {
	if len(rs) == 0 {
		return "none"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}

// NonRootIDs is what a role's allowUsers and allowGroups default to: every
// id but root's (and 4294967295, which means "unset" to the kernel).
var NonRootIDs = IDRanges{{Min: 1, Max: math.MaxUint32 - 1}}

// parseIDRanges reads allowUsers or allowGroups: ids ("1000") and ranges
// ("1000-1999"). Unset is NonRootIDs; an empty list allows no id but the
// role's own.
func parseIDRanges(field string, in []string) (IDRanges, error) {
	if in == nil {
		return append(IDRanges(nil), NonRootIDs...), nil
	}
	out := IDRanges{}
	var errs []error
	for i, s := range in {
		lo, hi, isRange := strings.Cut(s, "-")
		min, err1 := parseID(lo)
		max, err2 := min, error(nil)
		if isRange {
			max, err2 = parseID(hi)
		}
		switch {
		case err1 != nil || err2 != nil:
			errs = append(errs, ferr(fmt.Sprintf("%s[%d]", field, i), "%q is not an id or a range of ids (1000, 1000-1999; at most 4294967294)", s))
		case min > max:
			errs = append(errs, ferr(fmt.Sprintf("%s[%d]", field, i), "%q: the range is empty (%d > %d)", s, min, max))
		default:
			out = append(out, IDRange{Min: min, Max: max})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Min < out[j].Min })
	return out, errors.Join(errs...)
}

func parseID(s string) (uint32, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a number")
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v == math.MaxUint32 {
		return 0, fmt.Errorf("out of range")
	}
	return uint32(v), nil
}

func (p *Profile) userAllowed(uid uint32) bool {
	return uid == p.Process.RunAsUser || p.Process.AllowUsers.Contains(uid)
}

func (p *Profile) groupAllowed(gid uint32) bool {
	return gid == p.Process.RunAsGroup || p.Process.AllowGroups.Contains(gid)
}

// boundUser bounds the process's identity by the role.
//
// uid 0 and gid 0 are what the spec holds when nobody asked (the image
// sets no user, or containerd finds no group for the user), so they cannot
// be told from a pod asking for root: under a role that does not allow
// root they mean "nothing asked" and get the role's runAsUser and
// runAsGroup. Every other id is a request (the pod's or the image's) and
// is kept if the role allows it, refused if not.
//
// Supplemental groups (additionalGids) follow the same rule, except that
// when the user was replaced, all of them go: they are then root's groups
// in the image's /etc/group, merged by containerd with the pod's own, and
// cannot be told apart.
func (p *Profile) boundUser(u specs.User) (specs.User, string, error) {
	out := specs.User{UID: u.UID, GID: u.GID, Umask: u.Umask}
	if !p.userAllowed(u.UID) {
		if u.UID != 0 {
			return u, "", errkind.PermissionDenied(fmt.Errorf("process.user.uid: uid %d is not allowed by role %q (process.allowUsers: %s; runAsUser %d)", u.UID, p.Role, p.Process.AllowUsers, p.Process.RunAsUser))
		}
		out = specs.User{UID: p.Process.RunAsUser, GID: p.Process.RunAsGroup, Umask: u.Umask}
		return out, fmt.Sprintf("user: uid %d gid %d (the role's: the spec named root, which the role does not allow)", out.UID, out.GID), nil
	}
	note := fmt.Sprintf("user: uid %d", out.UID)
	switch {
	case p.groupAllowed(u.GID):
		note += fmt.Sprintf(" gid %d", out.GID)
	case u.GID == 0:
		out.GID = p.Process.RunAsGroup
		note += fmt.Sprintf(" gid %d (the role's: the spec named group root, which the role does not allow)", out.GID)
	default:
		return u, "", errkind.PermissionDenied(fmt.Errorf("process.user.gid: gid %d is not allowed by role %q (process.allowGroups: %s; runAsGroup %d)", u.GID, p.Role, p.Process.AllowGroups, p.Process.RunAsGroup))
	}
	var dropped []uint32
	for i, g := range u.AdditionalGids {
		switch {
		case p.groupAllowed(g):
			out.AdditionalGids = append(out.AdditionalGids, g)
		case g == 0:
			dropped = append(dropped, g)
		default:
			return u, "", errkind.PermissionDenied(fmt.Errorf("process.user.additionalGids[%d]: gid %d is not allowed by role %q (process.allowGroups: %s; runAsGroup %d)", i, g, p.Role, p.Process.AllowGroups, p.Process.RunAsGroup))
		}
	}
	if len(out.AdditionalGids) > 0 {
		note += fmt.Sprintf(" groups %v", out.AdditionalGids)
	}
	if len(dropped) > 0 {
		note += " (group root dropped)"
	}
	return out, note, nil
}

// RuntimeDefaultCapabilities is the set containerd gives a container that
// asks for no capabilities (the CRI's and ctr's default, pkg/oci's
// defaultUnixCaps). A capability in it cannot be told from a request.
var RuntimeDefaultCapabilities = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP",
	"CAP_SETUID", "CAP_SYS_CHROOT",
}

// boundCapabilities intersects the capabilities the spec asks for (every
// set) with the role's. A capability outside the role is dropped if it is
// one of the runtime's defaults (nothing tells a default from a request)
// and refused otherwise: only a request adds it. What is kept is put in all
// five sets, ambient included, so that a non-root agent holds it too.
func (p *Profile) boundCapabilities(c *specs.LinuxCapabilities) (*specs.LinuxCapabilities, string, error) {
	asked := map[string]bool{}
	if c != nil {
		for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
			for _, name := range set {
				asked[name] = true
			}
		}
	}
	granted, deflt := map[string]bool{}, map[string]bool{}
	for _, name := range p.Process.Capabilities {
		granted[name] = true
	}
	for _, name := range RuntimeDefaultCapabilities {
		deflt[name] = true
	}
	var kept, dropped, refused []string
	for name := range asked {
		switch {
		case granted[name]:
			kept = append(kept, name)
		case deflt[name]:
			dropped = append(dropped, name)
		default:
			refused = append(refused, name)
		}
	}
	sort.Strings(kept)
	sort.Strings(dropped)
	sort.Strings(refused)
	if len(refused) > 0 {
		return nil, "", errkind.PermissionDenied(fmt.Errorf("process.capabilities: %s not granted by role %q (process.capabilities: %v)", strings.Join(refused, ", "), p.Role, p.Process.Capabilities))
	}
	if kept == nil {
		kept = []string{}
	}
	set := func() []string { return append([]string(nil), kept...) }
	out := &specs.LinuxCapabilities{Bounding: set(), Effective: set(), Permitted: set(), Inheritable: set(), Ambient: set()}
	note := fmt.Sprintf("capabilities %v", kept)
	if len(dropped) > 0 {
		note += fmt.Sprintf(" (runtime defaults outside the role dropped: %v)", dropped)
	}
	return out, note, nil
}

// boundRlimits sets each limit the role has to the lower of the role's and
// the spec's (soft and hard alike).
func (p *Profile) boundRlimits(rl []specs.POSIXRlimit) []specs.POSIXRlimit {
	rl = lowerRlimit(rl, "RLIMIT_NPROC", uint64(p.Process.MaxProcesses))
	rl = lowerRlimit(rl, "RLIMIT_NOFILE", uint64(p.Limits.OpenFiles))
	if p.Limits.CPUTimeSeconds > 0 {
		rl = lowerRlimit(rl, "RLIMIT_CPU", uint64(p.Limits.CPUTimeSeconds))
	}
	return rl
}

func lowerRlimit(rl []specs.POSIXRlimit, typ string, v uint64) []specs.POSIXRlimit {
	soft, hard := v, v
	out := rl[:0:0]
	for _, r := range rl {
		if r.Type != typ {
			out = append(out, r)
			continue
		}
		hard = min(hard, r.Hard)
		soft = min(soft, r.Soft, hard)
	}
	return append(out, specs.POSIXRlimit{Type: typ, Hard: hard, Soft: soft})
}

// boundNoNewPrivileges: no_new_privs is on unless the role allows
// privilege escalation; then the spec's choice stands (false is also the
// CRI's default, so under such a role a pod that says nothing can
// escalate through setuid files).
func (p *Profile) boundNoNewPrivileges(nnp bool) bool {
	return nnp || !p.Process.AllowPrivilegeEscalation
}

// boundRootReadonly: a read-only role keeps the image read-only; an
// overlay role keeps a read-only root a container asks for (false is the
// default, and gets the overlay).
func (p *Profile) boundRootReadonly(readonly bool) bool {
	return readonly || p.Filesystem.Rootfs == RootfsReadOnly
}

// BoundUpdate checks a running container's resource update against the
// role: the CRI's UpdateContainerResources (a pod's in-place resize, which
// its author asks for) or ctr task update. A memory or CPU limit above the
// role's, or none where the role has one, is refused with the field named:
// the role is the ceiling after the start as at it. A limit set through
// the cgroup's own files (unified) where the role has one is refused too.
func (p *Profile) BoundUpdate(r *specs.LinuxResources) error {
	if r == nil {
		return nil
	}
	var errs []error
	if m := p.Limits.MemoryBytes; m > 0 && r.Memory != nil && r.Memory.Limit != nil {
		if l := *r.Memory.Limit; l <= 0 || l > m {
			errs = append(errs, fmt.Errorf("linux.resources.memory.limit %d: role %q allows at most %d bytes", l, p.Role, m))
		}
	}
	if c := p.Limits.CPUMillis; c > 0 && r.CPU != nil && (r.CPU.Quota != nil || r.CPU.Period != nil) {
		period := uint64(100000)
		if r.CPU.Period != nil && *r.CPU.Period > 0 {
			period = *r.CPU.Period
		}
		switch {
		case r.CPU.Quota == nil || *r.CPU.Quota <= 0:
			errs = append(errs, fmt.Errorf("linux.resources.cpu.quota: no CPU limit, and role %q allows at most %dm", p.Role, c))
		case float64(*r.CPU.Quota)/float64(period)*1000 > float64(c):
			errs = append(errs, fmt.Errorf("linux.resources.cpu: quota %d per period %d is %dm, and role %q allows at most %dm",
				*r.CPU.Quota, period, int64(math.Ceil(float64(*r.CPU.Quota)*1000/float64(period))), p.Role, c))
		}
	}
	for _, k := range sortedUnified(r.Unified) {
		if (p.Limits.MemoryBytes > 0 && strings.HasPrefix(k, "memory.")) || (p.Limits.CPUMillis > 0 && strings.HasPrefix(k, "cpu.")) {
			errs = append(errs, fmt.Errorf("linux.resources.unified[%s]: role %q limits it; set it through linux.resources.memory or .cpu", k, p.Role))
		}
	}
	if len(errs) > 0 {
		return errkind.PermissionDenied(errors.Join(errs...))
	}
	return nil
}

func sortedUnified(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
