package netenforce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/nsthread"
)

// Denial is one packet a drop rule refused, as the kernel logged it.
type Denial struct {
	// Rule is the drop rule's name (RuleMetadata, RuleDefaultDeny, ...).
	Rule  string
	Proto string // "tcp", "udp", "icmp", "icmpv6", or the protocol number
	Dst   netip.AddrPort
}

// The nfnetlink_log protocol (linux/netfilter/nfnetlink_log.h).
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1
	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgQthresh = 5
	nfulnlCmdBind   = 1
	nfulnlCopyPkt   = 2
	nfulaPayload    = 9
	nfulaPrefix     = 10
	nfgenmsgLen     = 4
	copyRange       = 96
)

// DenialLog reads the drop rules' log in a pod's network namespace.
type DenialLog struct {
	fd     int
	closed atomic.Bool
	done   chan struct{}
}

// OpenDenialLog binds netpolicy.LogGroup in the namespace at netnsPath.
func OpenDenialLog(netnsPath string) (*DenialLog, error) {
	fd := -1
	err := nsthread.Run(nsthread.Path(netnsPath), func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nflog socket in %s: %w", netnsPath, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nflog bind: %w", err)
	}
	l := &DenialLog{fd: fd}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, copyRange)
	mode[4] = nfulnlCopyPkt
	// One packet per message, sent at once (the default batches up to 100
	// for up to a second).
	qthresh := binary.BigEndian.AppendUint32(nil, 1)
	for _, attr := range []struct {
		typ  uint16
		data []byte
	}{{nfulaCfgCmd, []byte{nfulnlCmdBind}}, {nfulaCfgMode, mode}, {nfulaCfgQthresh, qthresh}} {
		if err := l.config(attr.typ, attr.data); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("nflog group %d: %w", netpolicy.LogGroup, err)
		}
	}
	// A reader that falls behind loses messages (ENOBUFS) rather than
	// blocking the kernel; a large buffer keeps that rare. The receive
	// timeout lets Close stop the reader.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1})
	return l, nil
}

// config sends one config attribute for netpolicy.LogGroup and waits for the ack.
func (l *DenialLog) config(typ uint16, data []byte) error {
	attrLen := 4 + len(data)
	msg := make([]byte, unix.NLMSG_HDRLEN+nfgenmsgLen+align4(attrLen))
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgConfig)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], 1)
	g := msg[unix.NLMSG_HDRLEN:]
	g[0], g[1] = unix.AF_UNSPEC, 0
	binary.BigEndian.PutUint16(g[2:], netpolicy.LogGroup)
	a := g[nfgenmsgLen:]
	binary.NativeEndian.PutUint16(a[0:], uint16(attrLen))
	binary.NativeEndian.PutUint16(a[2:], typ)
	copy(a[4:], data)
	if err := unix.Sendto(l.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(l.fd, buf, 0)
	if err != nil {
		return err
	}
	for _, m := range netlinkMessages(buf[:n]) {
		if m.typ == unix.NLMSG_ERROR && len(m.data) >= 4 {
			if e := int32(binary.NativeEndian.Uint32(m.data)); e != 0 {
				return unix.Errno(-e)
			}
			return nil
		}
	}
	return errors.New("no acknowledgement")
}

// Start delivers the denials logged until Close, and reports log messages
// the kernel could not deliver (the socket overran), on a goroutine.
func (l *DenialLog) Start(deliver func(Denial), lost func(int)) {
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		buf := make([]byte, 1<<16)
		for !l.closed.Load() {
			n, _, err := unix.Recvfrom(l.fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.ENOBUFS) {
					lost(1)
				}
				continue // EAGAIN: the receive timeout, to look at closed
			}
			for _, m := range netlinkMessages(buf[:n]) {
				if m.typ != unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket || len(m.data) < nfgenmsgLen {
					continue
				}
				if d, ok := ParseDenial(m.data[nfgenmsgLen:]); ok {
					deliver(d)
				}
			}
		}
	}()
}

// Close stops the reader, after what it has read is delivered, and closes
// the socket.
func (l *DenialLog) Close() {
	if l.closed.Swap(true) {
		return
	}
	if l.done != nil {
		// The kernel's acknowledgement of a no-op wakes the reader at once
		// (the receive timeout is the fallback).
		noop := make([]byte, unix.NLMSG_HDRLEN)
		binary.NativeEndian.PutUint32(noop[0:], unix.NLMSG_HDRLEN)
		binary.NativeEndian.PutUint16(noop[4:], unix.NLMSG_NOOP)
		binary.NativeEndian.PutUint16(noop[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
		unix.Sendto(l.fd, noop, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		<-l.done
	}
	unix.Close(l.fd)
}

// ParseDenial reads one logged packet's attributes (what follows the
// nfgenmsg header). Only agentbox's own log rules count.
func ParseDenial(attrs []byte) (Denial, bool) {
	var prefix string
	var payload []byte
	for len(attrs) >= 4 {
		alen := int(binary.NativeEndian.Uint16(attrs[0:]))
		typ := binary.NativeEndian.Uint16(attrs[2:]) & 0x3fff
		if alen < 4 || alen > len(attrs) {
			break
		}
		data := attrs[4:alen]
		switch typ {
		case nfulaPayload:
			payload = data
		case nfulaPrefix:
			prefix = string(trimNUL(data))
		}
		attrs = attrs[min(align4(alen), len(attrs)):]
	}
	rule, ok := cutPrefix(prefix)
	if !ok {
		return Denial{}, false
	}
	payload = network(payload)
	d := Denial{Rule: rule}
	var proto byte
	var l4 []byte
	switch {
	case len(payload) >= 20 && payload[0]>>4 == 4:
		ihl := int(payload[0]&0x0f) * 4
		if ihl < 20 || len(payload) < ihl {
			return Denial{}, false
		}
		addr := netip.AddrFrom4([4]byte(payload[16:20]))
		proto, l4 = payload[9], payload[ihl:]
		d.Dst = netip.AddrPortFrom(addr, 0)
	case len(payload) >= 40 && payload[0]>>4 == 6:
		addr := netip.AddrFrom16([16]byte(payload[24:40]))
		proto, l4 = payload[6], payload[40:]
		d.Dst = netip.AddrPortFrom(addr, 0)
	default:
		return Denial{}, false
	}
	switch proto {
	case unix.IPPROTO_TCP:
		d.Proto = "tcp"
	case unix.IPPROTO_UDP:
		d.Proto = "udp"
	case unix.IPPROTO_ICMP:
		d.Proto = "icmp"
	case unix.IPPROTO_ICMPV6:
		d.Proto = "icmpv6"
	default:
		d.Proto = fmt.Sprint(proto)
	}
	if (d.Proto == "tcp" || d.Proto == "udp") && len(l4) >= 4 {
		d.Dst = netip.AddrPortFrom(d.Dst.Addr(), binary.BigEndian.Uint16(l4[2:]))
	}
	return d, true
}

type netlinkMessage struct {
	typ  uint16
	data []byte
}

// netlinkMessages splits a datagram into messages, stopping at the first
// malformed header.
func netlinkMessages(b []byte) []netlinkMessage {
	var out []netlinkMessage
	for len(b) >= unix.NLMSG_HDRLEN {
		n := int(binary.NativeEndian.Uint32(b[0:]))
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			break
		}
		out = append(out, netlinkMessage{typ: binary.NativeEndian.Uint16(b[4:]), data: b[unix.NLMSG_HDRLEN:n]})
		b = b[min(align4(n), len(b)):]
	}
	return out
}

// network finds the IP header of a logged packet. On the netdev egress
// hook the payload starts at the Ethernet header, and the packet header's
// protocol cannot tell (gVisor's packet socket leaves it 0): an Ethernet
// header is taken when its type and what follows agree (for IPv4, down to
// the header checksum); else the payload must start with an IP header.
func network(p []byte) []byte {
	if len(p) >= 14 {
		inner := p[14:]
		switch binary.BigEndian.Uint16(p[12:]) {
		case unix.ETH_P_IP:
			if ipv4HeaderOK(inner) {
				return inner
			}
		case unix.ETH_P_IPV6:
			if len(inner) >= 40 && inner[0]>>4 == 6 {
				return inner
			}
		}
	}
	if len(p) > 0 && p[0]>>4 == 4 && !ipv4HeaderOK(p) {
		return nil
	}
	return p
}

// ipv4HeaderOK checks version, length and checksum of an IPv4 header.
func ipv4HeaderOK(h []byte) bool {
	if len(h) < 20 || h[0]>>4 != 4 {
		return false
	}
	ihl := int(h[0]&0x0f) * 4
	if ihl < 20 || len(h) < ihl {
		return false
	}
	var sum uint32
	for i := 0; i < ihl; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

func cutPrefix(p string) (string, bool) {
	if len(p) < len(netpolicy.LogPrefix) || p[:len(netpolicy.LogPrefix)] != netpolicy.LogPrefix {
		return "", false
	}
	return p[len(netpolicy.LogPrefix):], true
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

func align4(n int) int { return (n + 3) &^ 3 }

// Deduper passes a denial on once per destination and rule per window
// (a refused SYN is retransmitted), counting what it held back.
type Deduper struct {
	Window time.Duration
	mu     sync.Mutex
	seen   map[Denial]time.Time
	held   int
}

// Pass reports whether d is new at now.
func (dd *Deduper) Pass(d Denial, now time.Time) bool {
	dd.mu.Lock()
	defer dd.mu.Unlock()
	if dd.seen == nil {
		dd.seen = map[Denial]time.Time{}
	}
	if t, ok := dd.seen[d]; ok && now.Sub(t) < dd.Window {
		dd.held++
		return false
	}
	if len(dd.seen) > 4096 {
		for k, t := range dd.seen {
			if now.Sub(t) >= dd.Window {
				delete(dd.seen, k)
			}
		}
	}
	dd.seen[d] = now
	return true
}

// Held returns how many denials Pass held back.
func (dd *Deduper) Held() int {
	dd.mu.Lock()
	defer dd.mu.Unlock()
	return dd.held
}
