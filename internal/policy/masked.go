package policy

// Masked paths. runsc never reads linux.maskedPaths (nor readonlyPaths),
// so the shim masks them itself, the way runc does: a read-only empty
// tmpfs over a directory, an empty read-only file over anything else. What
// a path is (and whether it exists at all) is read from where the container
// will see it at start: gVisor's own /proc and /sys (a table, checked
// against the pinned gVisor by the e2e suite), the source of the bind mount
// it lies under, or the image's layers, whose symlinks are followed inside
// the container to wherever they lead (gVisor resolves the mount's
// destination the same way). A path that is absent at start is not masked
// (as with runc), and the spec change says so.

import (
	"fmt"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/errkind"
)

// PathKind is what a path is in a container's filesystem at start.
type PathKind int

const (
	PathAbsent PathKind = iota
	PathFile            // anything but a directory
	PathDir
)

func (k PathKind) String() string {
	return [...]string{"absent", "file", "dir"}[k]
}

// gvisorPaths is what the pinned gVisor's sandbox has at the paths
// runtimes mask or make read-only (the OCI and CRI defaults, and
// baseline's /proc/kallsyms). TestMaskedPathsGVisorTable checks every
// entry inside a sandbox. Another path under /proc or /sys cannot be
// masked: what it is there is not known before the sandbox runs.
var gvisorPaths = map[string]PathKind{
	"/proc/acpi":                    PathAbsent,
	"/proc/interrupts":              PathAbsent,
	"/proc/asound":                  PathAbsent,
	"/proc/kcore":                   PathAbsent,
	"/proc/keys":                    PathAbsent,
	"/proc/latency_stats":           PathAbsent,
	"/proc/timer_list":              PathAbsent,
	"/proc/timer_stats":             PathAbsent,
	"/proc/sched_debug":             PathAbsent,
	"/proc/scsi":                    PathAbsent,
	"/proc/kallsyms":                PathAbsent,
	"/sys/devices/virtual/powercap": PathAbsent,
	"/proc/bus":                     PathDir,
	"/proc/fs":                      PathDir,
	"/proc/irq":                     PathDir,
	"/proc/sys":                     PathDir,
	"/proc/sysrq-trigger":           PathFile,
	"/sys/firmware":                 PathDir,
}

// cpuThrottle is containerd 2.3+'s per-CPU masked path (for each CPU the
// host has it on): gVisor's CPUs have no thermal_throttle.
var cpuThrottle = lazy(`^/sys/devices/system/cpu/cpu[0-9]+/thermal_throttle$`)

// GVisorPaths lists the paths gvisorPaths knows, and one of cpuThrottle's.
func GVisorPaths() []string {
	ps := []string{"/sys/devices/system/cpu/cpu0/thermal_throttle"}
	for p := range gvisorPaths {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// GVisorPathKind is what gVisor's sandbox has at p (under /proc or /sys);
// ok is false for a path the table does not know.
func GVisorPathKind(p string) (kind PathKind, ok bool) {
	if cpuThrottle.MatchString(p) {
		return PathAbsent, true
	}
	kind, ok = gvisorPaths[p]
	return kind, ok
}

func gvisorKind(p string) (PathKind, error) {
	if k, ok := GVisorPathKind(p); ok {
		return k, nil
	}
	return 0, fmt.Errorf("%s is in gVisor's own /proc or /sys, where agentbox can mask only %s", p, strings.Join(GVisorPaths(), ", "))
}

// inGVisorFS says p is in a filesystem gVisor makes itself.
func inGVisorFS(p string) bool { return under(p, "/proc") || under(p, "/sys") }

// maskPaths turns the spec's masked paths (the runtime's and the role's)
// into mounts, appended after every other mount so that they cover them.
// env.Kind == nil (policy explain) leaves them listed.
func maskPaths(s *specs.Spec, env MountEnv) (string, error) {
	if s.Linux == nil || len(s.Linux.MaskedPaths) == 0 || env.Kind == nil {
		return "", nil
	}
	var masked, absent []string
	var added []specs.Mount
	for i, p := range s.Linux.MaskedPaths {
		if !isClean(p) || p == "/" {
			return "", errkind.InvalidArgument(fmt.Errorf("linux.maskedPaths[%d]: %q is not a clean absolute path below /", i, p))
		}
		kind, err := maskedKind(s.Mounts, p, env)
		if err != nil {
			return "", errkind.FailedPrecondition(fmt.Errorf("masked path %s: %w", p, err))
		}
		switch kind {
		case PathAbsent:
			absent = append(absent, p)
			continue
		case PathDir:
			added = append(added, specs.Mount{Destination: p, Type: "tmpfs", Source: "tmpfs",
				Options: []string{"ro", "nosuid", "nodev", "noexec", "mode=0555"}})
		case PathFile:
			if env.MaskFile == "" {
				return "", fmt.Errorf("masked path %s: no empty file to mask it with", p)
			}
			added = append(added, specs.Mount{Destination: p, Type: "bind", Source: env.MaskFile,
				Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
		}
		masked = append(masked, fmt.Sprintf("%s (%s)", p, kind))
	}
	s.Mounts = append(s.Mounts, added...)
	// Converted: nothing is left for a runtime that would read them.
	s.Linux.MaskedPaths = nil
	msg := fmt.Sprintf("masked %v", masked)
	if len(absent) > 0 {
		msg += fmt.Sprintf("; absent at start, not masked: %v", absent)
	}
	return msg, nil
}

// maskedKind is what p is at start: gVisor's, the covering mount's (the
// deepest mount whose destination holds p), or the image's, following the
// image's symlinks inside the container to wherever they lead.
func maskedKind(mounts []specs.Mount, p string, env MountEnv) (PathKind, error) {
	for hops := 0; hops <= 40; hops++ {
		cover := coveringMount(mounts, p)
		switch {
		case cover == nil || cover.Destination == "/":
			if inGVisorFS(p) {
				return gvisorKind(p)
			}
		case cover.Destination == "/proc" || cover.Destination == "/sys":
			return gvisorKind(p)
		case p == cover.Destination:
			if isBind(*cover) {
				k, _, err := env.Kind(cover.Source, "")
				return k, err
			}
			return PathDir, nil
		case isBind(*cover):
			k, _, err := env.Kind(cover.Source, rel(p, cover.Destination))
			return k, err
		default:
			// A fresh filesystem (tmpfs, mqueue, ...): empty at start.
			return PathAbsent, nil
		}
		kind, next, err := env.Kind("", strings.TrimPrefix(p, "/"))
		if err != nil || next == "" {
			return kind, err
		}
		p = next
	}
	return 0, fmt.Errorf("too many levels of symlinks in the image")
}

// coveringMount is the deepest mount whose destination holds p (nil: the
// root filesystem's).
func coveringMount(mounts []specs.Mount, p string) *specs.Mount {
	var cover *specs.Mount
	for i := range mounts {
		m := &mounts[i]
		if under(p, m.Destination) && (cover == nil || len(m.Destination) > len(cover.Destination)) {
			cover = m
		}
	}
	return cover
}

// readonlyPaths checks the spec's read-only paths, which runsc ignores
// too. In gVisor's own /proc and /sys they are gVisor's files: the few it
// lets root write (a handful under /proc/sys) change only the sandbox's
// kernel, never the host's. Anywhere else a path must already be
// read-only (under a read-only root or mount, which the role's
// rootfs: read-only gives the image); a path in a writable place cannot be
// made read-only without a source outside the sandbox to bind, so the
// container is refused rather than left writable.
func readonlyPaths(s *specs.Spec) (string, error) {
	if s.Linux == nil || len(s.Linux.ReadonlyPaths) == 0 {
		return "", nil
	}
	var gvisor, covered []string
	for i, p := range s.Linux.ReadonlyPaths {
		if !isClean(p) {
			return "", errkind.InvalidArgument(fmt.Errorf("linux.readonlyPaths[%d]: %q is not a clean absolute path", i, p))
		}
		cover := coveringMount(s.Mounts, p)
		switch {
		case inGVisorFS(p) && (cover == nil || cover.Destination == "/proc" || cover.Destination == "/sys"):
			gvisor = append(gvisor, p)
		case cover == nil || cover.Destination == "/":
			if s.Root == nil || !s.Root.Readonly {
				return "", errkind.FailedPrecondition(fmt.Errorf("linux.readonlyPaths[%d]: %s is in a writable root filesystem (the role's rootfs is not read-only): agentbox cannot make it read-only", i, p))
			}
			covered = append(covered, p+" (read-only root)")
		case hasOption(cover.Options, "ro"):
			covered = append(covered, fmt.Sprintf("%s (read-only mount %s)", p, cover.Destination))
		default:
			return "", errkind.FailedPrecondition(fmt.Errorf("linux.readonlyPaths[%d]: %s is in the writable mount %s: agentbox cannot make it read-only", i, p, cover.Destination))
		}
	}
	s.Linux.ReadonlyPaths = nil
	msg := fmt.Sprintf("read-only paths in gVisor's /proc and /sys (gVisor's own; writes stay in the sandbox): %v", gvisor)
	if len(covered) > 0 {
		msg += fmt.Sprintf("; already read-only: %v", covered)
	}
	return msg, nil
}
