package policy

import (
	"fmt"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The baseline syscall policy: what every role denies unless it allows a
// class by name (process.allowSyscalls). It follows Moby's default seccomp
// profile (the syscalls it grants only with CAP_SYS_ADMIN and friends, which
// no agent holds), tightened for agents: no new namespaces, no mounts, no
// memfd. gVisor enforces it inside the sandbox (runsc --oci-seccomp), below
// the agent; a filter installed there is inherited by every child and cannot
// be removed.
//
// What gVisor can and cannot enforce here:
//   - clone's flags are a plain argument: clone with any CLONE_NEW* flag is
//     denied by an argument filter;
//   - clone3 takes its flags in memory a filter cannot read, so clone3
//     answers ENOSYS and libc falls back to clone (glibc does so only on
//     ENOSYS). runsc honours errnoRet with hack/patches/runsc-seccomp-errnoret.patch;
//   - exec of a memfd (/proc/self/fd/N, execveat AT_EMPTY_PATH) cannot be
//     told from another exec by a filter, so memfd_create itself is denied.
//     Every other place an agent can write is mounted noexec.

// SyscallClass is one named group of the baseline syscall policy.
type SyscallClass struct {
	Name string `json:"name"`
	Why  string `json:"why"`
	// Syscalls fail with EPERM.
	Syscalls []string `json:"syscalls"`
	// CloneNamespaces: clone with a CLONE_NEW* flag fails with EPERM and
	// clone3 with ENOSYS.
	CloneNamespaces bool `json:"cloneNamespaces,omitempty"`
}

// BaselineSyscalls is the baseline syscall policy, class by class.
var BaselineSyscalls = []SyscallClass{
	{Name: "namespaces", Why: "a new user namespace gives its first process every capability inside it (mounts, then exec from them)",
		Syscalls: []string{"setns", "unshare"}, CloneNamespaces: true},
	{Name: "mount", Why: "mounting a filesystem makes a writable place executable or hides the role's view",
		Syscalls: []string{"fsconfig", "fsmount", "fsopen", "fspick", "mount", "mount_setattr", "move_mount", "open_tree", "pivot_root", "umount2"}},
	{Name: "ptrace", Why: "reading or steering another process of the sandbox",
		Syscalls: []string{"kcmp", "process_vm_readv", "process_vm_writev", "ptrace"}},
	{Name: "bpf", Why: "loading programs into the (user-space) kernel", Syscalls: []string{"bpf"}},
	{Name: "keyring", Why: "kernel keyrings hold credentials", Syscalls: []string{"add_key", "keyctl", "request_key"}},
	{Name: "userfaultfd", Why: "a classic exploit primitive", Syscalls: []string{"userfaultfd"}},
	{Name: "perf", Why: "performance counters leak timing", Syscalls: []string{"perf_event_open"}},
	{Name: "memfd", Why: "an anonymous in-memory file can be executed (/proc/self/fd/N): code the agent wrote would run",
		Syscalls: []string{"memfd_create", "memfd_secret"}},
	// syslog stays allowed: Moby denies it for the host's kernel log, but
	// under gVisor it reads the Sentry's own boot messages (dmesg shows
	// "Starting gVisor...").
	{Name: "kernel", Why: "modules, clocks, reboot, swap, accounting, handles and raw I/O are the host's business",
		Syscalls: []string{"acct", "adjtimex", "clock_adjtime", "clock_settime", "delete_module", "fanotify_init", "finit_module",
			"init_module", "ioperm", "iopl", "kexec_file_load", "kexec_load", "lookup_dcookie", "name_to_handle_at",
			"open_by_handle_at", "personality", "quotactl", "reboot", "settimeofday", "swapoff", "swapon", "vhangup"}},
}

// Clone flags that create namespaces (CLONE_NEWTIME is clone3/unshare
// only: in clone's flags its bit is part of the exit signal).
var cloneNamespaceFlags = []struct {
	name string
	bit  uint64
}{
	{"CLONE_NEWNS", 0x00020000}, {"CLONE_NEWCGROUP", 0x02000000}, {"CLONE_NEWUTS", 0x04000000},
	{"CLONE_NEWIPC", 0x08000000}, {"CLONE_NEWUSER", 0x10000000}, {"CLONE_NEWPID", 0x20000000},
	{"CLONE_NEWNET", 0x40000000},
}

const (
	errnoEPERM  = 1
	errnoENOSYS = 38
)

func syscallClass(name string) *SyscallClass {
	for i := range BaselineSyscalls {
		if BaselineSyscalls[i].Name == name {
			return &BaselineSyscalls[i]
		}
	}
	return nil
}

func syscallClassNames() []string {
	var out []string
	for _, c := range BaselineSyscalls {
		out = append(out, c.Name)
	}
	return out
}

// SyscallPolicy is what a profile denies: the baseline classes it does not
// allow, and the role's own denials.
type SyscallPolicy struct {
	// Denied fail with EPERM (sorted).
	Denied []string `json:"denied"`
	// CloneNamespaces: clone with CLONE_NEW* flags fails, clone3 answers
	// ENOSYS.
	CloneNamespaces bool `json:"cloneNamespaces"`
	// DeniedClasses and AllowedClasses name the baseline classes.
	DeniedClasses  []string `json:"deniedClasses"`
	AllowedClasses []string `json:"allowedClasses"`
}

// Syscalls returns the profile's syscall policy.
func (p *Profile) Syscalls() SyscallPolicy {
	allowed := map[string]bool{}
	for _, c := range p.Process.AllowSyscalls {
		allowed[c] = true
	}
	sp := SyscallPolicy{DeniedClasses: []string{}, AllowedClasses: []string{}}
	deny := map[string]bool{}
	for _, c := range BaselineSyscalls {
		if allowed[c.Name] {
			sp.AllowedClasses = append(sp.AllowedClasses, c.Name)
			continue
		}
		sp.DeniedClasses = append(sp.DeniedClasses, c.Name)
		for _, n := range c.Syscalls {
			deny[n] = true
		}
		sp.CloneNamespaces = sp.CloneNamespaces || c.CloneNamespaces
	}
	for _, n := range p.Process.DeniedSyscalls {
		deny[n] = true
	}
	sp.Denied = make([]string, 0, len(deny))
	for n := range deny {
		sp.Denied = append(sp.Denied, n)
	}
	sort.Strings(sp.Denied)
	return sp
}

// SeccompRules renders the policy as OCI seccomp rules, to be evaluated
// before any other rule (runsc and libseccomp use the first rule that
// matches).
func (sp SyscallPolicy) SeccompRules() []specs.LinuxSyscall {
	eperm, enosys := uint(errnoEPERM), uint(errnoENOSYS)
	var rules []specs.LinuxSyscall
	if len(sp.Denied) > 0 {
		rules = append(rules, specs.LinuxSyscall{Names: sp.Denied, Action: specs.ActErrno, ErrnoRet: &eperm})
	}
	if sp.CloneNamespaces {
		// One rule per flag: several conditions on one argument are an OR
		// in runsc but an AND in libseccomp; one each means the same in both.
		for _, f := range cloneNamespaceFlags {
			rules = append(rules, specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: f.bit, ValueTwo: f.bit, Op: specs.OpMaskedEqual}}})
		}
		rules = append(rules, specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys})
	}
	return rules
}

// rewriteSeccomp puts the profile's syscall policy in front of the spec's
// seccomp profile (creating an allow-by-default one): a pod's own profile
// still applies, and can only deny more.
func (p *Profile) rewriteSeccomp(s *specs.Spec) (string, error) {
	sp := p.Syscalls()
	ours := sp.SeccompRules()
	if len(ours) == 0 {
		return "", nil
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Seccomp == nil {
		s.Linux.Seccomp = &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		}
	}
	// A syscall the policy denies outright is taken out of the spec's own
	// rules; clone keeps them (they come after ours and only see what ours
	// let through).
	deny := map[string]bool{"clone3": sp.CloneNamespaces}
	for _, n := range sp.Denied {
		deny[n] = true
	}
	rules := ours
	for _, sc := range s.Linux.Seccomp.Syscalls {
		var names []string
		for _, n := range sc.Names {
			if !deny[n] {
				names = append(names, n)
			}
		}
		if len(names) > 0 {
			sc.Names = names
			rules = append(rules, sc)
		}
	}
	s.Linux.Seccomp.Syscalls = rules
	msg := fmt.Sprintf("seccomp: deny classes %v", sp.DeniedClasses)
	if extra := p.Process.DeniedSyscalls; len(extra) > 0 {
		msg += fmt.Sprintf(" and %v", extra)
	}
	if len(sp.AllowedClasses) > 0 {
		msg += fmt.Sprintf("; role allows %v", sp.AllowedClasses)
	}
	if sp.CloneNamespaces {
		msg += "; clone with CLONE_NEW* flags EPERM, clone3 ENOSYS"
	}
	return msg, nil
}

// String is a one-line summary.
func (sp SyscallPolicy) String() string {
	s := fmt.Sprintf("denied classes %s (%d syscalls EPERM)", strings.Join(sp.DeniedClasses, ", "), len(sp.Denied))
	if sp.CloneNamespaces {
		s += "; clone with CLONE_NEW* flags EPERM, clone3 ENOSYS"
	}
	return s
}
