// Package tighten decides what a role's new version may change in a
// sandbox that already runs under it, and what a restore may take: a
// running sandbox takes whatever tightens it at once and nothing that
// loosens it; a checkpoint is restored only under a role as tight as the
// one it was taken under. Pure: the shim applies what it decides.
package tighten

import (
	"encoding/json"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// Running is what a sandbox runs under now.
type Running struct {
	// Profile is the profile it started with.
	Profile *policy.Profile
	// Plan is its egress now (its role's, or narrowed since; nil: none).
	Plan *netpolicy.Plan
	// MemoryBytes and CPUMillis are its cgroup's limits now (0: none).
	MemoryBytes, CPUMillis int64
}

// Change is what a role's new version does to a running sandbox.
type Change struct {
	// Plan is the egress it runs under after (the narrowing of its
	// current plan by the new one).
	Plan *netpolicy.Plan
	// Resources is the cgroup update that lowers its limits (nil: none).
	Resources *specs.LinuxResources
	// Applied says what tightens it now; Pending what does not apply to
	// it (what loosens, and what a running sandbox cannot take: those
	// apply to new sandboxes).
	Applied, Pending []string
}

// Tightens reports whether the change applies anything.
func (c Change) Tightens() bool { return len(c.Applied) > 0 }

// Diff is what next, a role's new version, changes in a sandbox running
// as cur.
func Diff(cur Running, next *policy.Profile) (Change, error) {
	nextPlan, err := netpolicy.Compile(next)
	if err != nil {
		return Change{}, fmt.Errorf("the role's new egress does not compile: %w", err)
	}
	plan := cur.Plan
	if plan == nil {
		plan = &netpolicy.Plan{}
	}
	var c Change
	c.Plan, c.Applied, c.Pending = netpolicy.Narrow(plan, nextPlan)
	for _, part := range Unchangeable(cur.Profile, next) {
		c.Pending = append(c.Pending, part+": applies to new sandboxes")
	}
	res, applied, pending := LowerLimits(cur.MemoryBytes, cur.CPUMillis, cur.Profile.Limits, next.Limits)
	c.Resources, c.Applied, c.Pending = res, append(c.Applied, applied...), append(c.Pending, pending...)
	return c, nil
}

// Unchangeable names the parts of two profiles, other than egress and the
// memory and CPU limits, that differ: a running sandbox cannot take them
// (a role's new version's apply to new sandboxes only), and a restore
// refuses them. A part that cannot be compared is named as differing.
func Unchangeable(cur, next *policy.Profile) []string {
	var out []string
	for _, part := range []struct {
		name      string
		cur, next any
	}{
		{"filesystem", cur.Filesystem, next.Filesystem},
		{"process (user, capabilities, syscalls, maxProcesses)", cur.Process, next.Process},
		{"credentials", cur.Credentials, next.Credentials},
		{"limits (wall clock, CPU time, open files)", []any{cur.Limits.WallClock, cur.Limits.CPUTimeSeconds, cur.Limits.OpenFiles},
			[]any{next.Limits.WallClock, next.Limits.CPUTimeSeconds, next.Limits.OpenFiles}},
		{"audit", cur.Audit, next.Audit},
		// Its listeners are the pod's, opened at its start.
		{"network.portForward", cur.Network.PortForward, next.Network.PortForward},
	} {
		// Compared as the checkpoint manifest keeps a profile (JSON), so
		// a profile read back from one compares equal to itself.
		a, errA := json.Marshal(part.cur)
		b, errB := json.Marshal(part.next)
		switch {
		case errA != nil || errB != nil:
			out = append(out, fmt.Sprintf("%s (cannot be compared: %v)", part.name, firstErr(errA, errB)))
		case string(a) != string(b):
			out = append(out, part.name)
		}
	}
	return out
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// LowerLimits is the cgroup update that takes a running sandbox's memory
// and CPU limits (memory, cpuMillis: what its cgroup has; 0 none) down to
// its role's new version's where that is lower (nil: none), what it
// applies, and what it does not: a role's higher limit loosens. A role
// limit that did not change changes nothing (the pod may have asked for
// less).
func LowerLimits(memory, cpuMillis int64, old, next policy.LimitsProfile) (*specs.LinuxResources, []string, []string) {
	var res *specs.LinuxResources
	var applied, pending []string
	if m := next.MemoryBytes; m != old.MemoryBytes {
		if m > 0 && (memory == 0 || m < memory) {
			res = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &m}}
			applied = append(applied, fmt.Sprintf("memory limit %d -> %d bytes", memory, m))
		} else if m == 0 || m > old.MemoryBytes {
			pending = append(pending, fmt.Sprintf("memory limit %d -> %d bytes (loosens)", old.MemoryBytes, m))
		}
	}
	if c := next.CPUMillis; c != old.CPUMillis {
		if c > 0 && (cpuMillis == 0 || c < cpuMillis) {
			if res == nil {
				res = &specs.LinuxResources{}
			}
			quota, period := c*100, uint64(100000)
			res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
			applied = append(applied, fmt.Sprintf("cpu limit %dm -> %dm", cpuMillis, c))
		} else if c == 0 || c > old.CPUMillis {
			pending = append(pending, fmt.Sprintf("cpu limit %dm -> %dm (loosens)", old.CPUMillis, c))
		}
	}
	return res, applied, pending
}

// LooserThan lists how profile now would be looser than was, whose egress
// (as the sandbox ran, narrowed live perhaps) was wasEgress: a checkpoint
// taken under was is restored under now only if the list is empty.
func LooserThan(was *policy.Profile, wasEgress *netpolicy.Plan, now *policy.Profile) []string {
	nowPlan, err := netpolicy.Compile(now)
	if err != nil {
		return []string{"egress: " + err.Error()}
	}
	_, _, pending := netpolicy.Narrow(wasEgress, nowPlan)
	var out []string
	for _, p := range pending {
		out = append(out, "egress: "+p)
	}
	for _, part := range Unchangeable(was, now) {
		out = append(out, part+" differs")
	}
	_, _, lim := LowerLimits(was.Limits.MemoryBytes, was.Limits.CPUMillis, was.Limits, now.Limits)
	return append(out, lim...)
}
