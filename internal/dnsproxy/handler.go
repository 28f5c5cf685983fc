// Package dnsproxy is the per-pod DNS resolver: it answers only the names
// a role's host rules allow, with the egress gateway's address (keeping
// what upstream answered for the gateway to dial), and refuses every other
// name, so an agent cannot reach an unlisted host by name nor smuggle data
// out in random subdomains. Every question becomes a Decision for the
// audit trail.
//
// Handler is the pure part (bytes in, bytes out, side effects injected);
// Resolver runs it on sockets in a network namespace of its own, wired to
// the pod's namespace by a veth pair.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"agentbox.dev/agentbox/internal/egressev"
	"agentbox.dev/agentbox/internal/netpolicy"
)

// The resolver's records are egressev's.
type (
	Outcome  = egressev.Outcome
	Decision = egressev.Decision
	Withheld = egressev.Withheld
)

const (
	Answered  = egressev.DNSAnswered
	Refused   = egressev.DNSRefused
	Failed    = egressev.DNSFailed
	Malformed = egressev.DNSMalformed
)

// plan is the plan questions are decided by now.
func (h *Handler) plan() *netpolicy.Plan {
	if h.Live != nil {
		if pl := h.Live.Load(); pl != nil {
			return pl
		}
	}
	return h.Plan
}

// Handler answers DNS queries for one pod.
type Handler struct {
	Plan *netpolicy.Plan
	// Live, when set and holding a plan, replaces Plan: the plan a running
	// sandbox was narrowed to (its role tightened while it ran).
	Live *atomic.Pointer[netpolicy.Plan]
	// Refuse, if set, says why a rule may not open an answered address
	// ("" when it may): private, loopback, the node's own (see
	// netpolicy.Destinations). Such addresses are withheld from the pod.
	Refuse func(r netpolicy.Rule, a netip.Addr) string
	// Exchange sends a query upstream and returns the response.
	Exchange func(ctx context.Context, query []byte) ([]byte, error)
	// Allow keeps name's addrs under rule r for ttl (for the gateway to
	// dial); an error fails the query.
	Allow func(r netpolicy.Rule, name string, addrs []netip.Addr, ttl time.Duration) error
	// Remaining, if set, says how long name's kept answer under r lasts if
	// it holds all of addrs (0 otherwise). When that is at least half the
	// allowance, the answer is left as it is and the pod caches for what
	// remains.
	Remaining func(r netpolicy.Rule, name string, addrs []netip.Addr) time.Duration
	// Kept, if set with Gateway, returns name's kept answer under r and
	// how long it lasts: a question it answers (at least MinTTL left) is
	// answered with the gateway without asking upstream, since what the pod
	// is told does not depend on upstream's addresses.
	Kept func(r netpolicy.Rule, name string) ([]netip.Addr, time.Duration)
	// Gateway, if valid, is the egress gateway's address: the pod is
	// answered with it (A) or with no address (AAAA), never with what
	// upstream said, so every connection to an allowed name goes through
	// the gateway.
	Gateway netip.Addr
	// MinTTL and MaxTTL bound how long answered addresses stay allowed
	// (and how long the pod may cache them).
	MinTTL, MaxTTL time.Duration
	// Record receives every decision.
	Record func(Decision)
	// ID makes upstream query IDs (random in production).
	ID func() uint16
}

// maxUDP is the largest UDP response the pod is sent (EDNS's safe size);
// larger answers are truncated so the pod retries over TCP.
const maxUDP = 1232

// Handle answers one query. It returns nil when nothing should be sent back
// (the packet is not a query at all).
func (h *Handler) Handle(ctx context.Context, query []byte, tcp bool) []byte {
	d := Decision{TCP: tcp}
	resp := h.handle(ctx, query, &d)
	if h.Record != nil {
		h.Record(d)
	}
	return resp
}

func (h *Handler) handle(ctx context.Context, query []byte, d *Decision) []byte {
	var p dnsmessage.Parser
	hdr, err := p.Start(query)
	if err != nil || hdr.Response {
		d.Outcome, d.Err = Malformed, errors.New("not a DNS query")
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		d.Outcome, d.Err = Malformed, fmt.Errorf("a query must ask exactly one question (%d, %v)", len(qs), err)
		d.Rcode = dnsmessage.RCodeFormatError.String()
		return reply(hdr, nil, dnsmessage.RCodeFormatError, nil)
	}
	q := qs[0]
	d.Type = typeName(q.Type)
	limit := udpLimit(&p)
	name, err := hostName(query)
	if err != nil {
		d.Outcome, d.Rule, d.Name = Refused, err.Error(), strings.ToValidUTF8(q.Name.String(), "?")
		return h.nxdomain(hdr, q, d)
	}
	d.Name = name
	if hdr.OpCode != 0 {
		d.Outcome, d.Rule, d.Rcode = Refused, fmt.Sprintf("opcode %d not served", hdr.OpCode), dnsmessage.RCodeNotImplemented.String()
		return reply(hdr, &q, dnsmessage.RCodeNotImplemented, nil)
	}
	if q.Class != dnsmessage.ClassINET {
		d.Outcome, d.Rule = Refused, "class "+q.Class.String()+" not served"
		return h.nxdomain(hdr, q, d)
	}
	rule, ok := h.plan().MatchHost(name)
	if !ok {
		d.Outcome, d.Rule = Refused, "no host rule matches"
		return h.nxdomain(hdr, q, d)
	}
	d.Rule = rule.Name
	if q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeAAAA {
		// An allowed name, but only addresses are served: an empty answer
		// tells the client the name exists without the record.
		d.Outcome, d.Rule, d.Rcode = Refused, "query type "+d.Type+" not served ("+rule.Name+")", dnsmessage.RCodeSuccess.String()
		return fit(reply(hdr, &q, dnsmessage.RCodeSuccess, nil), hdr, q, limit, d.TCP)
	}
	if h.Gateway.IsValid() && h.Kept != nil {
		if addrs, left := h.Kept(rule, name); len(addrs) > 0 && left >= h.MinTTL && left >= time.Second {
			left = left.Truncate(time.Second)
			d.Outcome, d.Addrs, d.Rcode, d.TTL, d.Kept = Answered, addrs, dnsmessage.RCodeSuccess.String(), left, true
			answers := gatewayAnswer(q, h.Gateway, left)
			if len(answers) > 0 {
				d.Gateway = h.Gateway
			}
			return fit(reply(hdr, &q, dnsmessage.RCodeSuccess, answers), hdr, q, limit, d.TCP)
		}
	}
	up, err := h.upstream(ctx, name, q.Type)
	if err != nil {
		return h.fail(hdr, q, d, err)
	}
	if up.RCode != dnsmessage.RCodeSuccess {
		d.Outcome, d.Rcode = Answered, up.RCode.String()
		return reply(hdr, &q, up.RCode, nil)
	}
	answers, addrs, ttl := chain(name, q.Type, up.Answers)
	answers, addrs, d.Withheld = h.withhold(rule, answers, addrs)
	allowance := h.allowance(ttl)
	if len(addrs) > 0 {
		if left := h.remaining(rule, name, addrs); left >= allowance/2 {
			allowance = left
		} else if err := h.Allow(rule, name, addrs, allowance); err != nil {
			return h.fail(hdr, q, d, fmt.Errorf("allow %v: %w", addrs, err))
		}
		if h.Gateway.IsValid() {
			answers, d.Gateway = gatewayAnswer(q, h.Gateway, allowance), h.Gateway
		}
	}
	// The pod caches no longer than the rules allow; owners are spelled the
	// way the pod asked.
	for i := range answers {
		if answers[i].Header.TTL > uint32(allowance/time.Second) {
			answers[i].Header.TTL = uint32(allowance / time.Second)
		}
		if strings.EqualFold(answers[i].Header.Name.String(), q.Name.String()) {
			answers[i].Header.Name = q.Name
		}
	}
	d.Outcome, d.Addrs, d.Rcode = Answered, addrs, dnsmessage.RCodeSuccess.String()
	if len(addrs) > 0 {
		d.TTL = allowance
	}
	return fit(reply(hdr, &q, dnsmessage.RCodeSuccess, answers), hdr, q, limit, d.TCP)
}

// withhold takes the addresses the rule may not open out of the answer,
// whichever CNAME led to them.
func (h *Handler) withhold(r netpolicy.Rule, answers []dnsmessage.Resource, addrs []netip.Addr) ([]dnsmessage.Resource, []netip.Addr, []Withheld) {
	if h.Refuse == nil {
		return answers, addrs, nil
	}
	var withheld []Withheld
	bad := map[netip.Addr]bool{}
	var ok []netip.Addr
	for _, a := range addrs {
		if why := h.Refuse(r, a); why != "" {
			withheld = append(withheld, Withheld{Addr: a, Reason: why})
			bad[a] = true
		} else {
			ok = append(ok, a)
		}
	}
	if len(withheld) == 0 {
		return answers, addrs, nil
	}
	var kept []dnsmessage.Resource
	for _, rr := range answers {
		switch b := rr.Body.(type) {
		case *dnsmessage.AResource:
			if bad[netip.AddrFrom4(b.A)] {
				continue
			}
		case *dnsmessage.AAAAResource:
			if bad[netip.AddrFrom16(b.AAAA)] {
				continue
			}
		}
		kept = append(kept, rr)
	}
	return kept, ok, withheld
}

func (h *Handler) nxdomain(hdr dnsmessage.Header, q dnsmessage.Question, d *Decision) []byte {
	d.Rcode = dnsmessage.RCodeNameError.String()
	return reply(hdr, &q, dnsmessage.RCodeNameError, nil)
}

func (h *Handler) fail(hdr dnsmessage.Header, q dnsmessage.Question, d *Decision, err error) []byte {
	d.Outcome, d.Err, d.Rcode = Failed, err, dnsmessage.RCodeServerFailure.String()
	return reply(hdr, &q, dnsmessage.RCodeServerFailure, nil)
}

func (h *Handler) remaining(r netpolicy.Rule, name string, addrs []netip.Addr) time.Duration {
	if h.Remaining == nil {
		return 0
	}
	return h.Remaining(r, name, addrs).Truncate(time.Second)
}

// gatewayAnswer answers q with the gateway's address for ttl (as long as
// the kept answer lasts): one record of q's type if the gateway has an
// address of that family, none otherwise.
func gatewayAnswer(q dnsmessage.Question, gw netip.Addr, ttl time.Duration) []dnsmessage.Resource {
	hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: uint32(ttl / time.Second)}
	switch {
	case q.Type == dnsmessage.TypeA && gw.Is4():
		return []dnsmessage.Resource{{Header: hdr, Body: &dnsmessage.AResource{A: gw.As4()}}}
	case q.Type == dnsmessage.TypeAAAA && gw.Is6() && !gw.Is4In6():
		return []dnsmessage.Resource{{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: gw.As16()}}}
	}
	return nil
}

// Lookup resolves name for rule r the way the pod's questions are (the
// same upstreams, the same withholding), for the gateway's dial: IPv4
// first, then IPv6.
func (h *Handler) Lookup(ctx context.Context, r netpolicy.Rule, name string) ([]netip.Addr, error) {
	var withheld []string
	for _, t := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
		up, err := h.upstream(ctx, name, t)
		if err != nil {
			return nil, err
		}
		if up.RCode != dnsmessage.RCodeSuccess {
			return nil, fmt.Errorf("upstream answered %s", strings.TrimPrefix(up.RCode.String(), "RCode"))
		}
		_, addrs, _ := chain(name, t, up.Answers)
		_, addrs, w := h.withhold(r, nil, addrs)
		for _, x := range w {
			withheld = append(withheld, x.Addr.String()+": "+x.Reason)
		}
		if len(addrs) > 0 {
			return addrs, nil
		}
	}
	if len(withheld) > 0 {
		return nil, fmt.Errorf("every address withheld (%s)", strings.Join(withheld, "; "))
	}
	return nil, errors.New("no address")
}

func (h *Handler) allowance(ttl time.Duration) time.Duration {
	if ttl < h.MinTTL {
		ttl = h.MinTTL
	}
	if h.MaxTTL > 0 && ttl > h.MaxTTL {
		ttl = h.MaxTTL
	}
	return ttl
}

// upstream asks the upstream servers for name and checks that the response
// answers that question.
func (h *Handler) upstream(ctx context.Context, name string, t dnsmessage.Type) (*dnsmessage.Message, error) {
	qn, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return nil, err
	}
	id := uint16(0)
	if h.ID != nil {
		id = h.ID()
	}
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qn, Type: t, Class: dnsmessage.ClassINET}},
	}
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(maxUDP, dnsmessage.RCodeSuccess, false); err != nil {
		return nil, err
	}
	m.Additionals = []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}
	packed, err := m.Pack()
	if err != nil {
		return nil, err
	}
	raw, err := h.Exchange(ctx, packed)
	if err != nil {
		return nil, err
	}
	var resp dnsmessage.Message
	if err := resp.Unpack(raw); err != nil {
		return nil, fmt.Errorf("upstream response: %w", err)
	}
	if !resp.Response || resp.ID != id || len(resp.Questions) != 1 || resp.Questions[0].Type != t ||
		!strings.EqualFold(resp.Questions[0].Name.String(), qn.String()) {
		return nil, errors.New("upstream response does not answer the question")
	}
	return &resp, nil
}
