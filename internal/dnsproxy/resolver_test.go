package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/nsthread"
)

// testUpstream serves the same answers over UDP and TCP on loopback. Its
// UDP answers to "big." names are truncated, as a real server's would be.
type testUpstream struct {
	udp        *net.UDPConn
	tcp        *net.TCPListener
	mu         sync.Mutex
	tcpQueries int
}

func answerFor(t testing.TB, q []byte, viaTCP bool) []byte {
	var m dnsmessage.Message
	if m.Unpack(q) != nil {
		return nil
	}
	m.Response, m.Additionals = true, nil
	name := m.Questions[0].Name.String()
	n := 1
	if strings.HasPrefix(name, "big.") {
		n = 80
		if !viaTCP {
			m.Truncated = true
			n = 0
		}
	}
	for i := 0; i < n; i++ {
		m.Answers = append(m.Answers, rr(name, 60, &dnsmessage.AResource{A: [4]byte{192, 0, 2, byte(i)}}))
	}
	b, err := m.Pack()
	if err != nil {
		t.Error(err)
	}
	return b
}

func newTestUpstream(t *testing.T) *testUpstream {
	u := &testUpstream{}
	var err error
	if u.udp, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	port := u.udp.LocalAddr().(*net.UDPAddr).Port
	if u.tcp, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := u.udp.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			u.udp.WriteToUDPAddrPort(answerFor(t, buf[:n], false), from)
		}
	}()
	go func() {
		for {
			c, err := u.tcp.Accept()
			if err != nil {
				return
			}
			q, err := readFrame(c, nil)
			if err == nil {
				u.mu.Lock()
				u.tcpQueries++
				u.mu.Unlock()
				writeFrame(c, answerFor(t, q, true))
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { u.udp.Close(); u.tcp.Close() })
	return u
}

func (u *testUpstream) addr() netip.AddrPort {
	return u.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

func ask(t *testing.T, network, name string) (*dnsmessage.Message, error) {
	c, err := net.DialTimeout(network, "169.254.53.53:53", 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	q := query(t, 77, name, dnsmessage.TypeA, 0)
	var raw []byte
	if network == "tcp" {
		if err := writeFrame(c, q); err != nil {
			return nil, err
		}
		raw, err = readFrame(c, nil)
	} else {
		if _, err := c.Write(q); err != nil {
			return nil, err
		}
		buf := make([]byte, 65535)
		var n int
		n, err = c.Read(buf)
		raw = buf[:n]
	}
	if err != nil {
		return nil, err
	}
	var m dnsmessage.Message
	return &m, m.Unpack(raw)
}

// TestResolverBetweenNamespaces runs the resolver for real: its own
// namespace, the link into a pod namespace made here, a loopback upstream,
// and questions over UDP and TCP from inside the pod namespace.
func TestResolverBetweenNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	path := testNetns(t, "dnsproxy")

	up := newTestUpstream(t)
	var mu sync.Mutex
	var allowed []netip.Addr
	var decisions []Decision
	h := &Handler{
		Plan:     plan(t),
		Exchange: Exchange([]netip.AddrPort{up.addr()}),
		Allow: func(r netpolicy.Rule, _ string, addrs []netip.Addr, ttl time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			allowed = append(allowed, addrs...)
			return nil
		},
		MinTTL: time.Minute, MaxTTL: time.Hour,
		Record: func(d Decision) { mu.Lock(); decisions = append(decisions, d); mu.Unlock() },
		ID:     func() uint16 { return 99 },
	}
	r, err := Start(Config{PodNetns: path, Address: netip.MustParseAddr("169.254.53.53"), Peer: netip.MustParseAddr("169.254.53.54"),
		Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	// The resolver's sockets are not in this namespace (asked of the
	// kernel: a packet to the resolver's address from here would leave the
	// machine).
	if out, err := exec.Command("ss", "-H", "-lnup", "sport = :53").CombinedOutput(); err != nil || strings.Contains(string(out), fmt.Sprintf("pid=%d,", os.Getpid())) {
		t.Errorf("port 53 in the shim's namespace: %v %s", err, out)
	}
	nsthread.Run(nsthread.Path(path), func() error {
		m, err := ask(t, "udp", "api.example.com.")
		if err != nil || m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 {
			t.Errorf("UDP, allowed: %v %v", m, err)
		}
		m, err = ask(t, "udp", "elsewhere.test.")
		if err != nil || m.RCode != dnsmessage.RCodeNameError {
			t.Errorf("UDP, refused: %v %v", m, err)
		}
		// 80 addresses: upstream truncates over UDP, the resolver asks again
		// over TCP, then truncates for this 512-byte UDP client...
		m, err = ask(t, "udp", "big.cdn.test.")
		if err != nil || !m.Truncated {
			t.Errorf("UDP, big: %v %v", m, err)
		}
		// ...which gets all of them over TCP.
		m, err = ask(t, "tcp", "big.cdn.test.")
		if err != nil || m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 80 {
			t.Errorf("TCP, big: %v %v", m, err)
		}
		return nil
	})
	mu.Lock()
	if len(allowed) != 1+80+80 || len(decisions) != 4 {
		t.Errorf("allowed %d addresses, %d decisions", len(allowed), len(decisions))
	}
	mu.Unlock()
	up.mu.Lock()
	if up.tcpQueries != 2 {
		t.Errorf("upstream answered %d TCP queries, want 2", up.tcpQueries)
	}
	up.mu.Unlock()

	// Suspended (a quarantined pod), it answers nothing, over UDP or TCP,
	// and asks upstream nothing; resumed, it answers again.
	r.Suspend()
	nsthread.Run(nsthread.Path(path), func() error {
		for _, network := range []string{"udp", "tcp"} {
			c, err := net.DialTimeout(network, "169.254.53.53:53", time.Second)
			if err != nil {
				continue // refused is answering nothing too
			}
			c.SetDeadline(time.Now().Add(300 * time.Millisecond))
			q := query(t, 78, "api.example.com.", dnsmessage.TypeA, 0)
			if network == "tcp" {
				writeFrame(c, q)
			} else {
				c.Write(q)
			}
			if n, err := c.Read(make([]byte, 512)); n > 0 {
				t.Errorf("suspended, %s got %d bytes back (%v)", network, n, err)
			}
			c.Close()
		}
		return nil
	})
	if r.Dropped() != 2 {
		t.Errorf("suspended, dropped %d questions, want 2", r.Dropped())
	}
	r.Resume()
	nsthread.Run(nsthread.Path(path), func() error {
		if m, err := ask(t, "udp", "api.example.com."); err != nil || m.RCode != dnsmessage.RCodeSuccess {
			t.Errorf("resumed: %v %v", m, err)
		}
		return nil
	})

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "-n", filepath.Base(path), "link", "show", PodLink).CombinedOutput(); err == nil {
		t.Errorf("the link outlives the resolver: %s", out)
	}
	// Closing twice, or with the namespace gone, is not an error.
	if err := RemoveLink(path); err != nil {
		t.Error(err)
	}
	if err := RemoveLink("/nonexistent/netns"); err != nil {
		t.Error(err)
	}
}

// TestExchangeFailsOver: a dead upstream is skipped for the next one.
func TestExchangeFailsOver(t *testing.T) {
	dead, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	deadAddr := dead.LocalAddr().(*net.UDPAddr).AddrPort()
	dead.Close()
	up := newTestUpstream(t)
	ex := Exchange([]netip.AddrPort{deadAddr, up.addr()})
	resp, err := ex(context.Background(), query(t, 5, "api.example.com.", dnsmessage.TypeA, 0))
	if err != nil || len(resp) < 12 {
		t.Fatalf("%x %v", resp, err)
	}
	if _, err := Exchange(nil)(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "no upstream") {
		t.Errorf("no upstreams: %v", err)
	}
}

// BenchmarkStart: what a resolver adds to an allowlist pod's start (its
// namespace, sockets, the link and its addresses); its removal, mostly the
// kernel unregistering the veth pair, is not timed.
func BenchmarkStart(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: network namespaces")
	}
	path := testNetns(b, "dnsbench")
	h := &Handler{Plan: plan(b)}
	for i := 0; i < b.N; i++ {
		r, err := Start(Config{PodNetns: path, Address: netip.MustParseAddr("169.254.53.53"), Peer: netip.MustParseAddr("169.254.53.54"), Handler: h})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// TestBusyAnswersAtOnce: past MaxInFlight a question is answered SERVFAIL
// without asking upstream, and recorded; refusals stay refusals.
func TestBusyAnswersAtOnce(t *testing.T) {
	up := &upstream{answers: map[string][]dnsmessage.Resource{"api.example.com.": {rr("api.example.com.", 60, a("192.0.2.1"))}}}
	h, calls, decisions := handler(t, up, nil)
	r := &Resolver{cfg: Config{Handler: h, MaxInFlight: 4}}
	var got []byte
	r.busy(query(t, 3, "api.example.com.", dnsmessage.TypeA, 0), func(b []byte) { got = b })
	var m dnsmessage.Message
	if err := m.Unpack(got); err != nil || m.RCode != dnsmessage.RCodeServerFailure || m.ID != 3 {
		t.Fatalf("busy answer %v %v", m.Header, err)
	}
	if len(up.asked) != 0 || len(*calls) != 0 {
		t.Errorf("busy must not ask upstream (%v) nor allow (%v)", up.asked, *calls)
	}
	if d := (*decisions)[0]; d.Outcome != Failed || !strings.Contains(d.Err.Error(), "resolver busy: 4 questions in flight") {
		t.Errorf("decision %+v", d)
	}
	r.busy(query(t, 4, "elsewhere.test.", dnsmessage.TypeA, 0), func(b []byte) { got = b })
	if err := m.Unpack(got); err != nil || m.RCode != dnsmessage.RCodeNameError {
		t.Errorf("a refused name while busy: %v %v", m.Header, err)
	}
}

// TestResolverTCPFlood: a pod that opens many TCP connections, each
// announcing a 64 KiB frame and sending one byte, holds at most
// MaxTCPConns of them, costs the shim almost nothing, and its resolver
// still answers over UDP.
func TestResolverTCPFlood(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	path := testNetns(t, "dnsflood")
	up := newTestUpstream(t)
	h := &Handler{Plan: plan(t), Exchange: Exchange([]netip.AddrPort{up.addr()}),
		Allow:  func(netpolicy.Rule, string, []netip.Addr, time.Duration) error { return nil },
		MinTTL: time.Minute, MaxTTL: time.Hour, ID: func() uint16 { return 7 }}
	r, err := Start(Config{PodNetns: path, Address: netip.MustParseAddr("169.254.53.53"), Peer: netip.MustParseAddr("169.254.53.54"), Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	const flood = 500
	var conns []net.Conn
	nsthread.Run(nsthread.Path(path), func() error {
		for i := 0; i < flood; i++ {
			c, err := net.DialTimeout("tcp4", "169.254.53.53:53", time.Second)
			if err != nil {
				continue
			}
			c.Write([]byte{0xff, 0xff, 0})
			conns = append(conns, c)
		}
		return nil
	})
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	during := heap()
	var answered bool
	nsthread.Run(nsthread.Path(path), func() error {
		m, err := ask(t, "udp", "api.example.com.")
		answered = err == nil && m.RCode == dnsmessage.RCodeSuccess
		return nil
	})
	r.mu.Lock()
	held := len(r.conns)
	r.mu.Unlock()
	growth := int64(during) - int64(before)
	t.Logf("%d connections opened: %d held, %d rejected; heap %+d KiB", len(conns), held, r.Rejected(), growth>>10)
	if held > defaultMaxTCPConns || r.Rejected() < int64(len(conns)-defaultMaxTCPConns) {
		t.Errorf("held %d, rejected %d of %d: the cap is %d", held, r.Rejected(), len(conns), defaultMaxTCPConns)
	}
	if growth > 4<<20 {
		t.Errorf("the flood grew the heap by %d KiB (announced frames must not be allocated)", growth>>10)
	}
	if !answered {
		t.Error("the resolver must keep answering over UDP during a TCP flood")
	}
}

// dribble sends a frame announcing 64 KiB, one byte per read, and notes
// the largest buffer it was asked to fill.
type dribble struct {
	sent, maxAsked int
}

func (d *dribble) Read(p []byte) (int, error) {
	if len(p) > d.maxAsked {
		d.maxAsked = len(p)
	}
	if d.sent >= 2+10 {
		return 0, io.EOF
	}
	d.sent++
	if d.sent <= 2 {
		p[0] = 0xff
	} else {
		p[0] = 'x'
	}
	return 1, nil
}

// readFrame's buffer grows with the bytes received, not the length
// announced.
func TestReadFrameGrowsWithData(t *testing.T) {
	d := &dribble{}
	started := false
	b, err := readFrame(d, func() { started = true })
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(b) != 10 || !started {
		t.Fatalf("got %d bytes, %v (started %v)", len(b), err, started)
	}
	if d.maxAsked > 4096 {
		t.Fatalf("readFrame offered a %d-byte buffer for a frame that sent 10 bytes", d.maxAsked)
	}
}

// testNetns makes a network namespace for the test (a pod's stand-in) and
// returns its path; it is deleted when the test ends.
func testNetns(t testing.TB, name string) string {
	t.Helper()
	ns := fmt.Sprintf("abx-%s-%d", name, os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return "/var/run/netns/" + ns
}
