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
	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/netenforce"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/policystore"
	"agentbox.dev/agentbox/internal/tighten"
)

// policyPoll is how often a shim looks for a changed policy directory
// (a stat of its files; parsed only when one changed).
const policyPoll = time.Second

// loadPolicies returns the set in cfg's policy directory: this process's
// copy while the directory is unchanged, else the node's stored copy of the
// same files' bytes, else the files parsed and checked (and stored).
func (s *service) loadPolicies(cfg *config.Config) (*policy.Set, error) {
	return s.policies.LoadStored(cfg.Policy.Dir, policystore.Dir{Path: cfg.PolicyStoreDir(), Warn: func(err error) {
		log.L.WithError(err).Warn("agentbox: the node's policy store is not used for this load")
	}})
}

// watchPolicies starts, once per shim, following the policy directory of
// the config its first sandbox was created under.
func (s *service) watchPolicies(cfg *config.Config) {
	s.watchOnce.Do(func() {
		go func() {
			var last *policy.Set
			var lastErr string
			for {
				time.Sleep(policyPoll)
				set, err := s.loadPolicies(cfg)
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
	sb.ops.Lock()
	defer sb.ops.Unlock()
	next, err := set.Select(sb.roleRequest())
	seen, live := sb.seen, sb.liveDigestNow()
	if err != nil {
		// The role no longer selects for this sandbox: what it runs under
		// stays, and the trail says so once.
		if seen != "refused: "+err.Error() {
			sb.seen = "refused: " + err.Error()
			sb.audit.trail.Emit(audit.TypePolicyPending.New("Failure",
				"the role's new version does not select for this sandbox ("+err.Error()+"): it keeps its profile; new sandboxes are refused",
				map[string]string{"error": err.Error(), "live_digest": live}), true)
		}
		return
	}
	if next.Digest == seen || (seen == "" && next.Digest == live) {
		return
	}
	sb.seen = next.Digest
	change, err := tighten.Diff(tighten.Running{Profile: sb.profile, Plan: sb.live.Load(), MemoryBytes: sb.memoryLimit, CPUMillis: sb.cpuMillis}, next)
	if err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: the role's new version is not applied")
		sb.audit.trail.Emit(audit.TypePolicyPending.New("Failure", fmt.Sprintf("role %s changed (%s), and %v: the sandbox keeps its profile", next.Role, policy.ShortDigest(next.Digest), err),
			map[string]string{"error": err.Error(), "live_digest": live, "new_digest": next.Digest}), true)
		return
	}
	applied, pending := change.Applied, change.Pending
	detail := map[string]string{"start_digest": sb.profile.Digest, "previous_digest": live, "new_digest": next.Digest,
		"applied": strings.Join(applied, "; "), "pending": strings.Join(pending, "; ")}
	if !change.Tightens() {
		if len(pending) > 0 {
			sb.audit.trail.Emit(audit.TypePolicyPending.New("Success",
				fmt.Sprintf("role %s changed (%s): nothing tightens this sandbox; for new sandboxes only: %s", next.Role, policy.ShortDigest(next.Digest), detail["pending"]), detail), true)
		}
		return
	}
	start := time.Now()
	closed, fallback, err := s.takeChange(ctx, sb, change)
	if err != nil {
		detail["error"], detail["fallback"] = err.Error(), fallback
		sb.audit.trail.Emit(audit.TypePolicyTightened.New("Failure",
			fmt.Sprintf("role %s tightened, and its rules could not be loaded (%v): the sandbox was %s instead", next.Role, err, fallback), detail), true)
		return
	}
	sb.liveDigest.Store(&next.Digest)
	detail["applied_in"] = time.Since(start).Round(time.Microsecond).String()
	if closed > 0 {
		detail["gateway_connections_closed"] = fmt.Sprint(closed)
	}
	sb.audit.trail.Emit(audit.TypePolicyTightened.New("Success",
		fmt.Sprintf("role %s tightened to %s: %s", next.Role, policy.ShortDigest(next.Digest), detail["applied"]), detail), true)
	log.G(ctx).WithField("policy_digest", next.Digest).Infof("agentbox: role tightened live: %s", detail["applied"])
}

// takeChange loads what a change tightens (its egress, its lower cgroup
// limits); if that fails, the sandbox fails closed, and fallback says how
// (frozen, stopped, and why neither when neither). It says how many
// gateway connections it closed.
// +checklocks:sb.ops
func (s *service) takeChange(ctx context.Context, sb *sandboxState, c tighten.Change) (closed int, fallback string, err error) {
	closed, err = s.loadLive(sb, c.Plan)
	if err == nil && c.Resources != nil {
		err = s.updateLimits(ctx, sb, c.Resources)
	}
	if err == nil {
		return closed, "", nil
	}
	fallback, ferr := s.failClosed(ctx, sb)
	if ferr != nil {
		fallback += " (" + ferr.Error() + ")"
	}
	return closed, fallback, err
}

// loadLive makes pl the sandbox's egress: the resolver and gateway decide
// by it from now on (the gateway's TLS connections to names it no longer
// allows are closed), and the pod's rules are replaced (unless it is
// quarantined: its release loads them). It says how many gateway
// connections it closed.
func (s *service) loadLive(sb *sandboxState, pl *netpolicy.Plan) (int, error) {
	e := sb.egress()
	if e.netns != "" && !sb.life.Now().Quarantined() {
		if err := netenforce.Restore(e.held, pl, e.iface); err != nil {
			return 0, err
		}
	}
	sb.live.Store(pl)
	if e.gateway == nil {
		return 0, nil
	}
	return e.gateway.Revalidate(), nil
}

// updateLimits applies res to the sandbox's cgroup (runsc update, through
// gVisor's task service).
// +checklocks:sb.ops
func (s *service) updateLimits(ctx context.Context, sb *sandboxState, res *specs.LinuxResources) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if _, err := s.next.Update(ctx, &task.UpdateTaskRequest{ID: sb.id, Resources: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: b}}); err != nil {
		return fmt.Errorf("runsc update: %w", err)
	}
	if sb.stats != nil {
		// runsc updates only a cgroup it made: a pod's is the kubelet's.
		mem, cpu := limitsOf(res)
		if sb.warm.Capped() {
			cpu = cgroups.Quota{} // capped lower: recapCPU keeps it for the claim
		}
		if _, err := cgroups.Lower(cgroups.Root, sb.stats.Cgroup, mem, cpu); err != nil {
			return fmt.Errorf("the sandbox's cgroup: %w", err)
		}
	}
	sb.tookLimits(res)
	return nil
}

// limitsOf is the memory limit (bytes; 0 none) and CPU bandwidth (zero:
// none) res sets.
func limitsOf(res *specs.LinuxResources) (int64, cgroups.Quota) {
	var mem int64
	var cpu cgroups.Quota
	if res == nil {
		return 0, cpu
	}
	if res.Memory != nil && res.Memory.Limit != nil && *res.Memory.Limit > 0 {
		mem = *res.Memory.Limit
	}
	if res.CPU != nil && res.CPU.Quota != nil && *res.CPU.Quota > 0 && res.CPU.Period != nil && *res.CPU.Period > 0 {
		cpu = cgroups.Quota{Quota: *res.CPU.Quota, Period: int64(*res.CPU.Period)}
	}
	return mem, cpu
}

// tookLimits notes the memory and CPU limits an update applied to the
// sandbox's cgroup (what a live tightening lowers from).
// +checklocks:sb.ops
func (sb *sandboxState) tookLimits(res *specs.LinuxResources) {
	var cpu *cgroups.Quota
	sb.memoryLimit, sb.cpuMillis, cpu = limitsAfter(sb.memoryLimit, sb.cpuMillis, res)
	if cpu != nil {
		recapCPU(sb, *cpu)
	}
}

// limitsAfter is a sandbox's memory limit (bytes) and CPU limit
// (millicores) after an update res applied to its cgroup, from memory and
// cpuMillis before it (0: none, as limitsOf reads them; an update's -1 is
// none). cpu is the bandwidth res set, nil when it left the CPU as it was
// (no quota, or no period to read it by).
func limitsAfter(memory, cpuMillis int64, res *specs.LinuxResources) (int64, int64, *cgroups.Quota) {
	if res == nil {
		return memory, cpuMillis, nil
	}
	mem, q := limitsOf(res)
	if res.Memory != nil && res.Memory.Limit != nil {
		memory = mem
	}
	if res.CPU == nil || res.CPU.Quota == nil || res.CPU.Period == nil || *res.CPU.Period == 0 {
		return memory, cpuMillis, nil
	}
	return memory, q.Millis(), &q
}
