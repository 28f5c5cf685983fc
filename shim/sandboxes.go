package shim

import (
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// sandboxState is what the shim remembers about one gVisor sandbox: the
// profile it runs under, the containers in it and its wall-clock timer.
type sandboxState struct {
	id      string
	cfg     *config.Config
	profile *policy.Profile
	// claims are the agentbox.dev/* annotations the sandbox was created
	// with; a container joining it must carry the same.
	claims map[string]string
	// inCRI: a Kubernetes pod (containerd's CRI namespace) of UID podUID;
	// its containers' pod files and volumes are accepted from containerd's
	// and the kubelet's directories for it.
	inCRI      bool
	podUID     string
	containers []string
	// started is when the sandbox was created.
	started time.Time
	// restore is set for a sandbox restored from a checkpoint; wallUsed is
	// what its agent had used of its wall clock before (the clock counts
	// on from there).
	restore  *restoring
	wallUsed time.Duration
	// timer fires at deadline, the wall-clock limit; while the sandbox
	// is frozen it is stopped and left holds what remained. Protected by
	// the registry's mu.
	timer    *time.Timer
	deadline time.Time
	left     time.Duration
	// request is what selected the sandbox's role; live is the egress
	// plan it runs under now (its role's, or narrowed since: the
	// resolver, the gateway and connect records read it).
	request policy.Request
	live    atomic.Pointer[netpolicy.Plan]
	// memoryLimit (bytes) and cpuMillis are the sandbox's cgroup limits
	// (0: none); a tightened role lowers them live. Owned by the policy
	// watcher after Create.
	memoryLimit, cpuMillis int64
	// ctl is the sandbox's control socket; resp what an admin's
	// responses (quarantine, freeze) hold now.
	ctl  *control.Server
	resp response
	// expired is set when the wall-clock limit stopped the sandbox;
	// oomKills counts the OOM kills gVisor reported for its cgroup.
	// Protected by the registry's mu.
	expired  bool
	oomKills uint64
	// audit is the sandbox's trail and receiver.
	audit *sandboxAudit
	// egressMu guards the egress fields below. Create sets them before the
	// sandbox is registered; the root's exit (on the event publisher)
	// schedules the drop counters; Delete takes them all for removal.
	egressMu sync.Mutex
	// netns is the pod namespace holding the shim's egress rules ("" when
	// none); netnsFile holds that namespace open, so the rules and their
	// counters outlive the CRI's teardown of its path until the shim
	// removes them. Guarded by egressMu.
	netns     string
	netnsFile *os.File
	// iface is the pod's interface the rules are on. Guarded by egressMu.
	iface string
	// resolver is the pod's DNS resolver (allowlist egress). Guarded by
	// egressMu.
	resolver *dnsproxy.Resolver
	// gateway is the pod's egress gateway (host rules). Guarded by
	// egressMu.
	gateway *egressgw.Gateway
	// ca is the gateway's CA when it inspects rules (the containers trust
	// it); placeholders are what the sandbox holds instead of the secrets
	// the gateway injects, by variable. Guarded by egressMu.
	ca           *egressgw.CA
	placeholders map[string]string
	// denials reads the drop rules' log. Guarded by egressMu.
	denials *netpolicy.DenialLog
	// dropsDone is closed once the drop counters are recorded (nil until
	// the root exits). Guarded by egressMu.
	dropsDone chan struct{}

	// Set at Create, read-only after: the resolver's address and
	// upstreams, the answers it kept for the gateway, and the denial log's
	// de-duplication.
	dnsAddr   netip.Addr
	upstreams []netip.AddrPort
	// connects are the agent's connects to the gateway (nil without
	// one): its records name the process that opened each connection.
	connects    *audit.ConnectIndex
	resolved    *netpolicy.Resolutions
	dedupe      *netpolicy.Deduper
	denialsLost atomic.Int64
}

// heldNetnsLocked is a path to the pod namespace that stays valid while
// the shim holds it (for nsenter, a child of the shim). The caller holds
// egressMu.
func (sb *sandboxState) heldNetnsLocked() string {
	if sb.netnsFile == nil {
		return sb.netns
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), sb.netnsFile.Fd())
}

// setEgress records the namespace the rules were loaded into, on iface,
// and holds it open.
func (sb *sandboxState) setEgress(ns, iface string) error {
	f, err := os.Open(ns)
	if err != nil {
		return fmt.Errorf("hold the pod's network namespace %s: %w", ns, err)
	}
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	sb.netns, sb.netnsFile, sb.iface = ns, f, iface
	return nil
}

// egressNow is what a sandbox's egress holds at one moment: the pod
// namespace ("" for none) and a path to it that stays valid while the shim
// holds it, the pod's interface, its resolver and gateway (nil for none).
type egressNow struct {
	netns, held, iface string
	resolver           *dnsproxy.Resolver
	gateway            *egressgw.Gateway
}

// egressNowLocked reads it. The caller holds egressMu.
func (sb *sandboxState) egressNowLocked() egressNow {
	return egressNow{netns: sb.netns, held: sb.heldNetnsLocked(), iface: sb.iface, resolver: sb.resolver, gateway: sb.gateway}
}

// egress reads what the sandbox's egress holds now.
func (sb *sandboxState) egress() egressNow {
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	return sb.egressNowLocked()
}

// egressRemoval is what removeEgress takes from a sandbox, once.
type egressRemoval struct {
	egressNow
	file      *os.File
	denials   *netpolicy.DenialLog
	dropsDone chan struct{}
}

// takeEgress hands the egress state over for removal and clears it; a
// second call gets nothing.
func (sb *sandboxState) takeEgress() (egressRemoval, bool) {
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	if sb.netns == "" {
		return egressRemoval{}, false
	}
	e := egressRemoval{egressNow: sb.egressNowLocked(), file: sb.netnsFile, denials: sb.denials, dropsDone: sb.dropsDone}
	sb.netns, sb.netnsFile, sb.resolver, sb.gateway, sb.denials = "", nil, nil, nil, nil
	return e, true
}

// scheduleDrops starts recording the drop counters once, off the caller's
// path (the event publisher), and returns at once. record runs with a
// path to the held namespace.
func (sb *sandboxState) scheduleDrops(record func(netns string)) {
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	if sb.netns == "" || sb.dropsDone != nil {
		return
	}
	done, ns := make(chan struct{}), sb.heldNetnsLocked()
	sb.dropsDone = done
	go func() {
		defer close(done)
		record(ns)
	}()
}

// sandboxRegistry maps containers to their sandboxes. Safe for concurrent use.
type sandboxRegistry struct {
	mu sync.Mutex
	// sandboxes by sandbox id (the root container's id). Protected by mu.
	sandboxes map[string]*sandboxState
	// sandboxOf maps a container id to its sandbox id. Protected by mu.
	sandboxOf map[string]string
}

func newRegistry() *sandboxRegistry {
	return &sandboxRegistry{sandboxes: map[string]*sandboxState{}, sandboxOf: map[string]string{}}
}

func (r *sandboxRegistry) addSandbox(sb *sandboxState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sandboxes[sb.id] = sb
	r.sandboxOf[sb.id] = sb.id
	sb.containers = append(sb.containers, sb.id)
}

// join adds a container to an existing sandbox.
func (r *sandboxRegistry) join(sandboxID, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.sandboxes[sandboxID]; ok {
		sb.containers = append(sb.containers, id)
		r.sandboxOf[id] = sandboxID
	}
}

func (r *sandboxRegistry) sandbox(id string) (*sandboxState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	return sb, ok
}

// of returns the sandbox a container belongs to.
func (r *sandboxRegistry) of(containerID string) (*sandboxState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[r.sandboxOf[containerID]]
	return sb, ok
}

// remove forgets a container; removing a sandbox's root forgets the sandbox
// and stops its timer.
func (r *sandboxRegistry) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sbID, ok := r.sandboxOf[id]
	if !ok {
		return
	}
	delete(r.sandboxOf, id)
	sb := r.sandboxes[sbID]
	if sb == nil {
		return
	}
	for i, c := range sb.containers {
		if c == id {
			sb.containers = append(sb.containers[:i], sb.containers[i+1:]...)
			break
		}
	}
	if id == sbID {
		if sb.timer != nil {
			sb.timer.Stop()
		}
		delete(r.sandboxes, sbID)
	}
}

// expiredContainer reports whether the container's sandbox was stopped by
// its wall-clock limit.
func (r *sandboxRegistry) expiredContainer(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[r.sandboxOf[id]]
	return sb != nil && sb.expired
}

// markOOM records that a sandbox's cgroup ran out of memory.
func (r *sandboxRegistry) markOOM(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.sandboxes[sandboxID]; ok {
		sb.oomKills++
	}
}

// oomKills returns the OOM kills of a container's sandbox.
func (r *sandboxRegistry) oomKills(id string) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[r.sandboxOf[id]]
	if sb == nil {
		return 0, false
	}
	return sb.oomKills, true
}

// oomKilledContainer reports whether a container's sandbox ran out of
// memory.
func (r *sandboxRegistry) oomKilledContainer(id string) bool {
	n, _ := r.oomKills(id)
	return n > 0
}

// expire marks a sandbox as stopped by its wall clock and returns the
// containers to kill, the root last.
func (r *sandboxRegistry) expire(sandboxID string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[sandboxID]
	if !ok {
		return nil
	}
	sb.expired = true
	var ids []string
	for _, c := range sb.containers {
		if c != sandboxID {
			ids = append(ids, c)
		}
	}
	return append(ids, sandboxID)
}

// armTimer starts the sandbox's wall-clock timer once.
func (r *sandboxRegistry) armTimer(sandboxID string, fire func(string)) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[sandboxID]
	if !ok || sb.timer != nil || sb.profile == nil || sb.profile.Limits.WallClock <= 0 {
		return 0, false
	}
	d := sb.profile.Limits.WallClock - sb.wallUsed
	if d <= 0 {
		d = time.Millisecond
	}
	sb.deadline = time.Now().Add(d)
	sb.timer = time.AfterFunc(d, func() { fire(sandboxID) })
	return d, true
}

// holdTimer stops a sandbox's wall clock while it is frozen: what remains
// of it is kept for thawTimer. A clock that has run out stays run out.
func (r *sandboxRegistry) holdTimer(sb *sandboxState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb.timer == nil || sb.left > 0 {
		return
	}
	if sb.timer.Stop() {
		sb.left = max(time.Until(sb.deadline), time.Millisecond)
	}
}

// thawTimer starts the wall clock again with what it had left.
func (r *sandboxRegistry) thawTimer(sb *sandboxState, fire func(string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb.left <= 0 {
		return
	}
	d := sb.left
	sb.left, sb.deadline = 0, time.Now().Add(d)
	sb.timer = time.AfterFunc(d, func() { fire(sb.id) })
}

// wallClockLeft is what remains of a sandbox's wall-clock limit (false:
// it has none).
func (r *sandboxRegistry) wallClockLeft(sb *sandboxState) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return wallClockLeftLocked(sb)
}

// wallClockLeftLocked is wallClockLeft with the registry's mu held.
func wallClockLeftLocked(sb *sandboxState) (time.Duration, bool) {
	switch {
	case sb.timer == nil:
		return 0, false
	case sb.left > 0:
		return sb.left, true
	}
	return max(time.Until(sb.deadline), 0), true
}

// wallClockUsed is how much of its wall clock the sandbox's agent has used
// (before a restore too); without a limit, how long it has run.
func (r *sandboxRegistry) wallClockUsed(sb *sandboxState) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if left, ok := wallClockLeftLocked(sb); ok {
		return max(sb.profile.Limits.WallClock-left, 0)
	}
	return sb.wallUsed + time.Since(sb.started)
}

// takeRestore counts a container of a restoring sandbox as restored; false
// when all were (the container starts as any other).
func (r *sandboxRegistry) takeRestore(sb *sandboxState) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb.restore == nil || sb.restore.pending <= 0 {
		return false
	}
	sb.restore.pending--
	return true
}

// restorePending counts the containers of a restoring sandbox not yet
// restored.
func (r *sandboxRegistry) restorePending(sb *sandboxState) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb.restore == nil {
		return 0
	}
	return sb.restore.pending
}

// all lists the sandboxes.
func (r *sandboxRegistry) all() []*sandboxState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*sandboxState, 0, len(r.sandboxes))
	for _, sb := range r.sandboxes {
		out = append(out, sb)
	}
	return out
}

// containersRootLast lists a sandbox's containers, its root last (the
// order to kill them in).
func (r *sandboxRegistry) containersRootLast(sb *sandboxState) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for _, c := range sb.containers {
		if c != sb.id {
			ids = append(ids, c)
		}
	}
	return append(ids, sb.id)
}

// containersOf lists a sandbox's containers.
func (r *sandboxRegistry) containersOf(sb *sandboxState) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), sb.containers...)
}
