package dnsproxy

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"agentbox.dev/agentbox/internal/netpolicy"
)

// TestGatewayAnswer: with a gateway, the pod is answered the gateway's
// address (A) or no address (AAAA), never what upstream said; upstream's
// addresses are kept for the gateway to dial.
func TestGatewayAnswer(t *testing.T) {
	up := &upstream{answers: map[string][]dnsmessage.Resource{
		"api.example.com.": {rr("api.example.com.", 600, a("192.0.2.10"))},
	}}
	h, calls, decisions := handler(t, up, nil)
	gw := netip.MustParseAddr("169.254.53.53")
	h.Gateway = gw
	resp := parse(t, h.Handle(context.Background(), query(t, 7, "api.example.com.", dnsmessage.TypeA, 0), false))
	if len(resp.Answers) != 1 || resp.Answers[0].Body.(*dnsmessage.AResource).A != gw.As4() {
		t.Fatalf("answers %+v", resp.Answers)
	}
	// The pod may cache the gateway's address as long as the kept answer
	// lasts (upstream's 600 s, bounded to the handler's 30 s floor..1 h).
	if ttl := resp.Answers[0].Header.TTL; ttl != 600 {
		t.Errorf("gateway answer TTL %d, want 600", ttl)
	}
	if len(*calls) != 1 || (*calls)[0].addrs[0] != netip.MustParseAddr("192.0.2.10") {
		t.Fatalf("kept %+v", *calls)
	}
	if d := (*decisions)[0]; d.Gateway != gw || len(d.Addrs) != 1 {
		t.Fatalf("decision %+v", d)
	}
	up.answers["api.example.com."] = []dnsmessage.Resource{rr("api.example.com.", 600, &dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::1").As16()})}
	resp = parse(t, h.Handle(context.Background(), query(t, 8, "api.example.com.", dnsmessage.TypeAAAA, 0), false))
	if resp.RCode != dnsmessage.RCodeSuccess || len(resp.Answers) != 0 {
		t.Fatalf("AAAA: %+v", resp)
	}
}

// TestLookup: the gateway's own resolution goes through the same upstreams
// and withholding as the pod's questions.
func TestLookup(t *testing.T) {
	up := &upstream{answers: map[string][]dnsmessage.Resource{
		"api.example.com.": {rr("api.example.com.", 600, a("192.0.2.10"))},
		"x.cdn.test.":      {rr("x.cdn.test.", 600, a("127.0.0.1"))},
	}}
	h, _, _ := handler(t, up, nil)
	h.Refuse = func(_ netpolicy.Rule, a netip.Addr) string {
		if a.IsLoopback() {
			return "loopback"
		}
		return ""
	}
	rules := h.Plan.Hosts()
	if addrs, err := h.Lookup(context.Background(), rules[0], "api.example.com"); err != nil || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("192.0.2.10") {
		t.Fatalf("lookup: %v %v", addrs, err)
	}
	if _, err := h.Lookup(context.Background(), rules[1], "x.cdn.test"); err == nil || !strings.Contains(err.Error(), "127.0.0.1: loopback") {
		t.Fatalf("withheld: %v", err)
	}
	up.rcode = dnsmessage.RCodeNameError
	if _, err := h.Lookup(context.Background(), rules[0], "api.example.com"); err == nil || !strings.Contains(err.Error(), "NameError") {
		t.Fatalf("nxdomain: %v", err)
	}
}

// TestGatewayKeptAnswer: with a gateway, a question whose kept answer lasts
// is answered without asking upstream (A: the gateway, AAAA: none), with
// the TTL left; a name with no kept answer, or one about to lapse, is
// asked.
func TestGatewayKeptAnswer(t *testing.T) {
	up := &upstream{answers: map[string][]dnsmessage.Resource{
		"api.example.com.": {rr("api.example.com.", 600, a("192.0.2.10"))},
	}}
	h, _, decisions := handler(t, up, nil)
	gw := netip.MustParseAddr("169.254.53.53")
	h.Gateway = gw
	left := 400 * time.Second
	h.Kept = func(r netpolicy.Rule, name string) ([]netip.Addr, time.Duration) {
		if name == "api.example.com" {
			return []netip.Addr{netip.MustParseAddr("192.0.2.10")}, left
		}
		return nil, 0
	}
	resp := parse(t, h.Handle(context.Background(), query(t, 7, "api.example.com.", dnsmessage.TypeA, 0), false))
	if len(up.asked) != 0 || len(resp.Answers) != 1 || resp.Answers[0].Body.(*dnsmessage.AResource).A != gw.As4() || resp.Answers[0].Header.TTL != 400 {
		t.Fatalf("asked %v, answers %+v", up.asked, resp.Answers)
	}
	if d := (*decisions)[0]; !d.Kept || d.Gateway != gw || d.TTL != left || d.Outcome != Answered {
		t.Fatalf("decision %+v", d)
	}
	resp = parse(t, h.Handle(context.Background(), query(t, 8, "api.example.com.", dnsmessage.TypeAAAA, 0), false))
	if len(up.asked) != 0 || resp.RCode != dnsmessage.RCodeSuccess || len(resp.Answers) != 0 {
		t.Fatalf("AAAA: asked %v, %+v", up.asked, resp)
	}
	left = h.MinTTL - time.Second
	h.Handle(context.Background(), query(t, 9, "api.example.com.", dnsmessage.TypeA, 0), false)
	if len(up.asked) != 1 {
		t.Fatalf("an answer about to lapse must be asked again: %v", up.asked)
	}
}
