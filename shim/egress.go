package shim

// The egress lifecycle of a sandbox: rules and the pod's resolver applied
// at Create, denials and drop counters recorded while it runs, all removed
// at Delete.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/egressrec"
	"agentbox.dev/agentbox/internal/netenforce"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/toollink"
)

// applyEgress loads the role's egress rules into the pod's network
// namespace and, under an allowlist, starts the pod's DNS resolver, before
// runsc takes the interfaces over. A sandbox with a new, empty namespace
// has nothing to filter.
func (s *service) applyEgress(ctx context.Context, cfg *config.Config, sb *sandboxState, pl *netpolicy.Plan, spec *specs.Spec) error {
	sb.live.Store(pl)
	ns := netnsPath(spec)
	if !pl.Enforced || ns == "" {
		return nil
	}
	iface, err := netenforce.Apply(ns, pl, dnsproxy.PodLink)
	if err != nil {
		return err
	}
	if iface == "" {
		return nil
	}
	if err := sb.setEgress(ns, iface); err != nil {
		return errors.Join(err, netenforce.Remove(ns))
	}
	detail := map[string]string{"netns": ns, "interface": iface}
	if err := startDenialLog(sb, ns); err != nil {
		// The drop counters still count every packet: a gap in detail,
		// not in enforcement.
		log.G(ctx).WithError(err).Warn("agentbox: egress denial log")
		detail["denial_log"] = "unavailable: " + err.Error()
	}
	detail["metadata_denied"] = strings.Join(pl.DeniedNames(), ", ")
	if pl.Resolver {
		if err := startResolver(cfg, sb, pl, ns); err != nil {
			return err
		}
		detail["resolver"] = sb.dnsAddr.String()
		detail["upstreams"] = fmt.Sprint(sb.upstreams)
		detail["hosts"] = strings.Join(pl.HostNames(), ", ")
		if ca := sb.gatewayCA(); ca != nil {
			var names, injected []string
			for _, r := range pl.Hosts() {
				if r.Inspect {
					names = append(names, r.Host)
				}
			}
			for _, in := range pl.Injects {
				injected = append(injected, in.Header+" -> "+in.Host)
			}
			detail["inspected"] = strings.Join(names, ", ")
			detail["injected"] = strings.Join(injected, ", ")
			detail["gateway_ca"] = ca.Fingerprint()
		}
	}
	sb.audit.trail.Emit(audit.TypeEgressApplied.New("Success",
		fmt.Sprintf("egress %s: %d allow rule(s), default %s", sb.profile.Network.Egress, len(pl.Allow), map[bool]string{true: "accept", false: "deny"}[pl.DefaultAccept]), detail), true)
	return nil
}

// startResolver starts the pod's DNS resolver: its answers go into the
// rules' sets and every question into the trail.
func startResolver(cfg *config.Config, sb *sandboxState, pl *netpolicy.Plan, ns string) error {
	addr, peer, err := cfg.Network.ResolverAddrs()
	if err != nil {
		return err
	}
	ups, err := cfg.Network.UpstreamAddrs("/etc/resolv.conf")
	if err != nil {
		return err
	}
	scrub, err := scrubberOf(cfg, sb)
	if err != nil {
		return err
	}
	cluster, err := cfg.Network.ClusterPrefixes()
	if err != nil {
		return err
	}
	dests := netpolicy.Destinations{Local: nodeLocal, Cluster: cluster, Link: []netip.Addr{addr, peer}}
	sb.resolved = netpolicy.NewResolutions(nil)
	trail := sb.audit.trail
	h := &dnsproxy.Handler{
		Plan:     pl,
		Live:     &sb.live,
		Refuse:   dests.Refuse,
		Exchange: dnsproxy.Exchange(ups),
		Allow: func(r netpolicy.Rule, name string, addrs []netip.Addr, ttl time.Duration) error {
			sb.resolved.Add(r, name, addrs, ttl)
			return nil
		},
		Remaining: sb.resolved.Remaining,
		Kept:      sb.resolved.Kept,
		// Every allowed name is answered with the gateway: no address of a
		// host rule is open on the pod's interface.
		Gateway: addr,
		MinTTL:  time.Duration(cfg.Network.MinTTLSeconds) * time.Second,
		MaxTTL:  time.Duration(cfg.Network.MaxTTLSeconds) * time.Second,
		Record: func(d dnsproxy.Decision) {
			trail.Emit(egressrec.DNS(d, scrub), false)
			for _, w := range d.Withheld {
				trail.Emit(egressrec.Withheld(d, w, scrub), false)
			}
		},
		ID: func() uint16 { return uint16(rand.Uint32()) },
	}
	res, err := dnsproxy.Start(dnsproxy.Config{PodNetns: ns, Address: addr, Peer: peer, Handler: h})
	if err != nil {
		return err
	}
	sb.egressMu.Lock()
	sb.resolver = res
	sb.egressMu.Unlock()
	sb.dnsAddr, sb.upstreams = addr, ups
	return startGateway(cfg, sb, pl, h, res, scrub, dests)
}

// maxGatewayConnects bounds the connects to the gateway a sandbox's trail
// remembers for its records (about 150 bytes each, argv aside).
const maxGatewayConnects = 1024

// startGateway serves the plan's host rules on the resolver's address: the
// names it answered with that address are decided and dialled here. A
// gateway that cannot listen fails the sandbox (fail closed).
func startGateway(cfg *config.Config, sb *sandboxState, pl *netpolicy.Plan, h *dnsproxy.Handler, res *dnsproxy.Resolver, scrub *audit.RoleScrubber, dests netpolicy.Destinations) error {
	ports := pl.HostPorts()
	if len(ports) == 0 {
		return nil
	}
	trail := sb.audit.trail
	// The connects the receiver sees to the gateway, by local address.
	connects := audit.NewConnectIndex(sb.dnsAddr, maxGatewayConnects)
	sb.connects = connects
	for _, r := range pl.Allow {
		if policy.IsModelAPI(r.API) {
			sb.links = toollink.New()
			break
		}
	}
	links := sb.links
	ca, roots, secrets, err := inspection(cfg, sb, pl)
	if err != nil {
		return err
	}
	gw := egressgw.New(egressgw.Config{
		CA: ca, UpstreamRoots: roots, Secrets: secrets,
		Plan: pl, Live: &sb.live,
		// What the resolver answered the pod, else a lookup of its own
		// through the same upstreams and withholding.
		Lookup: func(ctx context.Context, r netpolicy.Rule, name string) ([]netip.Addr, error) {
			if addrs := sb.resolved.Get(r, name); addrs != nil {
				return addrs, nil
			}
			return h.Lookup(ctx, r, name)
		},
		// Decided again at each dial, from the kernel: an answer kept
		// from before the node gained an address does not reach it.
		Refuse: dests.Refuse,
		// Each record is joined to the connect that opened its connection
		// (which may reach the shim a little after the record).
		Record: func(e egressgw.Event) {
			emit := func(r *audit.Record) {
				if links != nil && r.MCP != nil {
					// Linked to the model's tool call that asked for it.
					links.AnnotateMCP(r)
				}
				trail.Emit(r, false)
				if links != nil && r.Model != nil {
					// Its tool calls wait for their processes (its Seq
					// is set now).
					links.Note(r)
				}
			}
			connects.Emit(egressrec.Gateway(e, scrub), emit)
			for _, r := range egressrec.Reflected(e, scrub) {
				connects.Emit(r, emit)
			}
			for _, r := range egressrec.MCPCalls(e, scrub) {
				connects.Emit(r, emit)
			}
		},
	})
	// A key its claim gives: requests for it wait for the claim.
	gw.HoldFor(claimHosts(pl))
	for _, p := range ports {
		ln, err := res.ListenTCP(p)
		if err == nil {
			err = gw.Serve(ln, p)
		}
		if err != nil {
			return errors.Join(fmt.Errorf("egress gateway: listen on %s:%d: %w", sb.dnsAddr, p, err), gw.Close())
		}
	}
	if r := sb.restore; r != nil && !r.template {
		// The budget goes on from what the checkpointed agent had used.
		gw.SetModelUsage(egressgw.ModelUsage{Tokens: r.image.Manifest.ModelTokens, Requests: r.image.Manifest.ModelRequests})
		gw.SetMCPUsage(r.image.Manifest.MCPCalls)
	}
	sb.egressMu.Lock()
	sb.gateway, sb.ca, sb.gatewayPlan = gw, ca, pl
	sb.egressMu.Unlock()
	go watchSecrets(sb, pl, gw)
	return nil
}

// nodeLocal says whether the node's kernel delivers a to the node itself
// (a route of type local or broadcast), asked now: the shim runs in the
// host's network namespace. An address the node gains after a sandbox
// started (a VIP, a new interface, a local route) is the node's from then
// on. An address with no route at all is not the node's.
func nodeLocal(a netip.Addr) (bool, error) {
	routes, err := netlink.RouteGet(net.IP(a.AsSlice()))
	switch {
	case errors.Is(err, unix.ENETUNREACH), errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.EINVAL):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("route lookup of %s: %w", a, err)
	}
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL || r.Type == unix.RTN_BROADCAST {
			return true, nil
		}
	}
	return false, nil
}

// dropsWait bounds how long Delete waits for the drop counters.
const dropsWait = 10 * time.Second

// removeEgress waits for the drop counters, stops the sandbox's resolver
// and denial log, deletes its egress rules and lets the namespace go,
// recording the outcome. It may run twice, and concurrently with the
// root's exit being published.
func removeEgress(ctx context.Context, sb *sandboxState) {
	e, ok := sb.takeEgress()
	if !ok {
		return
	}
	defer e.file.Close()
	if e.dropsDone != nil {
		select {
		case <-e.dropsDone:
		case <-time.After(dropsWait):
			log.G(ctx).Warn("agentbox: egress drop counters not recorded in time")
		}
	}
	if gw := e.gateway; gw != nil {
		if err := gw.Close(); err != nil {
			log.G(ctx).WithError(err).Warn("agentbox: closing the egress gateway")
		}
		// The records still waiting for their connect go in without it.
		sb.connects.Flush()
		sb.audit.trail.Emit(audit.TypeGatewayStopped.New("Success", "egress gateway stopped",
			map[string]string{"connections_rejected": fmt.Sprint(gw.Rejected())}), true)
	}
	if res := e.resolver; res != nil {
		if err := res.Close(); err != nil {
			log.G(ctx).WithError(err).Warn("agentbox: stopping the DNS resolver")
			sb.audit.trail.Emit(audit.TypeResolverStopped.New("Failure", err.Error(), nil), true)
		} else {
			sb.audit.trail.Emit(audit.TypeResolverStopped.New("Success", "resolver stopped and its link removed from "+e.netns,
				map[string]string{"tcp_connections_rejected": fmt.Sprint(res.Rejected())}), true)
		}
	}
	stopDenialLog(sb, e.denials)
	if err := netenforce.Remove(e.held); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: removing egress rules")
		sb.audit.trail.Emit(audit.TypeEgressRemoved.New("Failure", err.Error(), nil), true)
		return
	}
	sb.audit.trail.Emit(audit.TypeEgressRemoved.New("Success", "egress rules removed from "+e.netns, nil), true)
}

// denialWindow is how long repeats of one denial (a retransmitted SYN) are
// counted rather than recorded.
const denialWindow = 10 * time.Second

// startDenialLog records each packet the egress rules drop, as the kernel
// logs it (rate-limited per rule in the ruleset): destination, protocol and
// rule, whatever sent it.
func startDenialLog(sb *sandboxState, ns string) error {
	dl, err := netenforce.OpenDenialLog(ns)
	if err != nil {
		return err
	}
	sb.dedupe = &netenforce.Deduper{Window: denialWindow}
	sb.egressMu.Lock()
	sb.denials = dl
	sb.egressMu.Unlock()
	trail := sb.audit.trail
	dl.Start(func(d netenforce.Denial) {
		if !sb.dedupe.Pass(d, time.Now()) {
			return
		}
		r := audit.TypeEgressDenied.New("Failure",
			fmt.Sprintf("%s to %s dropped: %s", d.Proto, d.Dst, d.Rule),
			map[string]string{"egress": "deny", "egress_rule": d.Rule, "protocol": d.Proto})
		r.Dst = &audit.Endpoint{IP: d.Dst.Addr().String(), Port: int(d.Dst.Port())}
		trail.Emit(r, false)
	}, func(n int) { sb.denialsLost.Add(int64(n)) })
	return nil
}

// stopDenialLog stops the reader; repeats held back and messages the
// kernel could not deliver are stated.
func stopDenialLog(sb *sandboxState, dl *netenforce.DenialLog) {
	if dl == nil {
		return
	}
	dl.Close()
	if held, lost := sb.dedupe.Held(), sb.denialsLost.Load(); held > 0 || lost > 0 {
		sb.audit.trail.Emit(audit.TypeEgressDenied.New("Success",
			fmt.Sprintf("%d repeated denial(s) within %v counted, not recorded; %d log overrun(s)", held, denialWindow, lost),
			map[string]string{"repeats": fmt.Sprint(held), "overruns": fmt.Sprint(lost)}), true)
	}
}

// recordDrops records what the egress rules dropped over the sandbox's
// life, by rule: the packets no connect record shows (UDP without connect,
// retransmissions, anything sent while network auditing is off).
func recordDrops(ctx context.Context, sb *sandboxState, ns string) {
	counters, err := netenforce.Counters(ns)
	if err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: reading egress counters")
		sb.audit.trail.Emit(audit.TypeEgressDrops.New("Failure", "egress counters unreadable: "+err.Error(), nil), true)
		return
	}
	names := make([]string, 0, len(counters))
	for name := range counters {
		names = append(names, name)
	}
	sort.Strings(names)
	detail := map[string]string{}
	var total uint64
	var parts []string
	for _, name := range names {
		c := counters[name]
		total += c.Packets
		detail["dropped "+name] = fmt.Sprintf("%d packets, %d bytes", c.Packets, c.Bytes)
		parts = append(parts, fmt.Sprintf("%s %d", name, c.Packets))
	}
	sb.audit.trail.Emit(audit.TypeEgressDrops.New("Success",
		fmt.Sprintf("%d packets dropped by egress rules (%s)", total, strings.Join(parts, ", ")), detail), true)
}
