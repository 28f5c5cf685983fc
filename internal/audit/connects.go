package audit

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// ConnectIndex remembers the sandbox's latest connects to one address (the
// pod's egress gateway) by the local address each connection got, so that
// a record of what the gateway did with a connection it accepted can name
// the process that opened it. The local address comes from agentbox's
// runsc patch (ConnectLocalAddressField); a connect without one is not
// kept. It holds at most a fixed number of connects, forgetting the
// oldest: an agent that opens connections without end costs it nothing
// more.
//
// A connect event reaches the shim a little after the connect (the
// receiver reads in batches): a gateway record whose connect has not
// arrived yet waits for it (Emit), at most JoinWait and at most
// MaxWaiting records at once; past either it is written without the
// process. Safe for concurrent use (the receiver notes, the gateway
// emits).
type ConnectIndex struct {
	to   netip.Addr
	max  int
	wait time.Duration

	mu    sync.Mutex
	byKey map[netip.AddrPort]connectEntry
	// ring is the keys in the order they were noted; it grows to max (an
	// idle pod's index costs next to nothing), then wraps at next.
	ring []netip.AddrPort
	next int
	// waiting are the records waiting for their connect, oldest first;
	// timer writes them when their time is up.
	waiting []waitingRecord
	timer   *time.Timer
	flushed bool
}

// How long, and how many, gateway records wait for their connect.
const (
	JoinWait   = 2 * time.Second
	MaxWaiting = 256
)

type waitingRecord struct {
	r      *Record
	client netip.AddrPort
	emit   func(*Record)
	until  time.Time
}

type connectEntry struct {
	proc Process
	seq  uint64
	time string
	slot int
}

// NewConnectIndex keeps up to max connects to the address to.
func NewConnectIndex(to netip.Addr, max int) *ConnectIndex {
	if max < 1 {
		max = 1
	}
	return &ConnectIndex{to: to.Unmap(), max: max, wait: JoinWait, byKey: map[netip.AddrPort]connectEntry{}}
}

// Note keeps r if it is a connect to the index's address that carries its
// local address and process, and writes the records that were waiting for
// it. Call it once r is in the trail (its Seq set, or 0 if it was lost).
func (x *ConnectIndex) Note(r *Record) {
	if r.Event != "syscall/connect" || r.Process == nil || r.Dst == nil || r.Src == nil {
		return
	}
	if dst, err := netip.ParseAddr(r.Dst.IP); err != nil || dst.Unmap() != x.to {
		return
	}
	src, ok := endpointAddrPort(r.Src)
	if !ok {
		return
	}
	p := *r.Process
	p.Env = nil // the environment stays with the process's own records
	x.mu.Lock()
	if len(x.ring) < x.max {
		x.ring = append(x.ring, netip.AddrPort{})
	} else if old := x.ring[x.next]; old.IsValid() {
		if e, ok := x.byKey[old]; ok && e.slot == x.next {
			delete(x.byKey, old)
		}
	}
	x.ring[x.next] = src
	x.byKey[src] = connectEntry{proc: p, seq: r.Seq, time: r.Time, slot: x.next}
	x.next = (x.next + 1) % x.max
	var ready []waitingRecord
	if len(x.waiting) > 0 {
		keep := x.waiting[:0]
		for _, w := range x.waiting {
			if w.client == src && x.joinLocked(w.r, src) {
				ready = append(ready, w)
			} else {
				keep = append(keep, w)
			}
		}
		clear(x.waiting[len(keep):])
		x.waiting = keep
	}
	x.mu.Unlock()
	for _, w := range ready {
		w.emit(w.r)
	}
}

// Emit writes r, a record of a connection the gateway accepted (its Src
// is the client), through emit: joined to the connect that opened it at
// once if that connect is known, else once it arrives, or without it
// after JoinWait. A nil index, or a record without a client, is written at
// once.
func (x *ConnectIndex) Emit(r *Record, emit func(*Record)) {
	var client netip.AddrPort
	ok := x != nil && r.Src != nil
	if ok {
		client, ok = endpointAddrPort(r.Src)
	}
	if !ok {
		emit(r)
		return
	}
	x.mu.Lock()
	if x.joinLocked(r, client) || x.flushed || len(x.waiting) >= MaxWaiting {
		x.mu.Unlock()
		emit(r)
		return
	}
	x.waiting = append(x.waiting, waitingRecord{r: r, client: client, emit: emit, until: time.Now().Add(x.wait)})
	if x.timer == nil {
		x.timer = time.AfterFunc(x.wait, x.expire)
	}
	x.mu.Unlock()
}

// expire writes the records whose wait is over, without their process.
func (x *ConnectIndex) expire() {
	now := time.Now()
	x.mu.Lock()
	i := 0
	for i < len(x.waiting) && !x.waiting[i].until.After(now) {
		i++
	}
	due := append([]waitingRecord(nil), x.waiting[:i]...)
	x.waiting = append(x.waiting[:0], x.waiting[i:]...)
	x.timer = nil
	if len(x.waiting) > 0 && !x.flushed {
		x.timer = time.AfterFunc(x.waiting[0].until.Sub(now), x.expire)
	}
	x.mu.Unlock()
	for _, w := range due {
		w.emit(w.r)
	}
}

// Flush writes every waiting record now, without its process, and makes
// Emit write at once from then on: the gateway has stopped and the trail
// is about to end.
func (x *ConnectIndex) Flush() {
	if x == nil {
		return
	}
	x.mu.Lock()
	due := x.waiting
	x.waiting, x.flushed = nil, true
	if x.timer != nil {
		x.timer.Stop()
		x.timer = nil
	}
	x.mu.Unlock()
	for _, w := range due {
		w.emit(w.r)
	}
}

// joinLocked gives r, a record of the connection the gateway accepted
// from client, the process of the connect that opened it, and names that
// connect in r's detail (connect_event, connect_time). It reports whether
// it found one. The caller holds mu.
func (x *ConnectIndex) joinLocked(r *Record, client netip.AddrPort) bool {
	e, ok := x.byKey[client]
	if !ok {
		return false
	}
	p := e.proc
	r.Process, r.joined = &p, true
	if r.Detail == nil {
		r.Detail = map[string]string{}
	}
	if e.seq != 0 {
		r.Detail["connect_event"] = fmt.Sprint(e.seq)
	}
	r.Detail["connect_time"] = e.time
	return true
}

func endpointAddrPort(e *Endpoint) (netip.AddrPort, bool) {
	a, err := netip.ParseAddr(e.IP)
	if err != nil || e.Port <= 0 || e.Port > 65535 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(e.Port)), true
}
