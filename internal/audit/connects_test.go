package audit

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

func connectTo(dst string, dport int, src string, sport int, pid int) *Record {
	uid := uint32(65532)
	return &Record{Event: "syscall/connect", Time: fmt.Sprintf("t%d", pid), Seq: uint64(100 + pid),
		Process: &Process{PID: int32(pid), Exe: "/usr/bin/curl", Argv: []string{"curl", "https://a.test/"}, Env: []string{"TOKEN=x"}, UID: &uid},
		Dst:     &Endpoint{Family: "inet", IP: dst, Port: dport}, Src: &Endpoint{Family: "inet", IP: src, Port: sport}}
}

// from makes r a record of the gateway's connection from client ("" for
// none).
func from(r *Record, client string) *Record {
	if client != "" {
		ap := netip.MustParseAddrPort(client)
		r.Src = &Endpoint{IP: ap.Addr().String(), Port: int(ap.Port())}
	}
	return r
}

// joinedAtOnce emits r and reports whether it was written at once, joined.
func joinedAtOnce(x *ConnectIndex, r *Record) bool {
	var c collector
	x.Emit(r, c.emit)
	got := c.got()
	return len(got) == 1 && got[0] == r && r.joined
}

func TestConnectIndexJoins(t *testing.T) {
	gw := netip.MustParseAddr("169.254.53.53")
	const client = "10.88.0.7:40001"
	for _, tc := range []struct {
		name   string
		notes  []*Record
		client string
		pid    int // 0: not joined
	}{
		{"the connect that opened it", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7)}, client, 7},
		{"another port's connect", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40002, 7)}, client, 0},
		{"a connect elsewhere", []*Record{connectTo("198.51.100.10", 443, "10.88.0.7", 40001, 7)}, client, 0},
		{"no local address (stock runsc)", []*Record{{Event: "syscall/connect", Process: &Process{PID: 7}, Dst: &Endpoint{IP: "169.254.53.53", Port: 443}}}, client, 0},
		{"not a connect", []*Record{{Event: "syscall/bind", Process: &Process{PID: 7}, Dst: &Endpoint{IP: "169.254.53.53", Port: 443}, Src: &Endpoint{IP: "10.88.0.7", Port: 40001}}}, client, 0},
		{"the port's latest connect", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7), connectTo("169.254.53.53", 80, "10.88.0.7", 40001, 9)}, client, 9},
		{"a v4-mapped client", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7)}, "[::ffff:10.88.0.7]:40001", 7},
		{"a v4-mapped connect", []*Record{connectTo("::ffff:169.254.53.53", 443, "::ffff:10.88.0.7", 40001, 7)}, client, 7},
		{"no client", []*Record{connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7)}, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewConnectIndex(gw, 8)
			for _, r := range tc.notes {
				x.Note(r)
			}
			r := from(TypeEgressRequest.New("Success", "GET", map[string]string{"host": "a.test"}), tc.client)
			ok := joinedAtOnce(x, r)
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
	var c collector
	r := from(&Record{}, client)
	if nilIndex.Emit(r, c.emit); len(c.got()) != 1 || r.joined {
		t.Fatal("a nil index did not write the record at once, unjoined")
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
		return joinedAtOnce(x, from(&Record{}, fmt.Sprintf("10.88.0.7:%d", port)))
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

// collector gathers what Emit wrote.
type collector struct {
	mu   sync.Mutex
	recs []*Record
}

func (c *collector) emit(r *Record) { c.mu.Lock(); c.recs = append(c.recs, r); c.mu.Unlock() }
func (c *collector) got() []*Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Record(nil), c.recs...)
}

// A gateway record written before its connect reached the shim waits for
// it and is joined when it comes; one whose connect never comes is written
// without a process once its wait is over; each exactly once.
func TestConnectIndexWaitsForTheConnect(t *testing.T) {
	gw := netip.MustParseAddr("169.254.53.53")
	x := NewConnectIndex(gw, 8)
	x.wait = 50 * time.Millisecond
	var c collector
	early := TypeEgressRequest.New("Success", "early", nil)
	never := TypeEgressRequest.New("Success", "never", nil)
	x.Emit(from(early, "10.88.0.7:40001"), c.emit)
	x.Emit(from(never, "10.88.0.7:40009"), c.emit)
	if n := len(c.got()); n != 0 {
		t.Fatalf("%d written before their connects", n)
	}
	x.Note(connectTo("169.254.53.53", 443, "10.88.0.7", 40001, 7))
	if got := c.got(); len(got) != 1 || got[0] != early || got[0].Process == nil || got[0].Process.PID != 7 {
		t.Fatalf("after its connect: %+v", got)
	}
	time.Sleep(150 * time.Millisecond)
	got := c.got()
	if len(got) != 2 || got[1] != never || never.Process != nil {
		t.Fatalf("after the wait: %d written, the last %+v", len(got), got[len(got)-1])
	}
	// Known already: written at once, joined.
	now := TypeEgressRequest.New("Success", "now", nil)
	x.Emit(from(now, "10.88.0.7:40001"), c.emit)
	if got := c.got(); len(got) != 3 || got[2] != now || now.Process == nil {
		t.Fatal("a record whose connect is known was not written at once, joined")
	}
}

// The waiting is bounded: past MaxWaiting a record is written at once;
// Flush writes the rest, and from then on nothing waits.
func TestConnectIndexWaitingIsBounded(t *testing.T) {
	x := NewConnectIndex(netip.MustParseAddr("169.254.53.53"), 8)
	var c collector
	for i := 0; i < MaxWaiting+10; i++ {
		x.Emit(from(&Record{}, fmt.Sprintf("10.88.0.7:%d", 1000+i)), c.emit)
	}
	if n := len(c.got()); n != 10 {
		t.Fatalf("%d written at once, want the 10 past MaxWaiting", n)
	}
	x.Flush()
	if n := len(c.got()); n != MaxWaiting+10 {
		t.Fatalf("after Flush %d written, want %d", n, MaxWaiting+10)
	}
	x.Emit(from(&Record{}, "10.88.0.7:1"), c.emit)
	if n := len(c.got()); n != MaxWaiting+11 {
		t.Fatal("a record waited after Flush")
	}
}

// Emits and notes from many goroutines: every record is written exactly
// once, joined when its connect came (go test -race).
func TestConnectIndexConcurrent(t *testing.T) {
	const n = 200
	x := NewConnectIndex(netip.MustParseAddr("169.254.53.53"), n)
	var c collector
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(2)
		port := 2000 + i
		go func() {
			defer wg.Done()
			x.Emit(from(&Record{Message: fmt.Sprint(port)}, fmt.Sprintf("10.88.0.7:%d", port)), c.emit)
		}()
		go func() {
			defer wg.Done()
			x.Note(connectTo("169.254.53.53", 443, "10.88.0.7", port, port))
		}()
	}
	wg.Wait()
	// Every connect is noted: each record was written at its Emit or at
	// its connect's Note, none by the timer (JoinWait is far off).
	got := c.got()
	seen := map[string]bool{}
	for _, r := range got {
		if seen[r.Message] {
			t.Fatalf("%s written twice", r.Message)
		}
		seen[r.Message] = true
		if r.Process == nil || fmt.Sprint(r.Process.PID) != r.Message {
			t.Fatalf("record %s joined to %+v", r.Message, r.Process)
		}
	}
	if len(got) != n {
		t.Fatalf("%d of %d written", len(got), n)
	}
}
