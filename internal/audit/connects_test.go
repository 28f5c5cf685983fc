package audit

import (
	"fmt"
	"net/netip"
	"testing"
)

func connectTo(dst string, dport int, src string, sport int, pid int) *Record {
	uid := uint32(65532)
	return &Record{Event: "syscall/connect", Time: fmt.Sprintf("t%d", pid), Seq: uint64(100 + pid),
		Process: &Process{PID: int32(pid), Exe: "/usr/bin/curl", Argv: []string{"curl", "https://a.test/"}, Env: []string{"TOKEN=x"}, UID: &uid},
		Dst:     &Endpoint{Family: "inet", IP: dst, Port: dport}, Src: &Endpoint{Family: "inet", IP: src, Port: sport}}
}

func TestConnectIndexJoins(t *testing.T) {
	gw := netip.MustParseAddr("169.254.53.53")
	client := netip.MustParseAddrPort("10.88.0.7:40001")
	for _, tc := range []struct {
		name   string
		notes  []*Record
		client netip.AddrPort
		pid    int // 0: not joined
	}{
		{"the connect that opened it", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7)}, client, 7},
		{"another port's connect", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40002, 7)}, client, 0},
		{"a connect elsewhere", []*Record{connectTo("198.51.100.10", 443, "10.88.0.7", 40001, 7)}, client, 0},
		{"no local address (stock runsc)", []*Record{{Event: "syscall/connect", Process: &Process{PID: 7}, Dst: &Endpoint{IP: "169.254.53.53", Port: 443}}}, client, 0},
		{"not a connect", []*Record{{Event: "syscall/bind", Process: &Process{PID: 7}, Dst: &Endpoint{IP: "169.254.53.53", Port: 443}, Src: &Endpoint{IP: "10.88.0.7", Port: 40001}}}, client, 0},
		{"the port's latest connect", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7), connectTo("169.254.53.53", 80, "10.88.0.7", 40001, 9)}, client, 9},
		{"a v4-mapped client", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7)}, netip.MustParseAddrPort("[::ffff:10.88.0.7]:40001"), 7},
		{"a v4-mapped connect", []*Record{connectTo("::ffff:169.254.53.53", 443, "::ffff:10.88.0.7", 40001, 7)}, client, 7},
		{"no client", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7)}, netip.AddrPort{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewConnectIndex(gw, 8)
			for _, r := range tc.notes {
				x.Note(r)
			}
			r := TypeEgressRequest.New("Success", "GET", map[string]string{"host": "a.test"})
			ok := x.Join(r, tc.client)
			if ok != (tc.pid != 0) {
				t.Fatalf("joined %v, want pid %d", ok, tc.pid)
			}
			if !ok {
				if r.Process != nil || r.joined {
					t.Fatalf("unjoined record has a process: %+v", r.Process)
				}
				return
			}
			if int(r.Process.PID) != tc.pid || !r.joined || r.Detail["connect_event"] != fmt.Sprint(100+tc.pid) || r.Detail["connect_time"] != fmt.Sprintf("t%d", tc.pid) {
				t.Fatalf("record %+v detail %v", r.Process, r.Detail)
			}
			if r.Process.Env != nil {
				t.Fatalf("the connect's environment came along: %v", r.Process.Env)
			}
		})
	}
	var nilIndex *ConnectIndex
	if nilIndex.Join(&Record{}, client) {
		t.Fatal("a nil index joined")
	}
}

// An agent that opens connections without end: the index holds its bound,
// forgets the oldest, and a port noted again is not forgotten with its
// old slot.
func TestConnectIndexBounded(t *testing.T) {
	gw := netip.MustParseAddr("169.254.53.53")
	x := NewConnectIndex(gw, 4)
	for port := 1000; port < 1100; port++ {
		x.Note(connectTo("169.254.53.53", 443, "10.88.0.7", port, port))
	}
	if n := len(x.byKey); n != 4 {
		t.Fatalf("%d connects held, want 4", n)
	}
	at := func(port int) bool {
		return x.Join(&Record{}, netip.AddrPortFrom(netip.MustParseAddr("10.88.0.7"), uint16(port)))
	}
	if at(1095) || !at(1096) || !at(1099) {
		t.Fatal("not the newest four")
	}
	// 1096 again: it takes a new slot; the next three notes reuse the
	// slots after it, including 1096's old one, which must not drop it.
	x.Note(connectTo("169.254.53.53", 443, "10.88.0.7", 1096, 1))
	for port := 2000; port < 2003; port++ {
		x.Note(connectTo("169.254.53.53", 443, "10.88.0.7", port, port))
	}
	if !at(1096) || len(x.byKey) != 4 {
		t.Fatalf("1096 lost when its old slot was reused (%d held)", len(x.byKey))
	}
}
