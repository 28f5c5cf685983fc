package shim

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// sandboxState is what the shim remembers about one gVisor sandbox: the
// profile it runs under, the containers in it and its wall-clock timer.
type sandboxState struct {
	id      string
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
	timer      *time.Timer
	// expired is set when the wall-clock limit stopped the sandbox.
	expired bool
	// audit is the sandbox's trail and receiver.
	audit *sandboxAudit
	// netns holds the egress rules the shim loaded ("" when none).
	netns string
	// resolver is the pod's DNS resolver (allowlist egress), at dnsAddr,
	// asking upstreams; resolved mirrors what it let through.
	resolver  *dnsproxy.Resolver
	dnsAddr   netip.Addr
	upstreams []netip.AddrPort
	resolved  *netpolicy.Resolutions
	// denials reads the drop rules' log; dedupe holds back repeats.
	denials     *netpolicy.DenialLog
	dedupe      *netpolicy.Deduper
	denialsLost atomic.Int64
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
	d := sb.profile.Limits.WallClock
	sb.timer = time.AfterFunc(d, func() { fire(sandboxID) })
	return d, true
}

// containersOf lists a sandbox's containers.
func (r *sandboxRegistry) containersOf(sb *sandboxState) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), sb.containers...)
}
