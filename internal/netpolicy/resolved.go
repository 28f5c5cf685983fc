package netpolicy

import (
	"net/netip"
	"sync"
	"time"
)

// Resolutions are the answers the pod's resolver got for host rules' names
// and until when: the egress gateway dials these, so a connection goes to
// what the runtime resolved for the name, never to an address the agent
// chose. Safe for concurrent use; bounded (the names are the agent's).
type Resolutions struct {
	mu  sync.Mutex
	m   map[resolutionKey]resolution
	now func() time.Time
}

type resolutionKey struct{ rule, name string }

type resolution struct {
	addrs []netip.Addr
	until time.Time
}

// maxResolutions bounds the table: a wildcard rule lets an agent ask for
// any number of names.
const maxResolutions = 1024

// NewResolutions returns an empty table; now is the clock (time.Now if nil).
func NewResolutions(now func() time.Time) *Resolutions {
	if now == nil {
		now = time.Now
	}
	return &Resolutions{m: map[resolutionKey]resolution{}, now: now}
}

// Add records that name resolved to addrs under rule r, for ttl from now.
func (t *Resolutions) Add(r Rule, name string, addrs []netip.Addr, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if len(t.m) >= maxResolutions {
		for k, v := range t.m {
			if !v.until.After(now) {
				delete(t.m, k)
			}
		}
		for k := range t.m {
			if len(t.m) < maxResolutions {
				break
			}
			delete(t.m, k)
		}
	}
	kept := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		kept[i] = a.Unmap()
	}
	t.m[resolutionKey{r.Name, name}] = resolution{kept, now.Add(ttl)}
}

// Get returns name's addresses under rule r while its answer lasts.
func (t *Resolutions) Get(r Rule, name string) []netip.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[resolutionKey{r.Name, name}]
	if !ok || !e.until.After(t.now()) {
		return nil
	}
	return e.addrs
}

// Kept returns name's addresses under r and how long they last (nil, 0
// when there are none).
func (t *Resolutions) Kept(r Rule, name string) ([]netip.Addr, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[resolutionKey{r.Name, name}]
	if !ok {
		return nil, 0
	}
	left := e.until.Sub(t.now())
	if left <= 0 {
		return nil, 0
	}
	return e.addrs, left
}

// Remaining returns how long name's answer under r lasts, if it holds all
// of addrs (0 otherwise).
func (t *Resolutions) Remaining(r Rule, name string, addrs []netip.Addr) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[resolutionKey{r.Name, name}]
	if !ok {
		return 0
	}
	have := map[netip.Addr]bool{}
	for _, a := range e.addrs {
		have[a] = true
	}
	for _, a := range addrs {
		if !have[a.Unmap()] {
			return 0
		}
	}
	if left := e.until.Sub(t.now()); left > 0 {
		return left
	}
	return 0
}
