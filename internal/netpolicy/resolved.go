package netpolicy

import (
	"net/netip"
	"sync"
	"time"
)

// Resolutions mirrors what the pod's resolver put into host rules' sets and
// until when, so that connection records can name the rule that allowed
// them. Safe for concurrent use.
type Resolutions struct {
	mu sync.Mutex
	// until[rule set][addr] is when the address leaves the set.
	until map[string]map[netip.Addr]time.Time
	now   func() time.Time
}

// NewResolutions returns an empty table; now is the clock (time.Now if nil).
func NewResolutions(now func() time.Time) *Resolutions {
	if now == nil {
		now = time.Now
	}
	return &Resolutions{until: map[string]map[netip.Addr]time.Time{}, now: now}
}

// Add records that addrs are in r's sets for ttl from now.
func (t *Resolutions) Add(r Rule, addrs []netip.Addr, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.until[r.Set4]
	if m == nil {
		m = map[netip.Addr]time.Time{}
		t.until[r.Set4] = m
	}
	now := t.now()
	for a, u := range m {
		if !u.After(now) {
			delete(m, a)
		}
	}
	for _, a := range addrs {
		m[a.Unmap()] = now.Add(ttl)
	}
}

// Has implements Resolved.
func (t *Resolutions) Has(r Rule, addr netip.Addr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.until[r.Set4][addr.Unmap()]
	return ok && u.After(t.now())
}

// Remaining returns how long all of addrs stay in r's sets, less a second
// for the gap between the kernel's clock starting and this table's: 0 if
// one of them is not there.
func (t *Resolutions) Remaining(r Rule, addrs []netip.Addr) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	least := time.Duration(-1)
	for _, a := range addrs {
		u, ok := t.until[r.Set4][a.Unmap()]
		if !ok {
			return 0
		}
		if left := u.Sub(now) - time.Second; least < 0 || left < least {
			least = left
		}
	}
	if least < 0 {
		return 0
	}
	return least
}
