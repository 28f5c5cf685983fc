package shim

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/netenforce"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/portfwd"
	"agentbox.dev/agentbox/internal/sentrystats"
	"agentbox.dev/agentbox/internal/toollink"
	"agentbox.dev/agentbox/shim/sandbox"
)

// sandboxState is what the shim remembers about one gVisor sandbox: the
// profile it runs under, its lifecycle (shim/sandbox), its containers and
// its wall clock, and what enforces its egress.
//
// Locks, in order: ops first; then any one of life's, clock's, members',
// egressMu or the registry's, each held only to read or write its own
// fields (shim/sandbox's package doc).
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
	inCRI  bool
	podUID string
	// pauseImage: the pod's pause container runs from the node's image
	// of its rootfs (pauseroot.go); set at its create.
	pauseImage bool
	// started is when the sandbox was created.
	started time.Time
	// ops serializes what changes the sandbox's enforcement: an admin's
	// requests, its role's live tightening and a checkpoint (a release
	// must not load rules a tightening is replacing).
	ops sync.Mutex
	// pauseMu holds runsc's pause or resume together with the move it
	// makes (Freeze, Thaw, a frozen sandbox's Stop): a stop never resumes
	// a sandbox that a freeze under way then pauses. Taken after ops,
	// before the lifecycle's own lock; held only around those calls.
	pauseMu sync.Mutex
	// life is its phase and quarantine; clock its wall-clock limit;
	// members its containers.
	life    sandbox.Lifecycle
	clock   *sandbox.WallClock
	members *sandbox.Members
	// restore is set for a sandbox restored from a checkpoint.
	restore *restoring
	// request is what selected the sandbox's role; live is the egress
	// plan it runs under now (its role's, or narrowed since: the
	// resolver, the gateway and connect records read it).
	request policy.Request
	live    atomic.Pointer[netpolicy.Plan]
	// liveDigest is the digest of the role version the sandbox took the
	// tightenings of (nil: its start digest); seen is the newest version
	// it was told of (guarded by ops).
	liveDigest atomic.Pointer[string]
	// +checklocks:ops
	seen string
	// claimRole is what selects the role the sandbox's claim named, once
	// it took it (nil: its own request selects). claimrole.go.
	// +checklocks:ops
	claimRole *policy.Request
	// warm is its cgroup's CPU class and cap while a warm pool holds it.
	// warmcpu.go.
	// +checklocks:ops
	warm cgroups.Warm
	// commands numbers the admin requests applied.
	commands atomic.Int64
	// owner is the agent-sandbox Sandbox its pod belongs to, as the node
	// agent last said (nil: none said). Written under ops.
	owner atomic.Pointer[control.Owner]
	// forwarder is its port-forward listeners (nil: none). portforward.go.
	forwarder atomic.Pointer[portfwd.Forwarder]
	// memoryLimit (bytes) and cpuMillis are the sandbox's cgroup limits
	// (0: none); a tightened role lowers them live. Guarded by ops after
	// Create.
	memoryLimit int64
	cpuMillis   int64
	// cgroupsPath is the sandbox's cgroup (its root container's
	// linux.cgroupsPath), read for what it used when it ends.
	cgroupsPath string
	// stats is where its containers' stats are read in the shim (nil:
	// left to runsc, as for a systemd cgroup).
	stats *sentrystats.Sandbox
	// ctl is the sandbox's control socket.
	ctl *control.Server
	// control is runsc's control socket of the sandbox, where the shim
	// waits for its containers' exits (runscwait.go).
	control string
	// oomKills counts the OOM kills gVisor reported for its cgroup.
	oomKills atomic.Uint64
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
	// +checklocks:egressMu
	netns string
	// +checklocks:egressMu
	netnsFile *os.File
	// iface is the pod's interface the rules are on. Guarded by egressMu.
	// +checklocks:egressMu
	iface string
	// resolver is the pod's DNS resolver (allowlist egress). Guarded by
	// egressMu.
	// +checklocks:egressMu
	resolver *dnsproxy.Resolver
	// gateway is the pod's egress gateway (host rules). Guarded by
	// egressMu.
	// +checklocks:egressMu
	gateway *egressgw.Gateway
	// ca is the gateway's CA when it inspects rules (the containers trust
	// it); placeholders are what the sandbox holds instead of the secrets
	// the gateway injects, by variable. Guarded by egressMu.
	// +checklocks:egressMu
	ca *egressgw.CA
	// +checklocks:egressMu
	placeholders map[string]string
	// gatewayPlan is the plan the gateway started with (its injected
	// secrets); claimRefs the sources of the claim keys bound since
	// (claimkeys.go). Guarded by egressMu.
	// +checklocks:egressMu
	gatewayPlan *netpolicy.Plan
	// +checklocks:egressMu
	claimRefs map[string]policy.SecretRef
	// secretsMu is held from reading the injected secrets' sources to
	// handing them to the gateway (a rotation, a claim's binding). Taken
	// before egressMu.
	secretsMu sync.Mutex
	// denials reads the drop rules' log. Guarded by egressMu.
	// +checklocks:egressMu
	denials *netenforce.DenialLog
	// dropsDone is closed once the drop counters are recorded (nil until
	// the root exits). Guarded by egressMu.
	// +checklocks:egressMu
	dropsDone chan struct{}

	// Set at Create, read-only after: the resolver's address and
	// upstreams, the answers it kept for the gateway, and the denial log's
	// de-duplication.
	dnsAddr   netip.Addr
	upstreams []netip.AddrPort
	// connects are the agent's connects to the gateway (nil without
	// one): its records name the process that opened each connection.
	connects *audit.ConnectIndex
	// links holds the model's tool calls waiting for the processes they
	// start (nil: no host rule names a model API).
	links       *toollink.Linker
	resolved    *netpolicy.Resolutions
	dedupe      *netenforce.Deduper
	denialsLost atomic.Int64
}

// heldNetnsLocked is a path to the pod namespace that stays valid while
// the shim holds it (for nsenter, a child of the shim). The caller holds
// egressMu.
// +checklocks:sb.egressMu
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
// +checklocks:sb.egressMu
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
	denials   *netenforce.DenialLog
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

// newSandboxState is a sandbox being created, of root container id.
func newSandboxState(id string, cfg *config.Config, claims map[string]string, trail *audit.Trail) *sandboxState {
	now := time.Now()
	return &sandboxState{id: id, cfg: cfg, claims: claims, audit: &sandboxAudit{trail: trail}, started: now,
		clock: sandbox.NewWallClock(now), members: sandbox.NewMembers(id)}
}

// liveDigestNow is the digest of the role version the sandbox runs under
// now.
func (sb *sandboxState) liveDigestNow() string {
	if d := sb.liveDigest.Load(); d != nil {
		return *d
	}
	return sb.profile.Digest
}

// fire moves the sandbox's lifecycle on ev (reason: see Lifecycle.Fire).
// A move its state does not allow is returned, for the caller to handle,
// and logged as a warning: the one expected, a move of a sandbox that
// ended meanwhile (its root's exit raced it), is neither.
func (sb *sandboxState) fire(ctx context.Context, ev sandbox.Event, reason string) error {
	before, err := sb.life.Fire(ev, reason)
	if err != nil && before.Phase != sandbox.Ended {
		log.G(ctx).WithField("sandbox_id", sb.id).WithError(err).Warn("agentbox: lifecycle")
		return err
	}
	return nil
}

// sandboxRegistry maps containers to their sandboxes. Safe for concurrent
// use; its lock guards only its maps.
type sandboxRegistry struct {
	mu sync.Mutex
	// sandboxes by sandbox id (the root container's id). Protected by mu.
	// +checklocks:mu
	sandboxes map[string]*sandboxState
	// sandboxOf maps a container id to its sandbox id. Protected by mu.
	// +checklocks:mu
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
}

// join adds a container to an existing sandbox.
func (r *sandboxRegistry) join(sandboxID, id string) {
	r.mu.Lock()
	sb, ok := r.sandboxes[sandboxID]
	if ok {
		r.sandboxOf[id] = sandboxID
	}
	r.mu.Unlock()
	if ok {
		sb.members.Join(id)
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
// and stops its wall clock.
func (r *sandboxRegistry) remove(id string) {
	r.mu.Lock()
	sbID, ok := r.sandboxOf[id]
	delete(r.sandboxOf, id)
	sb := r.sandboxes[sbID]
	if ok && id == sbID {
		delete(r.sandboxes, sbID)
	}
	r.mu.Unlock()
	if !ok || sb == nil {
		return
	}
	sb.members.Leave(id)
	if id == sbID {
		sb.clock.Stop()
	}
}

// expiredContainer reports whether the container's sandbox was stopped by
// its wall-clock limit.
func (r *sandboxRegistry) expiredContainer(id string) bool {
	sb, ok := r.of(id)
	return ok && sb.life.Now().StopReason == sandbox.StopWallClock
}

// suspendedContainer reports whether a container's sandbox was stopped by
// its suspend.
func (r *sandboxRegistry) suspendedContainer(id string) bool {
	sb, ok := r.of(id)
	return ok && sb.life.Now().SuspendedInto != ""
}

// oomKilledContainer reports whether a container's sandbox ran out of
// memory: gVisor reported an OOM kill for its cgroup, or the kernel counts
// one there. gVisor's event may come after the container's exit; the
// kernel counted the kill before the sandbox died of it.
func (r *sandboxRegistry) oomKilledContainer(id string) bool {
	sb, ok := r.of(id)
	if !ok {
		return false
	}
	if sb.oomKills.Load() > 0 {
		return true
	}
	if sb.stats == nil {
		return false
	}
	n, err := cgroups.OOMKills(cgroups.Root, sb.stats.Cgroup)
	return err == nil && n > 0
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
