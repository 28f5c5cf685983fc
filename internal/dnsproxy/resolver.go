package dnsproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"agentbox.dev/agentbox/internal/nsthread"
)

// PodLink is the resolver's interface in the pod's network namespace. It
// is not the pod's egress interface: gVisor reaches the resolver through it
// and nothing else, since its only route is to the resolver's address.
const PodLink = "agentbox-dns"

// resolverLink is the other end, in the resolver's own namespace.
const resolverLink = "dns0"

// Fixed, locally administered MACs: the pair is a private point-to-point
// link, and a static neighbor entry spares gVisor the ARP round trip.
const (
	resolverMAC = "02:ab:64:6e:73:01"
	podMAC      = "02:ab:64:6e:73:02"
)

// Config places a pod's resolver.
type Config struct {
	// PodNetns is the path of the pod's network namespace.
	PodNetns string
	// Address is what the pod's resolv.conf names; Peer is the pod's
	// address on PodLink.
	Address, Peer netip.Addr
	// Handler answers the questions (its Exchange asks upstream from the
	// shim's own namespace).
	Handler *Handler
	// MaxInFlight bounds the questions handled at once; more are answered
	// SERVFAIL at once (and recorded).
	MaxInFlight int
	// MaxTCPConns bounds the pod's open TCP connections; more are closed
	// as soon as they are accepted, and counted.
	MaxTCPConns int
}

// Limits on what one pod can make its resolver hold (memory outside the
// pod's cgroup): at most MaxTCPConns connections, each holding one frame
// of at most 64 KiB that grows only with bytes actually received, idle
// for at most tcpIdle, and sending its frame within tcpFrame.
const (
	defaultMaxTCPConns = 16
	// tcpIdle closes a pod's TCP connection that sends nothing for this long.
	tcpIdle = 10 * time.Second
	// tcpFrame bounds the time from a frame's length to its last byte.
	tcpFrame = 5 * time.Second
)

// Resolver serves one pod.
type Resolver struct {
	cfg   Config
	nsfd  *os.File
	udp   *net.UDPConn
	tcp   *net.TCPListener
	slots chan struct{}
	wg    sync.WaitGroup
	ctx   context.Context
	stop  context.CancelFunc
	mu    sync.Mutex
	conns map[net.Conn]bool
	// rejected counts TCP connections closed for MaxTCPConns.
	rejected atomic.Int64
	// suspended: every question is dropped unanswered (Suspend).
	suspended atomic.Bool
	// dropped counts questions dropped while suspended.
	dropped atomic.Int64
}

// Suspend makes the resolver answer nothing (a quarantined pod): every
// question is dropped, counted, and open TCP connections are closed. Resume
// undoes it.
func (r *Resolver) Suspend() {
	r.suspended.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
}

// Resume answers questions again.
func (r *Resolver) Resume() { r.suspended.Store(false) }

// Dropped is how many questions were dropped while suspended.
func (r *Resolver) Dropped() int64 { return r.dropped.Load() }

// Rejected is how many TCP connections were closed at once because the
// pod held MaxTCPConns already.
func (r *Resolver) Rejected() int64 { return r.rejected.Load() }

// Start creates the resolver's network namespace (held by the shim
// process only: it disappears with the shim, taking the link with it),
// links it to the pod's namespace, and serves UDP and TCP on port 53.
func Start(cfg Config) (*Resolver, error) {
	if !cfg.Address.Is4() || !cfg.Peer.Is4() {
		return nil, fmt.Errorf("resolver addresses %s and %s must be IPv4", cfg.Address, cfg.Peer)
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 128
	}
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = defaultMaxTCPConns
	}
	r := &Resolver{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight), conns: map[net.Conn]bool{}}
	var err error
	if r.nsfd, r.udp, r.tcp, err = listenInNewNetns(); err != nil {
		return nil, fmt.Errorf("resolver namespace: %w", err)
	}
	if err := r.link(); err != nil {
		r.closeSockets()
		return nil, err
	}
	r.ctx, r.stop = context.WithCancel(context.Background())
	r.wg.Add(2)
	go r.serveUDP()
	go r.serveTCP()
	return r, nil
}

// link creates the veth pair and addresses both ends, over netlink
// sockets opened in each namespace (no process is started).
func (r *Resolver) link() (err error) {
	pod, err := netns.GetFromPath(r.cfg.PodNetns)
	if err != nil {
		return fmt.Errorf("open %s: %w", r.cfg.PodNetns, err)
	}
	defer pod.Close()
	hr, err := netlink.NewHandleAt(netns.NsHandle(r.nsfd.Fd()))
	if err != nil {
		return fmt.Errorf("netlink in the resolver's namespace: %w", err)
	}
	defer hr.Close()
	hp, err := netlink.NewHandleAt(pod)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", r.cfg.PodNetns, err)
	}
	defer hp.Close()
	rmac, _ := net.ParseMAC(resolverMAC)
	pmac, _ := net.ParseMAC(podMAC)
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: resolverLink, HardwareAddr: rmac},
		PeerName:  PodLink, PeerHardwareAddr: pmac, PeerNamespace: netlink.NsFd(pod),
	}
	if err := hr.LinkAdd(veth); err != nil {
		return fmt.Errorf("link the resolver to %s: add veth: %w", r.cfg.PodNetns, err)
	}
	defer func() {
		if err != nil {
			if l, lerr := hp.LinkByName(PodLink); lerr == nil {
				hp.LinkDel(l)
			}
			err = fmt.Errorf("link the resolver to %s: %w", r.cfg.PodNetns, err)
		}
	}()
	// The link carries IPv4 DNS only: no IPv6 addresses on the pod's side
	// (set before it is up, or it gets a link-local one).
	if err := nsthread.Run(nsthread.Fd(int(pod)), func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/"+PodLink+"/disable_ipv6", []byte("1"), 0)
	}); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("disable IPv6 on %s: %w", PodLink, err)
	}
	for _, end := range []struct {
		h          *netlink.Handle
		name       string
		self, peer netip.Addr
		peerMAC    net.HardwareAddr
	}{{hr, resolverLink, r.cfg.Address, r.cfg.Peer, pmac}, {hp, PodLink, r.cfg.Peer, r.cfg.Address, rmac}} {
		l, err := end.h.LinkByName(end.name)
		if err != nil {
			return fmt.Errorf("%s: %w", end.name, err)
		}
		idx := l.Attrs().Index
		if err := end.h.AddrAdd(l, &netlink.Addr{IPNet: hostNet(end.self)}); err != nil {
			return fmt.Errorf("%s: address %s: %w", end.name, end.self, err)
		}
		if err := end.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("%s: up: %w", end.name, err)
		}
		if err := end.h.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: hostNet(end.peer), Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("%s: route to %s: %w", end.name, end.peer, err)
		}
		// A static neighbor spares gVisor the ARP round trip (runsc copies
		// permanent entries).
		if err := end.h.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: end.peer.AsSlice(), HardwareAddr: end.peerMAC}); err != nil {
			return fmt.Errorf("%s: neighbor %s: %w", end.name, end.peer, err)
		}
	}
	return nil
}

// ListenTCP opens a TCP listener on the resolver's address at port, in the
// resolver's namespace: the egress gateway's listeners, reached by the pod
// over the same link.
func (r *Resolver) ListenTCP(port int) (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := nsthread.Run(nsthread.Fd(int(r.nsfd.Fd())), func() (err error) {
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: r.cfg.Address.AsSlice(), Port: port})
		return err
	})
	return ln, err
}

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

// RemoveLink deletes the resolver's link from the pod's namespace (which
// deletes both ends). A namespace or link already gone is not an error.
func RemoveLink(podNetns string) error {
	pod, err := netns.GetFromPath(podNetns)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer pod.Close()
	h, err := netlink.NewHandleAt(pod)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(PodLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return h.LinkDel(l)
}

// listenInNewNetns creates a network namespace and opens the resolver's
// sockets in it.
func listenInNewNetns() (nsfd *os.File, udp *net.UDPConn, tcp *net.TCPListener, err error) {
	err = nsthread.Run(nsthread.New, func() (err error) {
		if nsfd, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			return err
		}
		if udp, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 53}); err != nil {
			return err
		}
		tcp, err = net.ListenTCP("tcp4", &net.TCPAddr{Port: 53})
		return err
	})
	if err != nil {
		if nsfd != nil {
			nsfd.Close()
		}
		if udp != nil {
			udp.Close()
		}
		if tcp != nil {
			tcp.Close()
		}
		return nil, nil, nil, err
	}
	return nsfd, udp, tcp, nil
}

func (r *Resolver) serveUDP() {
	defer r.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := r.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if r.suspended.Load() {
			r.dropped.Add(1)
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		select {
		case r.slots <- struct{}{}:
		default:
			r.busy(q, func(b []byte) { r.udp.WriteToUDPAddrPort(b, from) })
			continue
		}
		r.wg.Add(1)
		go func() {
			defer func() { <-r.slots; r.wg.Done() }()
			if resp := r.cfg.Handler.Handle(r.ctx, q, false); resp != nil {
				r.udp.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

// busy answers SERVFAIL without asking upstream, and records it.
func (r *Resolver) busy(q []byte, send func([]byte)) {
	h := *r.cfg.Handler
	h.Exchange = func(context.Context, []byte) ([]byte, error) {
		return nil, fmt.Errorf("resolver busy: %d questions in flight", r.cfg.MaxInFlight)
	}
	if resp := h.Handle(r.ctx, q, false); resp != nil {
		send(resp)
	}
}

func (r *Resolver) serveTCP() {
	defer r.wg.Done()
	for {
		c, err := r.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		r.mu.Lock()
		full := len(r.conns) >= r.cfg.MaxTCPConns
		if !full {
			r.conns[c] = true
		}
		r.mu.Unlock()
		if full {
			r.rejected.Add(1)
			c.Close()
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() {
				r.mu.Lock()
				delete(r.conns, c)
				r.mu.Unlock()
				c.Close()
			}()
			for {
				c.SetReadDeadline(time.Now().Add(tcpIdle))
				q, err := readFrame(c, func() { c.SetReadDeadline(time.Now().Add(tcpFrame)) })
				if err != nil {
					return
				}
				if r.suspended.Load() {
					r.dropped.Add(1)
					return
				}
				var resp []byte
				select {
				case r.slots <- struct{}{}:
					resp = r.cfg.Handler.Handle(r.ctx, q, true)
					<-r.slots
				default:
					r.busy(q, func(b []byte) { resp = b })
				}
				if resp == nil {
					return
				}
				if writeFrame(c, resp) != nil {
					return
				}
			}
		}()
	}
}

// readFrame reads one length-prefixed DNS message. Its buffer grows with
// the bytes received, not with the length announced; started is called
// once the length is read (to start the frame's deadline).
func readFrame(c io.Reader, started func()) ([]byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	if started != nil {
		started()
	}
	want := int64(binary.BigEndian.Uint16(n[:]))
	var b bytes.Buffer
	got, err := b.ReadFrom(io.LimitReader(c, want))
	if err == nil && got < want {
		err = io.ErrUnexpectedEOF
	}
	return b.Bytes(), err
}

func writeFrame(c io.Writer, b []byte) error {
	out := make([]byte, 2+len(b))
	binary.BigEndian.PutUint16(out, uint16(len(b)))
	copy(out[2:], b)
	_, err := c.Write(out)
	return err
}

func (r *Resolver) closeSockets() {
	r.udp.Close()
	r.tcp.Close()
	r.nsfd.Close()
}

// Close stops serving, waits for questions in flight, and removes the
// link from the pod's namespace. The resolver's namespace goes with its
// last reference.
func (r *Resolver) Close() error {
	r.stop()
	r.udp.Close()
	r.tcp.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	err := RemoveLink(r.cfg.PodNetns)
	r.nsfd.Close()
	return err
}

// upstreamTimeout bounds one upstream attempt.
const upstreamTimeout = 2 * time.Second

// Exchange sends query to the upstream servers in order over UDP (over TCP
// when the answer is truncated) and returns the first response.
func Exchange(upstreams []netip.AddrPort) func(ctx context.Context, query []byte) ([]byte, error) {
	return func(ctx context.Context, query []byte) ([]byte, error) {
		if len(upstreams) == 0 {
			return nil, errors.New("no upstream resolver configured")
		}
		var errs []error
		for _, u := range upstreams {
			resp, err := exchangeOnce(ctx, "udp", u, query)
			if err == nil && len(resp) > 2 && resp[2]&0x02 != 0 { // TC
				resp, err = exchangeOnce(ctx, "tcp", u, query)
			}
			if err == nil {
				return resp, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", u, err))
			if ctx.Err() != nil {
				break
			}
		}
		return nil, errors.Join(errs...)
	}
}

// exchangeOnce asks one upstream over network ("udp" or "tcp").
func exchangeOnce(ctx context.Context, network string, u netip.AddrPort, query []byte) ([]byte, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	c, err := d.DialContext(ctx, network, u.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	if network == "tcp" {
		if err := writeFrame(c, query); err != nil {
			return nil, err
		}
		return readFrame(c, nil)
	}
	if _, err := c.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// A response to another query (or garbage) is not the answer.
		if n >= 2 && bytes.Equal(buf[:2], query[:2]) {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}
