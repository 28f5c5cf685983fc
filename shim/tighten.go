package shim

// Live tightening: when a running sandbox's role changes (the node's policy
// files, which `agentbox sync` also writes from the cluster's objects), the
// sandbox takes whatever tightens its egress at once, and nothing that
// loosens it; what cannot change under a running sandbox applies to new
// ones. Each change is recorded in the sandbox's trail.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// policyPoll is how often a shim looks for a changed policy directory
// (a stat of its files; parsed only when one changed).
const policyPoll = time.Second

// watchPolicies starts, once per shim, following the policy directory of
// the config its first sandbox was created under.
func (s *service) watchPolicies(cfg *config.Config) {
	s.watchOnce.Do(func() {
		go func() {
			var last *policy.Set
			var lastErr string
			for {
				time.Sleep(policyPoll)
				set, err := s.policies.Load(cfg.Policy.Dir)
				if err != nil {
					// A directory that does not load changes nothing that
					// runs; the next Create is refused with the reason.
					if err.Error() != lastErr {
						log.L.WithError(err).Warn("agentbox: the policy directory does not load: running sandboxes keep their profiles")
						lastErr = err.Error()
					}
					continue
				}
				lastErr = ""
				if set == last {
					continue
				}
				last = set
				for _, sb := range s.sandboxes.all() {
					s.retighten(context.Background(), sb, set)
				}
			}
		}()
	})
}

// retighten applies to a running sandbox what its role's version in set
// tightens, and records what it does not apply.
func (s *service) retighten(ctx context.Context, sb *sandboxState, set *policy.Set) {
	if sb.profile == nil {
		return
	}
	ctx = log.WithLogger(ctx, log.L.WithField("sandbox_id", sb.id))
	sb.resp.applying.Lock()
	defer sb.resp.applying.Unlock()
	next, err := set.Select(sb.request)
	sb.resp.mu.Lock()
	seen, live := sb.resp.seen, sb.liveDigestLocked()
	sb.resp.mu.Unlock()
	if err != nil {
		// The role no longer selects for this sandbox: what it runs under
		// stays, and the trail says so once.
		if seen != "refused: "+err.Error() {
			sb.resp.mu.Lock()
			sb.resp.seen = "refused: " + err.Error()
			sb.resp.mu.Unlock()
			sb.audit.trail.Emit(audit.TypePolicyPending.New("Failure",
				"the role's new version does not select for this sandbox ("+err.Error()+"): it keeps its profile; new sandboxes are refused",
				map[string]string{"error": err.Error(), "live_digest": live}), true)
		}
		return
	}
	if next.Digest == seen || (seen == "" && next.Digest == live) {
		return
	}
	sb.resp.mu.Lock()
	sb.resp.seen = next.Digest
	sb.resp.mu.Unlock()
	nextPlan, err := netpolicy.Compile(next)
	if err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: the role's new egress does not compile")
		return
	}
	cur := sb.live.Load()
	if cur == nil {
		cur = &netpolicy.Plan{}
	}
	livePlan, applied, pending := netpolicy.Narrow(cur, nextPlan)
	for _, part := range unchangeable(sb.profile, next) {
		pending = append(pending, part+": applies to new sandboxes")
	}
	res, limApplied, limPending := lowerLimits(sb.memoryLimit, sb.cpuMillis, sb.profile.Limits, next.Limits)
	applied, pending = append(applied, limApplied...), append(pending, limPending...)
	detail := map[string]string{"start_digest": sb.profile.Digest, "previous_digest": live, "new_digest": next.Digest,
		"applied": strings.Join(applied, "; "), "pending": strings.Join(pending, "; ")}
	if len(applied) == 0 {
		if len(pending) > 0 {
			sb.audit.trail.Emit(audit.TypePolicyPending.New("Success",
				fmt.Sprintf("role %s changed (%s): nothing tightens this sandbox; for new sandboxes only: %s", next.Role, short(next.Digest), detail["pending"]), detail), true)
		}
		return
	}
	start := time.Now()
	closed, err := s.loadLive(sb, livePlan)
	if err == nil && res != nil {
		err = s.updateLimits(ctx, sb, res)
	}
	if err != nil {
		fallback, ferr := s.failClosed(ctx, sb)
		detail["error"], detail["fallback"] = err.Error(), fallback
		if ferr != nil {
			detail["fallback_error"] = ferr.Error()
		}
		sb.audit.trail.Emit(audit.TypePolicyTightened.New("Failure",
			fmt.Sprintf("role %s tightened, and its rules could not be loaded (%v): the sandbox was %s instead", next.Role, err, fallback), detail), true)
		return
	}
	sb.resp.mu.Lock()
	sb.resp.liveDigest = next.Digest
	sb.resp.mu.Unlock()
	detail["applied_in"] = time.Since(start).Round(time.Microsecond).String()
	if closed > 0 {
		detail["gateway_connections_closed"] = fmt.Sprint(closed)
	}
	sb.audit.trail.Emit(audit.TypePolicyTightened.New("Success",
		fmt.Sprintf("role %s tightened to %s: %s", next.Role, short(next.Digest), detail["applied"]), detail), true)
	log.G(ctx).WithField("policy_digest", next.Digest).Infof("agentbox: role tightened live: %s", detail["applied"])
}

// loadLive makes pl the sandbox's egress: the resolver and gateway decide
// by it from now on (the gateway's TLS connections to names it no longer
// allows are closed), and the pod's rules are replaced (unless it is
// quarantined: its release loads them). It says how many gateway
// connections it closed.
func (s *service) loadLive(sb *sandboxState, pl *netpolicy.Plan) (int, error) {
	e := sb.egress()
	sb.resp.mu.Lock()
	quarantined := sb.resp.quarantined != ""
	sb.resp.mu.Unlock()
	if e.netns != "" && !quarantined {
		if err := netpolicy.Restore(e.held, pl, e.iface); err != nil {
			return 0, err
		}
	}
	sb.live.Store(pl)
	if e.gateway == nil {
		return 0, nil
	}
	return e.gateway.Revalidate(), nil
}

// unchangeable names the parts of two profiles, other than egress, that
// differ and that a running sandbox cannot take: a role's new version's
// apply to new sandboxes only, and a restore refuses them.
func unchangeable(cur, next *policy.Profile) []string {
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
	} {
		a, _ := json.Marshal(part.cur)
		b, _ := json.Marshal(part.next)
		if string(a) != string(b) {
			out = append(out, part.name)
		}
	}
	return out
}

// lowerLimits is the cgroup update that takes a running sandbox's memory
// and CPU limits (memory, cpuMillis: what its cgroup has; 0 none) down to
// its role's new version's where that is lower (nil: none), what it
// applies, and what it does not: a role's higher limit loosens. A role
// limit that did not change changes nothing (the pod may have asked for
// less).
func lowerLimits(memory, cpuMillis int64, old, next policy.LimitsProfile) (*specs.LinuxResources, []string, []string) {
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

// updateLimits applies res to the sandbox's cgroup (runsc update, through
// gVisor's task service).
func (s *service) updateLimits(ctx context.Context, sb *sandboxState, res *specs.LinuxResources) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if _, err := s.next.Update(ctx, &task.UpdateTaskRequest{ID: sb.id, Resources: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: b}}); err != nil {
		return fmt.Errorf("runsc update: %w", err)
	}
	if res.Memory != nil {
		sb.memoryLimit = *res.Memory.Limit
	}
	if res.CPU != nil {
		sb.cpuMillis = *res.CPU.Quota * 1000 / int64(*res.CPU.Period)
	}
	return nil
}

func short(digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}
