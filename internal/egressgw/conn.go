package egressgw

// One connection to the gateway: the first bytes decide plain HTTP, TLS
// passed through by its SNI, or TLS terminated to inspect each request;
// then the dial, and the splice.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
)

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// handle reads what a connection starts with and decides: TLS by its SNI
// (spliced), HTTP by each request's Host (forwarded), anything else
// refused.
func (g *Gateway) handle(c net.Conn, port int, front portFronts) {
	ev := Event{Client: addrPort(c.RemoteAddr()), Port: port}
	start := time.Now()
	if why := g.suspendedFor(); why != "" {
		g.refuse(c, &ev, start, "the gateway is suspended: "+why)
		return
	}
	br := bufio.NewReaderSize(c, MaxHello+64)
	c.SetReadDeadline(start.Add(g.cfg.HelloTimeout))
	first, err := br.Peek(1)
	if err != nil {
		g.refuse(c, &ev, start, "nothing sent within "+g.cfg.HelloTimeout.String()+": the gateway decides by a TLS ClientHello or an HTTP request")
		return
	}
	if IsTLS(first) {
		ev.Proto = "tls"
		g.passthrough(c, br, &ev, start, front.tls)
		return
	}
	if first[0] < 'A' || first[0] > 'Z' {
		g.refuse(c, &ev, start, fmt.Sprintf("neither TLS nor HTTP (first byte %#x): a host rule carries TLS or HTTP only", first[0]))
		return
	}
	c.SetReadDeadline(time.Time{})
	// HTTP: the front's server reads each request and this connection's
	// slot is freed when it closes the connection.
	if !front.plain.ln.hand(&prefixConn{Conn: c, r: br, done: func() { g.release(c) }}) {
		g.release(c)
	}
}

func (g *Gateway) refuse(c net.Conn, ev *Event, start time.Time, reason string) {
	ev.Kind, ev.Reason, ev.Duration = Refused, reason, time.Since(start)
	g.cfg.Record(*ev)
	g.release(c)
}

// passthrough decides a TLS connection by its ClientHello's SNI and
// splices it to the name's server: the gateway dials what it resolved. An
// inspected rule's connection is terminated instead, and its requests go
// to the TLS front.
func (g *Gateway) passthrough(c net.Conn, br *bufio.Reader, ev *Event, start time.Time, front *httpFront) {
	h, err := peekHello(br)
	if err != nil {
		g.refuse(c, ev, start, "ClientHello: "+err.Error())
		return
	}
	ev.SNI = h.SNI
	if h.SNI == "" {
		g.refuse(c, ev, start, "the ClientHello names no server (no SNI)")
		return
	}
	rule, why := Decide(g.plan(), h.SNI, ev.Port)
	ev.Rule = rule.Name
	if why != "" {
		g.refuse(c, ev, start, why)
		return
	}
	// An encrypted ClientHello's real name is hidden inside it: spliced,
	// it would reach whatever site behind the allowed outer name it
	// names. Terminated, it cannot: the gateway is the server, holds no
	// ECH key, and answers for the outer name alone (a client using real
	// ECH then gives up; Chrome's GREASE ECH, sent on every connection,
	// goes on). Chromium 156 sends GREASE ECH whatever --disable-features
	// says; its policy EncryptedClientHelloEnabled=false stops it.
	if h.ECH && !rule.Inspect {
		g.refuse(c, ev, start, "an encrypted ClientHello (ECH) hides the name it is for, and "+rule.Name+" passes TLS through: inspect the rule, or turn ECH off in the client (Chrome and Chromium: the policy EncryptedClientHelloEnabled=false)")
		return
	}
	g.allowedAs(c, h.SNI, ev.Port)
	if rule.Inspect {
		g.terminate(c, br, ev, start, h.SNI, front)
		return
	}
	up, dialled, err := g.dial(g.ctx, rule, h.SNI, ev.Port)
	ev.Dialled = dialled
	if err != nil {
		g.refuse(c, ev, start, err.Error())
		return
	}
	c.SetReadDeadline(time.Time{})
	ev.Sent, ev.Received = splice(c, up, br, g.cfg.IdleTimeout)
	up.Close()
	ev.Kind, ev.Duration = Passthrough, time.Since(start)
	g.cfg.Record(*ev)
	g.release(c)
}

// terminate completes the agent's TLS handshake with a certificate for sni
// from the sandbox's CA, and hands the connection to the TLS front, which
// decides each request.
func (g *Gateway) terminate(c net.Conn, br *bufio.Reader, ev *Event, start time.Time, sni string, front *httpFront) {
	if g.cfg.CA == nil {
		g.refuse(c, ev, start, "the rule is inspected but the gateway has no CA")
		return
	}
	name, err := HostName(sni)
	if err != nil {
		g.refuse(c, ev, start, "SNI: "+err.Error())
		return
	}
	leaf, err := g.cfg.CA.Leaf(name)
	if err != nil {
		g.refuse(c, ev, start, err.Error())
		return
	}
	// The TLS connection owns c from here: closing it releases the slot.
	tc := tls.Server(&prefixConn{Conn: c, r: br, done: func() { g.release(c) }}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	tc.SetDeadline(start.Add(g.cfg.HelloTimeout))
	if err := tc.HandshakeContext(g.ctx); err != nil {
		ev.Kind, ev.Proto, ev.Duration = Refused, "https", time.Since(start)
		ev.Reason = "TLS handshake with the gateway (the client must trust the sandbox's CA): " + clipName(err.Error())
		g.cfg.Record(*ev)
		tc.Close()
		return
	}
	tc.SetDeadline(time.Time{})
	if !front.ln.hand(tc) {
		tc.Close()
	}
}

// peekHello reads until br holds a whole ClientHello (or too much).
func peekHello(br *bufio.Reader) (Hello, error) {
	for {
		b, _ := br.Peek(br.Buffered())
		h, err := ParseClientHello(b)
		if !errors.Is(err, ErrNeedMore) {
			return h, err
		}
		if br.Buffered() >= MaxHello {
			return Hello{}, fmt.Errorf("over %d bytes", MaxHello)
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return Hello{}, fmt.Errorf("incomplete: %w", err)
		}
	}
}

// dial resolves name for rule and connects to the first address that
// answers, on port.
func (g *Gateway) dial(ctx context.Context, rule netpolicy.Rule, name string, port int) (net.Conn, string, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.DialTimeout)
	defer cancel()
	addrs, err := g.cfg.Lookup(ctx, rule, name)
	if err != nil {
		return nil, "", fmt.Errorf("resolve %s: %w", name, err)
	}
	if len(addrs) == 0 {
		return nil, "", fmt.Errorf("resolve %s: no address the rule may reach", name)
	}
	var errs []error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(port)).String()
		if g.cfg.Refuse != nil {
			if why := g.cfg.Refuse(rule, a); why != "" {
				errs = append(errs, fmt.Errorf("%s withheld: %s", a, why))
				continue
			}
		}
		c, err := g.cfg.Dial(ctx, "tcp", ap)
		if err == nil {
			return c, ap, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, netip.AddrPortFrom(addrs[0], uint16(port)).String(), fmt.Errorf("connect %s: %w", name, errors.Join(errs...))
}

// splice copies both ways until both ends are done or nothing moves for
// idle. The agent's bytes are read through br, which holds its first ones;
// sent counts them, received what went to the agent.
func splice(agent, up net.Conn, br *bufio.Reader, idle time.Duration) (sent, received int64) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	copyDir := func(dst, src net.Conn, r io.Reader, n *int64, buf []byte) {
		defer wg.Done()
		for {
			src.SetReadDeadline(time.Now().Add(idle))
			k, err := r.Read(buf)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:k]); werr != nil {
					agent.Close()
					up.Close()
					return
				}
				*n += int64(k)
			}
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < idle {
					continue // the other direction is moving
				}
				if errors.Is(err, io.EOF) {
					if cw, ok := dst.(interface{ CloseWrite() error }); ok {
						cw.CloseWrite()
						return
					}
				}
				agent.Close()
				up.Close()
				return
			}
		}
	}
	wg.Add(2)
	go copyDir(up, agent, br, &sent, make([]byte, 32<<10))
	// Toward the agent, large copies: what has arrived from the site goes
	// on in one write, so the sandbox gets fewer, larger packets and
	// acknowledges fewer (its netstack's CPU per byte, under its role's
	// CPU limit, is what a download's speed comes to). Pooled, and only
	// this way: uploads gained nothing from it, and a connection holds its
	// buffers for its whole life.
	down := bufferPool{}.Get()
	defer bufferPool{}.Put(down)
	go copyDir(agent, up, up, &received, down)
	wg.Wait()
	return sent, received
}
