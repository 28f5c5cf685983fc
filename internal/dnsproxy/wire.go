package dnsproxy

// DNS wire helpers: following a CNAME chain, building and fitting a
// reply, and reading a query's name.

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"agentbox.dev/agentbox/internal/netpolicy"
)

// chain keeps the answers that belong to the question: the CNAME chain
// from name and the records of type t at its names. It returns them, their
// addresses and the shortest TTL among them.
func chain(name string, t dnsmessage.Type, rrs []dnsmessage.Resource) ([]dnsmessage.Resource, []netip.Addr, time.Duration) {
	names := map[string]bool{strings.ToLower(name) + ".": true}
	var kept []dnsmessage.Resource
	var addrs []netip.Addr
	ttl := time.Duration(-1)
	// Answers may come in any order: follow the chain until it stops growing.
	used := make([]bool, len(rrs))
	for grew := true; grew; {
		grew = false
		for i, rr := range rrs {
			if used[i] || rr.Header.Class != dnsmessage.ClassINET || !names[strings.ToLower(rr.Header.Name.String())] {
				continue
			}
			var a netip.Addr
			switch b := rr.Body.(type) {
			case *dnsmessage.CNAMEResource:
				names[strings.ToLower(b.CNAME.String())] = true
				grew = true
			case *dnsmessage.AResource:
				if t != dnsmessage.TypeA {
					continue
				}
				a = netip.AddrFrom4(b.A)
			case *dnsmessage.AAAAResource:
				if t != dnsmessage.TypeAAAA {
					continue
				}
				a = netip.AddrFrom16(b.AAAA)
			default:
				continue
			}
			used[i] = true
			kept = append(kept, rr)
			if a.IsValid() {
				addrs = append(addrs, a)
			}
			if d := time.Duration(rr.Header.TTL) * time.Second; ttl < 0 || d < ttl {
				ttl = d
			}
		}
	}
	if ttl < 0 {
		ttl = 0
	}
	return kept, addrs, ttl
}

// reply builds a response to hdr's query.
func reply(hdr dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, answers []dnsmessage.Resource) []byte {
	m := dnsmessage.Message{
		Header: dnsmessage.Header{ID: hdr.ID, Response: true, OpCode: hdr.OpCode, RecursionDesired: hdr.RecursionDesired,
			RecursionAvailable: true, RCode: rcode},
		Answers: answers,
	}
	if q != nil {
		m.Questions = []dnsmessage.Question{*q}
	}
	b, err := m.Pack()
	if err != nil {
		// Only answers can fail to pack; the pod still gets an answer.
		m.Answers, m.RCode = nil, dnsmessage.RCodeServerFailure
		b, _ = m.Pack()
	}
	return b
}

// udpLimit is the largest UDP response the client takes: 512 bytes, or its
// EDNS size up to maxUDP. p has read the questions.
func udpLimit(p *dnsmessage.Parser) int {
	limit := 512
	if p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return limit
	}
	for {
		h, err := p.AdditionalHeader()
		if err != nil {
			return limit
		}
		if h.Type == dnsmessage.TypeOPT && int(h.Class) > limit {
			limit = min(int(h.Class), maxUDP)
		}
		if p.SkipAdditional() != nil {
			return limit
		}
	}
}

// fit truncates a UDP response larger than limit to its question with TC
// set, so the client asks again over TCP.
func fit(resp []byte, hdr dnsmessage.Header, q dnsmessage.Question, limit int, tcp bool) []byte {
	if tcp {
		return resp
	}
	if len(resp) <= limit {
		return resp
	}
	out := dnsmessage.Message{
		Header: dnsmessage.Header{ID: hdr.ID, Response: true, Truncated: true, RecursionDesired: hdr.RecursionDesired,
			RecursionAvailable: true},
		Questions: []dnsmessage.Question{q},
	}
	b, _ := out.Pack()
	return b
}

// hostName reads the question name from a query's wire form and returns it
// in lower case without the final dot, if it is a host name: labels of
// letters, digits, '-' and '_', no compression (a query has nothing to
// point back to).
func hostName(msg []byte) (string, error) {
	const headerLen = 12
	if len(msg) < headerLen+1 {
		return "", errors.New("no question")
	}
	var b strings.Builder
	for off := headerLen; ; {
		if off >= len(msg) {
			return "", errors.New("question name runs past the message")
		}
		n := int(msg[off])
		off++
		if n == 0 {
			break
		}
		if n > 63 {
			return "", errors.New("question name is compressed or has a label over 63 bytes")
		}
		if off+n > len(msg) {
			return "", errors.New("question name runs past the message")
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		if c, ok := netpolicy.AppendHostLabel(&b, msg[off:off+n]); !ok {
			return "", fmt.Errorf("question name has byte %#x: not a host name", c)
		}
		off += n
		if b.Len() > 253 {
			return "", errors.New("question name is over 253 bytes")
		}
	}
	if b.Len() == 0 {
		return "", errors.New("question is for the root")
	}
	return b.String(), nil
}

func typeName(t dnsmessage.Type) string {
	s := t.String()
	return strings.TrimPrefix(s, "Type")
}
