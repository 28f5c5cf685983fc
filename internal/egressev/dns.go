package egressev

import (
	"net/netip"
	"time"
)

// Outcome classifies a resolver's Decision.
type Outcome string

const (
	// DNSAnswered: an allowed name, answered from upstream (any rcode).
	DNSAnswered Outcome = "answered"
	// DNSRefused: a name or query the role does not allow; the pod got
	// NXDOMAIN (names) or an empty answer (other types of allowed names).
	DNSRefused Outcome = "refused"
	// DNSFailed: an allowed name the resolver could not answer (upstream down,
	// rules not updated); the pod got SERVFAIL.
	DNSFailed Outcome = "failed"
	// DNSMalformed: a packet that is not a DNS query; dropped or FORMERR.
	DNSMalformed Outcome = "malformed"
)

// Decision is what the resolver did with one question, for the trail.
// Name comes from the sandbox: it is untrusted and may be anything a valid
// host name is made of.
type Decision struct {
	Outcome Outcome
	Name    string
	Type    string
	// Rule is the allow rule that matched, or why none did.
	Rule string
	// Addrs are the addresses upstream answered that the rule may reach,
	// kept for TTL (the gateway dials them).
	Addrs []netip.Addr
	// Gateway is the address the pod was answered instead (invalid when
	// the answer passed through as it was).
	Gateway netip.Addr
	// Withheld are answered addresses the rule may not open, each with
	// the reason: they are neither allowed nor passed to the pod.
	Withheld []Withheld
	// Kept: answered from the kept answer, without asking upstream.
	Kept bool
	TTL  time.Duration
	// Rcode is the response code the pod got ("" when it got none).
	Rcode string
	Err   error
	TCP   bool
}

// Withheld is an answered address a rule may not open.
type Withheld struct {
	Addr   netip.Addr
	Reason string
}
