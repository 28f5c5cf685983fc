package egressgw

// Holding a request for its key: a warm sandbox's role may take a host's
// key from its claim (issue 50). Until the claim is decided, a request to
// such a host waits, up to a bound, for the key, so that a claimed agent's
// first request carries it even when it races the claim's binding. A
// warm pod is idle by definition; a request from one waits out the bound
// and goes without a key, recorded.

import (
	"context"
	"time"
)

// MaxHold bounds how long a request waits for a key its claim has not
// given yet: well past a claim's binding (about 50 ms, 90% within 90 ms
// here), and short of common clients' header timeouts (5-10 s).
const MaxHold = 3 * time.Second

// holdState is the hosts whose key is awaited, and a channel closed when
// that changes.
type holdState struct {
	hosts   map[string]bool
	changed chan struct{}
}

// HoldFor makes requests to hosts wait for their key (nil: none waits).
// Hand the keys to SetSecrets before releasing their hosts: a request
// released reads the secrets then.
func (g *Gateway) HoldFor(hosts []string) {
	st := &holdState{hosts: map[string]bool{}, changed: make(chan struct{})}
	for _, h := range hosts {
		st.hosts[h] = true
	}
	if old := g.hold.Swap(st); old != nil {
		close(old.changed)
	}
}

// awaitKey waits while requests to host are held, up to MaxHold or ctx's
// end; it says how long it waited and whether the hold was still on when
// it stopped.
func (g *Gateway) awaitKey(ctx context.Context, host string) (time.Duration, bool) {
	st := g.hold.Load()
	if st == nil || !st.hosts[host] {
		return 0, false
	}
	start := time.Now()
	t := time.NewTimer(MaxHold)
	defer t.Stop()
	for st != nil && st.hosts[host] {
		select {
		case <-st.changed:
			st = g.hold.Load()
		case <-t.C:
			return time.Since(start), true
		case <-ctx.Done():
			return time.Since(start), true
		case <-g.ctx.Done():
			return time.Since(start), true
		}
	}
	return time.Since(start), false
}
