package sandbox

import (
	"sync"
	"time"
)

// WallClock is a sandbox's wall-clock limit: armed when its root starts,
// held while it is frozen, and counted on from what an agent had used
// before a restore. Safe for concurrent use.
type WallClock struct {
	mu sync.Mutex
	// limit is the role's wall clock (0: none); used is what the agent
	// had used of it before this sandbox (a restore); started is when
	// this sandbox was created.
	// +checklocks:mu
	limit time.Duration
	// +checklocks:mu
	used time.Duration
	// +checklocks:mu
	started time.Time
	// timer fires at deadline; while held it is stopped and left is what
	// remained (0: not held).
	// +checklocks:mu
	timer *time.Timer
	// +checklocks:mu
	deadline time.Time
	// +checklocks:mu
	left time.Duration
}

// NewWallClock is the clock of a sandbox created at started.
func NewWallClock(started time.Time) *WallClock {
	return &WallClock{started: started}
}

// CountFrom sets what the agent had used before (a restore); it must be
// called before Arm.
func (c *WallClock) CountFrom(used time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used = used
}

// Used is what the agent had used before (a restore).
func (c *WallClock) Used() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// Arm starts the clock once, with the role's limit (0: none): fire runs
// (on its own goroutine) when what is left of it has passed. It returns
// that, and false when there is no limit or the clock was armed before. A
// clock already used up fires at once.
func (c *WallClock) Arm(limit time.Duration, fire func()) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil || limit <= 0 {
		return 0, false
	}
	c.limit = limit
	d := max(c.limit-c.used, time.Millisecond)
	c.deadline = time.Now().Add(d)
	c.timer = time.AfterFunc(d, fire)
	return d, true
}

// Hold stops the clock (a freeze) and keeps what was left of it for Thaw.
// A clock that has run out stays run out; holding a held clock changes
// nothing.
func (c *WallClock) Hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer == nil || c.left > 0 {
		return
	}
	if c.timer.Stop() {
		c.left = max(time.Until(c.deadline), time.Millisecond)
	}
}

// Thaw starts a held clock again with what it had left.
func (c *WallClock) Thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.left <= 0 {
		return
	}
	d := c.left
	c.left, c.deadline = 0, time.Now().Add(d)
	c.timer.Reset(d)
}

// Left is what remains of the limit (false: there is none, or it is not
// armed).
func (c *WallClock) Left() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leftLocked()
}

// +checklocks:c.mu
func (c *WallClock) leftLocked() (time.Duration, bool) {
	switch {
	case c.timer == nil:
		return 0, false
	case c.left > 0:
		return c.left, true
	}
	return max(time.Until(c.deadline), 0), true
}

// Spent is how much of its wall clock the agent has used, before a restore
// too; without an armed limit, how long it has run in all.
func (c *WallClock) Spent() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if left, ok := c.leftLocked(); ok {
		return max(c.limit-left, 0)
	}
	return c.used + time.Since(c.started)
}

// Stop stops the clock for good (the sandbox is gone).
func (c *WallClock) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.left = 0
}
