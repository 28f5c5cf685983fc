package dnsproxy

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func plan(t testing.TB) *netpolicy.Plan {
	p := &policy.Profile{}
	p.Network.Egress = policy.EgressAllowlist
	p.Network.Allow = []policy.EgressRule{
		{Host: "api.example.com", Ports: []int{443}},
		{Host: "*.cdn.test", Ports: []int{443}},
		{CIDR: "10.0.0.0/8"},
	}
	pl, err := netpolicy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

func query(t testing.TB, id uint16, name string, typ dnsmessage.Type, edns int) []byte {
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}},
	}
	if edns > 0 {
		var opt dnsmessage.ResourceHeader
		opt.SetEDNS0(edns, dnsmessage.RCodeSuccess, false)
		m.Additionals = []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rr(name string, ttl uint32, body dnsmessage.ResourceBody) dnsmessage.Resource {
	return dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Class: dnsmessage.ClassINET, TTL: ttl}, Body: body}
}

func a(s string) *dnsmessage.AResource { return &dnsmessage.AResource{A: netip.MustParseAddr(s).As4()} }

// upstream answers from a table, echoing the question as a real server.
type upstream struct {
	answers map[string][]dnsmessage.Resource
	rcode   dnsmessage.RCode
	err     error
	asked   []string
	mangle  func(*dnsmessage.Message)
}

func (u *upstream) exchange(_ context.Context, q []byte) ([]byte, error) {
	if u.err != nil {
		return nil, u.err
	}
	var m dnsmessage.Message
	if err := m.Unpack(q); err != nil {
		return nil, err
	}
	u.asked = append(u.asked, m.Questions[0].Name.String()+" "+m.Questions[0].Type.String())
	m.Response, m.RCode, m.Additionals = true, u.rcode, nil
	m.Answers = u.answers[m.Questions[0].Name.String()]
	if u.mangle != nil {
		u.mangle(&m)
	}
	return m.Pack()
}

type allowCall struct {
	rule  string
	addrs []netip.Addr
	ttl   time.Duration
}

func handler(t testing.TB, up *upstream, allowErr error) (*Handler, *[]allowCall, *[]Decision) {
	var calls []allowCall
	var decisions []Decision
	h := &Handler{
		Plan:     plan(t),
		Exchange: up.exchange,
		Allow: func(r netpolicy.Rule, _ string, addrs []netip.Addr, ttl time.Duration) error {
			calls = append(calls, allowCall{r.Name, addrs, ttl})
			return allowErr
		},
		MinTTL: 30 * time.Second,
		MaxTTL: time.Hour,
		Record: func(d Decision) { decisions = append(decisions, d) },
		ID:     func() uint16 { return 4242 },
	}
	return h, &calls, &decisions
}

func parse(t *testing.T, b []byte) dnsmessage.Message {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatalf("response does not parse: %v", err)
	}
	return m
}

func TestAllowedNameIsAnsweredAndAllowed(t *testing.T) {
	up := &upstream{answers: map[string][]dnsmessage.Resource{
		"api.example.com.": {
			rr("api.example.com.", 300, &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("edge.example.net.")}),
			rr("edge.example.net.", 20, a("192.0.2.10")),
			rr("edge.example.net.", 20, a("192.0.2.11")),
			// Not on the chain: a poisoning attempt is neither answered nor allowed.
			rr("evil.test.", 9999, a("198.51.100.1")),
		},
	}}
	h, calls, decisions := handler(t, up, nil)
	resp := parse(t, h.Handle(context.Background(), query(t, 7, "API.Example.com.", dnsmessage.TypeA, 0), false))
	if resp.ID != 7 || !resp.Response || resp.RCode != dnsmessage.RCodeSuccess || len(resp.Answers) != 3 {
		t.Fatalf("response %+v", resp)
	}
	if resp.Questions[0].Name.String() != "API.Example.com." || resp.Answers[0].Header.Name.String() != "API.Example.com." {
		t.Errorf("the pod's spelling must be kept: %v", resp.Answers[0].Header.Name)
	}
	for _, ans := range resp.Answers {
		if ans.Header.TTL > 30 {
			t.Errorf("TTL %d passes the allowance", ans.Header.TTL)
		}
	}
	if up.asked[0] != "api.example.com. TypeA" {
		t.Errorf("upstream asked %v", up.asked)
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")}
	if len(*calls) != 1 || (*calls)[0].rule != "allow[0] host api.example.com ports [443]" || (*calls)[0].ttl != 30*time.Second ||
		len((*calls)[0].addrs) != 2 || (*calls)[0].addrs[0] != want[0] || (*calls)[0].addrs[1] != want[1] {
		t.Fatalf("allow calls %+v", *calls)
	}
	d := (*decisions)[0]
	if d.Outcome != Answered || d.Name != "api.example.com" || d.Type != "A" || d.TTL != 30*time.Second || len(d.Addrs) != 2 || d.Rcode != "RCodeSuccess" {
		t.Errorf("decision %+v", d)
	}
}

func TestDecisions(t *testing.T) {
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61) + "."
	cases := []struct {
		name     string
		q        []byte
		up       *upstream
		allowErr error
		rcode    dnsmessage.RCode
		answers  int
		outcome  Outcome
		rule     string
		asked    int
		noReply  bool
	}{
		{name: "unlisted name", q: query(t, 1, "x.attacker.test.", dnsmessage.TypeA, 0), rcode: dnsmessage.RCodeNameError, outcome: Refused, rule: "no host rule matches"},
		{name: "random subdomain of an exact rule", q: query(t, 1, "c2VjcmV0.api.example.com.", dnsmessage.TypeA, 0), rcode: dnsmessage.RCodeNameError, outcome: Refused, rule: "no host rule matches"},
		{name: "wildcard", q: query(t, 1, "a.cdn.test.", dnsmessage.TypeAAAA, 0),
			up:    &upstream{answers: map[string][]dnsmessage.Resource{"a.cdn.test.": {rr("a.cdn.test.", 7200, &dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::1").As16()})}}},
			rcode: dnsmessage.RCodeSuccess, answers: 1, outcome: Answered, rule: "allow[1] host *.cdn.test ports [443]", asked: 1},
		{name: "wildcard apex", q: query(t, 1, "cdn.test.", dnsmessage.TypeA, 0), rcode: dnsmessage.RCodeNameError, outcome: Refused, rule: "no host rule matches"},
		{name: "TXT of an allowed name", q: query(t, 1, "api.example.com.", dnsmessage.TypeTXT, 0), rcode: dnsmessage.RCodeSuccess, outcome: Refused, rule: "query type TXT not served (allow[0] host api.example.com ports [443])"},
		{name: "upstream NXDOMAIN", q: query(t, 1, "api.example.com.", dnsmessage.TypeA, 0), up: &upstream{rcode: dnsmessage.RCodeNameError}, rcode: dnsmessage.RCodeNameError, outcome: Answered, rule: "allow[0] host api.example.com ports [443]", asked: 1},
		{name: "upstream down", q: query(t, 1, "api.example.com.", dnsmessage.TypeA, 0), up: &upstream{err: errors.New("timeout")}, rcode: dnsmessage.RCodeServerFailure, outcome: Failed, rule: "allow[0] host api.example.com ports [443]"},
		{name: "rules not updated", q: query(t, 1, "api.example.com.", dnsmessage.TypeA, 0), allowErr: errors.New("nft failed"),
			up:    &upstream{answers: map[string][]dnsmessage.Resource{"api.example.com.": {rr("api.example.com.", 60, a("192.0.2.1"))}}},
			rcode: dnsmessage.RCodeServerFailure, outcome: Failed, rule: "allow[0] host api.example.com ports [443]", asked: 1},
		{name: "upstream answers another question", q: query(t, 1, "api.example.com.", dnsmessage.TypeA, 0),
			up: &upstream{mangle: func(m *dnsmessage.Message) {
				m.Questions[0].Name = dnsmessage.MustNewName("other.test.")
			}},
			rcode: dnsmessage.RCodeServerFailure, outcome: Failed, rule: "allow[0] host api.example.com ports [443]", asked: 1},
		{name: "upstream answers with another id", q: query(t, 1, "api.example.com.", dnsmessage.TypeA, 0),
			up:    &upstream{mangle: func(m *dnsmessage.Message) { m.ID++ }},
			rcode: dnsmessage.RCodeServerFailure, outcome: Failed, rule: "allow[0] host api.example.com ports [443]", asked: 1},
		{name: "a response, not a query", q: func() []byte { b := query(t, 1, "api.example.com.", dnsmessage.TypeA, 0); b[2] |= 0x80; return b }(), outcome: Malformed, noReply: true},
		{name: "short garbage", q: []byte{1, 2, 3}, outcome: Malformed, noReply: true},
		{name: "two questions", q: func() []byte {
			m := dnsmessage.Message{Questions: []dnsmessage.Question{
				{Name: dnsmessage.MustNewName("api.example.com."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET},
				{Name: dnsmessage.MustNewName("x.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
			b, _ := m.Pack()
			return b
		}(), rcode: dnsmessage.RCodeFormatError, outcome: Malformed},
		{name: "binary label", q: func() []byte {
			b := query(t, 1, "api.example.com.", dnsmessage.TypeA, 0)
			b[13] = 0 // "\x00pi.example.com"
			return b
		}(), rcode: dnsmessage.RCodeNameError, outcome: Refused, rule: "question name has byte 0x0: not a host name"},
		{name: "dot inside a label", q: func() []byte {
			b := query(t, 1, "api.example.com.", dnsmessage.TypeA, 0)
			b[14] = '.' // the label "api" becomes "a.i": never "a" and "i"
			return b
		}(), rcode: dnsmessage.RCodeFormatError, outcome: Malformed},
		{name: "longest name", q: query(t, 1, long, dnsmessage.TypeA, 0), rcode: dnsmessage.RCodeNameError, outcome: Refused, rule: "no host rule matches"},
		{name: "chaos class", q: func() []byte {
			m := dnsmessage.Message{Header: dnsmessage.Header{ID: 1}, Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName("api.example.com."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassCHAOS}}}
			b, _ := m.Pack()
			return b
		}(), rcode: dnsmessage.RCodeNameError, outcome: Refused, rule: "class ClassCHAOS not served"},
		{name: "notify opcode", q: func() []byte { b := query(t, 1, "api.example.com.", dnsmessage.TypeA, 0); b[2] |= 4 << 3; return b }(), rcode: dnsmessage.RCodeNotImplemented, outcome: Refused, rule: "opcode 4 not served"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := tc.up
			if up == nil {
				up = &upstream{}
			}
			h, calls, decisions := handler(t, up, tc.allowErr)
			out := h.Handle(context.Background(), tc.q, false)
			d := (*decisions)[0]
			if d.Outcome != tc.outcome || (tc.rule != "" && d.Rule != tc.rule) {
				t.Errorf("decision %+v, want %s %q", d, tc.outcome, tc.rule)
			}
			if len(up.asked) != tc.asked {
				t.Errorf("upstream asked %v, want %d question(s)", up.asked, tc.asked)
			}
			if tc.outcome != Answered && tc.allowErr == nil && len(*calls) != 0 {
				t.Errorf("nothing may be allowed: %+v", *calls)
			}
			if tc.noReply {
				if out != nil {
					t.Errorf("no reply expected, got %x", out)
				}
				return
			}
			resp := parse(t, out)
			if resp.RCode != tc.rcode || len(resp.Answers) != tc.answers || (resp.ID != 1 && tc.outcome != Malformed) {
				t.Errorf("response %v with %d answers, want %v with %d", resp.RCode, len(resp.Answers), tc.rcode, tc.answers)
			}
		})
	}
}

func TestLargeAnswerIsTruncatedOverUDP(t *testing.T) {
	var many []dnsmessage.Resource
	for i := 0; i < 60; i++ {
		many = append(many, rr("api.example.com.", 60, &dnsmessage.AResource{A: [4]byte{192, 0, 2, byte(i)}}))
	}
	up := &upstream{answers: map[string][]dnsmessage.Resource{"api.example.com.": many}}
	h, _, _ := handler(t, up, nil)
	udp := parse(t, h.Handle(context.Background(), query(t, 9, "api.example.com.", dnsmessage.TypeA, 0), false))
	if !udp.Truncated || len(udp.Answers) != 0 {
		t.Errorf("a 60-address answer must be truncated for a 512-byte client: tc=%v answers=%d", udp.Truncated, len(udp.Answers))
	}
	edns := parse(t, h.Handle(context.Background(), query(t, 9, "api.example.com.", dnsmessage.TypeA, 4096), false))
	if edns.Truncated || len(edns.Answers) != 60 {
		t.Errorf("an EDNS client takes 60 addresses over UDP: tc=%v answers=%d", edns.Truncated, len(edns.Answers))
	}
	tcp := parse(t, h.Handle(context.Background(), query(t, 9, "api.example.com.", dnsmessage.TypeA, 0), true))
	if tcp.Truncated || len(tcp.Answers) != 60 {
		t.Errorf("TCP is never truncated: tc=%v answers=%d", tcp.Truncated, len(tcp.Answers))
	}
}

func TestTTLBounds(t *testing.T) {
	for _, tc := range []struct {
		ttl  uint32
		want time.Duration
	}{{0, 30 * time.Second}, {45, 45 * time.Second}, {86400, time.Hour}} {
		up := &upstream{answers: map[string][]dnsmessage.Resource{"api.example.com.": {rr("api.example.com.", tc.ttl, a("192.0.2.1"))}}}
		h, calls, _ := handler(t, up, nil)
		resp := parse(t, h.Handle(context.Background(), query(t, 1, "api.example.com.", dnsmessage.TypeA, 0), false))
		if (*calls)[0].ttl != tc.want {
			t.Errorf("TTL %d: allowed for %v, want %v", tc.ttl, (*calls)[0].ttl, tc.want)
		}
		if got := time.Duration(resp.Answers[0].Header.TTL) * time.Second; got > tc.want || (tc.ttl > 0 && got == 0) {
			t.Errorf("TTL %d: the pod may cache for %v, allowed for %v", tc.ttl, got, tc.want)
		}
	}
}

// FuzzHandle: nothing the sandbox sends crashes the resolver, and whatever
// it answers is a DNS response to the same ID.
func FuzzHandle(f *testing.F) {
	f.Add(query(f, 1, "api.example.com.", dnsmessage.TypeA, 0))
	f.Add(query(f, 2, "x.cdn.test.", dnsmessage.TypeAAAA, 1232))
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})
	f.Fuzz(func(t *testing.T, q []byte) {
		up := &upstream{answers: map[string][]dnsmessage.Resource{"api.example.com.": {rr("api.example.com.", 60, a("192.0.2.1"))}}}
		h, _, decisions := handler(t, up, nil)
		out := h.Handle(context.Background(), q, false)
		if len(*decisions) != 1 {
			t.Fatalf("%d decisions for one packet", len(*decisions))
		}
		if out == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(out); err != nil || !m.Response || len(q) < 2 || m.ID != uint16(q[0])<<8|uint16(q[1]) {
			t.Fatalf("bad response %x to %x: %v", out, q, err)
		}
	})
}

// TestRepeatedAnswerSkipsTheUpdate: an address still allowed for at least
// half the allowance is not updated again, and the pod caches only what
// remains.
func TestRepeatedAnswerSkipsTheUpdate(t *testing.T) {
	up := &upstream{answers: map[string][]dnsmessage.Resource{"api.example.com.": {rr("api.example.com.", 600, a("192.0.2.1"))}}}
	for _, tc := range []struct {
		left    time.Duration
		updates int
		ttl     uint32
	}{{0, 1, 600}, {100 * time.Second, 1, 600}, {400 * time.Second, 0, 400}} {
		h, calls, decisions := handler(t, up, nil)
		h.Remaining = func(netpolicy.Rule, string, []netip.Addr) time.Duration { return tc.left }
		resp := parse(t, h.Handle(context.Background(), query(t, 1, "api.example.com.", dnsmessage.TypeA, 0), false))
		if len(*calls) != tc.updates || resp.Answers[0].Header.TTL != tc.ttl || (*decisions)[0].TTL != time.Duration(tc.ttl)*time.Second {
			t.Errorf("%v left: %d updates, TTL %d, decision %v", tc.left, len(*calls), resp.Answers[0].Header.TTL, (*decisions)[0].TTL)
		}
	}
}

// An allowed name never opens a private, loopback, node or cluster address,
// however many CNAMEs lead there, unless its rule sets allowPrivate; the
// resolver link never.
func TestPrivateAnswersWithheld(t *testing.T) {
	prof := &policy.Profile{}
	prof.Network.Egress = policy.EgressAllowlist
	prof.Network.Allow = []policy.EgressRule{{Host: "api.example.com", Ports: []int{443}}, {Host: "*.corp.test", Ports: []int{443}, AllowPrivate: true}}
	pl, err := netpolicy.Compile(prof)
	if err != nil {
		t.Fatal(err)
	}
	dests := netpolicy.Destinations{
		Local:   func(a netip.Addr) (bool, error) { return a == netip.MustParseAddr("198.51.100.7"), nil },
		Cluster: []netip.Prefix{netip.MustParsePrefix("100.0.0.0/16")},
		Link:    []netip.Addr{netip.MustParseAddr("169.254.53.53"), netip.MustParseAddr("169.254.53.54")},
	}
	chainTo := func(name string, addrs ...string) []dnsmessage.Resource {
		rrs := []dnsmessage.Resource{
			rr(name, 300, &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("hop.example.net.")}),
			rr("hop.example.net.", 300, &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("edge.example.net.")}),
		}
		for _, s := range addrs {
			rrs = append(rrs, rr("edge.example.net.", 60, a(s)))
		}
		return rrs
	}
	up := &upstream{answers: map[string][]dnsmessage.Resource{
		"api.example.com.": chainTo("api.example.com.", "192.0.2.10", "10.1.2.3", "127.0.0.1", "198.51.100.7", "100.0.4.4", "169.254.169.254", "100.64.0.1"),
		"db.corp.test.":    chainTo("db.corp.test.", "10.1.2.3", "198.51.100.7", "169.254.53.53"),
	}}
	h, calls, decisions := handler(t, up, nil)
	h.Plan, h.Refuse = pl, dests.Refuse
	resp := parse(t, h.Handle(context.Background(), query(t, 1, "api.example.com.", dnsmessage.TypeA, 0), false))
	var got []string
	for _, ans := range resp.Answers {
		if b, ok := ans.Body.(*dnsmessage.AResource); ok {
			got = append(got, netip.AddrFrom4(b.A).String())
		}
	}
	if strings.Join(got, ",") != "192.0.2.10" || len(resp.Answers) != 3 {
		t.Fatalf("the pod must get the public address only (and the CNAMEs): %v", resp.Answers)
	}
	if len(*calls) != 1 || len((*calls)[0].addrs) != 1 || (*calls)[0].addrs[0].String() != "192.0.2.10" {
		t.Fatalf("only the public address may be allowed: %+v", *calls)
	}
	reasons := map[string]string{}
	for _, w := range (*decisions)[0].Withheld {
		reasons[w.Addr.String()] = w.Reason
	}
	for addr, want := range map[string]string{
		"10.1.2.3": "private (RFC 1918) 10.0.0.0/8", "127.0.0.1": "loopback", "198.51.100.7": "the node's own address",
		"100.0.4.4": "the cluster's range 100.0.0.0/16", "169.254.169.254": "link-local", "100.64.0.1": "CGNAT",
	} {
		if !strings.Contains(reasons[addr], want) || !strings.Contains(reasons[addr], "allowPrivate") {
			t.Errorf("%s: reason %q, want %q", addr, reasons[addr], want)
		}
	}
	// The opt-in rule opens private and node addresses, never the link.
	*calls = nil
	h.Handle(context.Background(), query(t, 2, "db.corp.test.", dnsmessage.TypeA, 0), false)
	if len(*calls) != 1 || len((*calls)[0].addrs) != 2 {
		t.Fatalf("allowPrivate must open 10.1.2.3 and the node address: %+v", *calls)
	}
	last := (*decisions)[len(*decisions)-1]
	if len(last.Withheld) != 1 || last.Withheld[0].Reason != "the pod's resolver link" {
		t.Fatalf("the resolver link must stay closed: %+v", last.Withheld)
	}
}
