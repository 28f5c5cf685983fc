package audit

import (
	"fmt"
	"net/netip"
	"sync"
)

// ConnectIndex remembers the sandbox's latest connects to one address (the
// pod's egress gateway) by the local address each connection got, so that
// a record of what the gateway did with a connection it accepted can name
// the process that opened it. The local address comes from agentbox's
// runsc patch (ConnectLocalAddressField); a connect without one is not
// kept. It holds at most a fixed number of connects, forgetting the
// oldest: an agent that opens connections without end costs it nothing
// more. Safe for concurrent use (the receiver notes, the gateway joins).
type ConnectIndex struct {
	to  netip.Addr
	max int

	mu    sync.Mutex
	byKey map[netip.AddrPort]connectEntry
	// ring is the keys in the order they were noted; it grows to max (an
	// idle pod's index costs next to nothing), then wraps at next.
	ring []netip.AddrPort
	next int
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
	return &ConnectIndex{to: to.Unmap(), max: max, byKey: map[netip.AddrPort]connectEntry{}}
}

// Note keeps r if it is a connect to the index's address that carries its
// local address and process. Call it once r is in the trail (its Seq set,
// or 0 if it was lost).
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
	defer x.mu.Unlock()
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
}

// Join gives r, a record of the connection the gateway accepted from
// client, the process of the connect that opened it, and names that
// connect in r's detail (connect_event, connect_time). It reports whether
// it found one.
func (x *ConnectIndex) Join(r *Record, client netip.AddrPort) bool {
	if x == nil || !client.IsValid() {
		return false
	}
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	x.mu.Lock()
	e, ok := x.byKey[client]
	x.mu.Unlock()
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
