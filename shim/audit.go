package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netpolicy"
)

// podInitFile is the runsc --pod-init-config the shim writes per sandbox.
const podInitFile = "agentbox-pod-init.json"

// receiverDrain is how long a deleted sandbox's receiver keeps reading what
// the sandbox already sent.
const receiverDrain = 2 * time.Second

var resumeOnce sync.Once

// sandboxAudit is a sandbox's trail and the receiver that feeds it.
type sandboxAudit struct {
	trail    *audit.Trail
	receiver *audit.Receiver
	// scrub is the sandbox's scrubber (its role's env allowlist and the
	// config's redactions), for exec records too.
	scrub *audit.RoleScrubber
	// stopWatch ends the full-trail watch (watchFull), once.
	stopWatch chan struct{}
	stopOnce  sync.Once
}

// watchFull watches a sandbox's trail: when its records stop fitting, it
// records why (once per episode, from the trail's reserve), and when that
// lasts full_grace_seconds under on_full = "stop", it stops the sandbox.
// Under "stall" the sandbox stays held back: the receiver does not read its
// events, and gVisor's retries slow it down.
func (s *service) watchFull(cfg *config.Config, sb *sandboxState) {
	a := sb.audit
	a.stopWatch = make(chan struct{})
	stop := a.stopWatch
	grace := time.Duration(cfg.Audit.FullGraceSeconds) * time.Second
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		var episode time.Time
		stopped := false
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			full, since := a.trail.Full()
			if full == nil {
				episode = time.Time{}
				continue
			}
			if !since.Equal(episode) {
				episode = since
				a.trail.Emit(audit.TypeAuditFull.New("Failure",
					fmt.Sprintf("the sandbox's records do not fit (%s): it is held back; on_full=%s after %v", full.Reason, cfg.Audit.OnFull, grace),
					map[string]string{"reason": full.Reason, "on_full": cfg.Audit.OnFull}), true)
			}
			if cfg.Audit.OnFull == "stop" && !stopped && time.Since(since) >= grace {
				stopped = true
				s.stopSandbox(sb.id, "audit", fmt.Sprintf("audit trail full for %v (%s): stopping the sandbox (audit.on_full = stop)", grace, full.Reason))
			}
		}
	}()
}

// openTrail starts the trail of a sandbox root. Failing to start it refuses
// the container: nothing runs unaudited.
func openTrail(cfg *config.Config, id string, meta audit.Meta) (*audit.Trail, error) {
	spool := ""
	if cfg.Audit.Webhook.URL != "" {
		spool = webhookConfig(cfg).SpoolDir
	}
	if removed, err := audit.Prune(cfg.Audit.Dir, spool, cfg.Audit.MaxTotalBytes); err != nil {
		log.L.WithError(err).Warn("agentbox: audit retention")
	} else if len(removed) > 0 {
		log.L.Infof("agentbox: audit retention removed %d ended trail(s) past audit.max_total_bytes: %v", len(removed), removed)
	}
	file, err := audit.NewFileSink(cfg.Audit.Dir, id, cfg.Audit.MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	if err := file.SetBudget(audit.Budget{MaxBytes: cfg.Audit.MaxSandboxBytes, MinFree: cfg.Audit.MinFreeBytes, Reserve: cfg.Audit.ReserveBytes}); err != nil {
		file.Close()
		os.Remove(file.Path())
		return nil, errkind.ResourceExhausted(fmt.Errorf("audit trail: %w", err))
	}
	var fwd []audit.Forwarder
	if cfg.Audit.Webhook.URL != "" {
		resumeOnce.Do(func() {
			// Spools left by shims that are gone are delivered from here.
			if n := audit.ResumeSpools(webhookConfig(cfg)); n > 0 {
				log.L.Infof("agentbox: delivering %d audit spool(s) left by earlier shims", n)
			}
		})
		w, err := audit.NewWebhook(webhookConfig(cfg), file.Name())
		if err != nil {
			file.Close()
			os.Remove(file.Path())
			return nil, fmt.Errorf("audit webhook: %w", err)
		}
		fwd = append(fwd, w)
	}
	return audit.NewTrail(meta, file, fwd...), nil
}

func webhookConfig(cfg *config.Config) audit.WebhookConfig {
	w := cfg.Audit.Webhook
	spool := w.SpoolDir
	if spool == "" {
		spool = filepath.Join(cfg.Audit.Dir, "spool")
	}
	return audit.WebhookConfig{URL: w.URL, SpoolDir: spool, MaxSpoolBytes: w.MaxSpoolBytes, BatchRecords: w.BatchRecords}
}

// socketPath is a sandbox's audit socket: short, since unix socket paths
// are, and distinct per containerd instance.
func socketPath(cfg *config.Config, containerdAddress, id string) string {
	sum := sha256.Sum256([]byte(containerdAddress + "\x00" + id))
	return filepath.Join(cfg.Audit.SocketDir, hex.EncodeToString(sum[:8])+".sock")
}

// scrubberOf returns the sandbox's scrubber (its role's env allowlist and
// the config's redactions), made once for the receiver, the resolver and
// exec records.
func scrubberOf(cfg *config.Config, sb *sandboxState) (*audit.RoleScrubber, error) {
	if sb.audit.scrub == nil {
		scrub, err := audit.NewScrubber(sb.profile.EnvAllowed, cfg.Audit.Redact)
		if err != nil {
			return nil, err
		}
		sb.audit.scrub = scrub
	}
	return sb.audit.scrub, nil
}

// startReceiver listens on the sandbox's socket and writes runsc's
// --pod-init-config pointing at it.
func startReceiver(cfg *config.Config, containerdAddress, id, bundle string, sb *sandboxState, egress *netpolicy.Plan) (*audit.Receiver, string, error) {
	p, a := sb.profile, sb.audit
	scrub, err := scrubberOf(cfg, sb)
	if err != nil {
		return nil, "", err
	}
	rcv, err := audit.Listen(socketPath(cfg, containerdAddress, id), a.trail, scrub)
	if err != nil {
		return nil, "", fmt.Errorf("audit receiver: %w", err)
	}
	rcv.SetRate(cfg.Audit.MaxEventsPerSecond)
	if egress != nil && egress.Enforced {
		var resolved netpolicy.Resolved
		if sb.resolved != nil {
			resolved = sb.resolved.Has
		}
		rcv.Annotate = egressDecision(egress, resolved, sb.dnsAddr)
	}
	b, err := audit.PodInitConfig(audit.Points{Process: p.Audit.Process, File: p.Audit.File, Network: p.Audit.Network}, rcv.Path(), cfg.Audit.SentryRetries)
	if err == nil {
		err = os.WriteFile(filepath.Join(bundle, podInitFile), b, 0o600)
	}
	if err != nil {
		rcv.Close(0)
		return nil, "", fmt.Errorf("audit: pod init config: %w", err)
	}
	return rcv, filepath.Join(bundle, podInitFile), nil
}

// egressDecision adds to each connect record what the egress rules do with
// its destination, and which rule decides. DNS to the pod's resolver
// (dnsAddr) does not pass the rules: it has a link of its own.
func egressDecision(pl *netpolicy.Plan, resolved netpolicy.Resolved, dnsAddr netip.Addr) func(*audit.Record) {
	return func(r *audit.Record) {
		if r.Event != "syscall/connect" || r.Dst == nil || r.Dst.IP == "" {
			return
		}
		addr, err := netip.ParseAddr(r.Dst.IP)
		if err != nil {
			return
		}
		allow, rule := pl.Decide(addr, r.Dst.Port, resolved)
		if dnsAddr.IsValid() && addr.Unmap() == dnsAddr && r.Dst.Port == netpolicy.DNSPort {
			allow, rule = true, "pod resolver"
		}
		if r.Detail == nil {
			r.Detail = map[string]string{}
		}
		r.Detail["egress"] = map[bool]string{true: "allow", false: "deny"}[allow]
		r.Detail["egress_rule"] = rule
	}
}

// dnsRecord turns a resolver decision into a record. The name comes from
// the sandbox: it is scrubbed like argv.
func dnsRecord(d dnsproxy.Decision, scrub *audit.RoleScrubber) *audit.Record {
	name := d.Name
	if scrub != nil {
		name = scrub.Args([]string{name})[0]
	}
	detail := map[string]string{"name": name, "type": d.Type, "rule": d.Rule, "rcode": d.Rcode,
		"transport": map[bool]string{true: "tcp", false: "udp"}[d.TCP]}
	status := "Failure"
	typ := map[dnsproxy.Outcome]audit.RecordType{dnsproxy.Answered: audit.TypeDNSAnswered, dnsproxy.Refused: audit.TypeDNSRefused,
		dnsproxy.Failed: audit.TypeDNSFailed, dnsproxy.Malformed: audit.TypeDNSMalformed}[d.Outcome]
	var msg string
	switch d.Outcome {
	case dnsproxy.Answered:
		status = "Success"
		var addrs []string
		for _, a := range d.Addrs {
			addrs = append(addrs, a.String())
		}
		detail["addresses"] = strings.Join(addrs, ", ")
		var withheld []string
		for _, w := range d.Withheld {
			withheld = append(withheld, w.Addr.String()+": "+w.Reason)
		}
		detail["withheld"] = strings.Join(withheld, "; ")
		if d.TTL > 0 {
			detail["allowed_for"] = d.TTL.String()
		}
		msg = fmt.Sprintf("%s %s answered %s (%s)", d.Type, name, d.Rcode, d.Rule)
	case dnsproxy.Refused:
		msg = fmt.Sprintf("%s %s refused: %s", d.Type, name, d.Rule)
	default:
		msg = fmt.Sprintf("%s %s %s", d.Type, name, d.Outcome)
	}
	for k, v := range detail {
		if v == "" {
			delete(detail, k)
		}
	}
	if d.Err != nil {
		detail["error"] = d.Err.Error()
		msg += ": " + d.Err.Error()
	}
	return typ.New(status, msg, detail)
}

// withheldRecord says that an answered address was not opened, and why.
func withheldRecord(d dnsproxy.Decision, w dnsproxy.Withheld, scrub *audit.RoleScrubber) *audit.Record {
	name := d.Name
	if scrub != nil {
		name = scrub.Args([]string{name})[0]
	}
	return audit.TypeDNSWithheld.New("Failure",
		fmt.Sprintf("%s %s answered %s, not opened: %s", d.Type, name, w.Addr, w.Reason),
		map[string]string{"name": name, "type": d.Type, "rule": d.Rule, "address": w.Addr.String(), "reason": w.Reason})
}

// closeAudit ends a sandbox's trail: the receiver drains, then the end
// record states the totals.
func closeAudit(ctx context.Context, a *sandboxAudit, status string) {
	if a == nil {
		return
	}
	// A receiver held back by a full trail must not hold up the end.
	a.trail.Drain()
	if a.stopWatch != nil {
		a.stopOnce.Do(func() { close(a.stopWatch) })
	}
	if a.receiver != nil {
		a.receiver.Close(receiverDrain)
	}
	end := audit.TypeSandboxEnd.New("Success", "sandbox ended: "+status, nil)
	if err := a.trail.Close(end); err != nil {
		log.G(ctx).WithError(err).Error("agentbox: audit trail closed with losses")
	}
}

// auditingPublisher records the task events the shim publishes that the
// audit trail needs (exits, OOM kills), then forwards them.
type auditingPublisher struct {
	cdshim.Publisher
	s *service
}

func (p *auditingPublisher) Publish(ctx context.Context, topic string, event cdevents.Event) error {
	switch e := event.(type) {
	case *events.TaskOOM:
		p.s.record(e.ContainerID, audit.TypeLimit.New("Failure", "out of memory: the container was OOM-killed", map[string]string{"limit": "memory", "container_id": e.ContainerID}), true)
	case *events.TaskExit:
		if e.ID == e.ContainerID {
			p.s.record(e.ContainerID, audit.TypeContainerExit.New("Success", fmt.Sprintf("container exited with status %d", e.ExitStatus),
				map[string]string{"container_id": e.ContainerID, "exit_status": fmt.Sprint(e.ExitStatus)}), true)
			if sb, ok := p.s.sandboxes.sandbox(e.ContainerID); ok {
				// Off the publishing path: the shim holds the pod's
				// namespace, so the counters outlive the CRI's teardown;
				// Delete waits for them.
				sb.scheduleDrops(func(ns string) { recordDrops(context.WithoutCancel(ctx), sb, ns) })
			}
		}
	}
	return p.Publisher.Publish(ctx, topic, event)
}

// denialWindow is how long repeats of one denial (a retransmitted SYN) are
// counted rather than recorded.
const denialWindow = 10 * time.Second

// startDenialLog records each packet the egress rules drop, as the kernel
// logs it (rate-limited per rule in the ruleset): destination, protocol and
// rule, whatever sent it.
func startDenialLog(sb *sandboxState, ns string) error {
	dl, err := netpolicy.OpenDenialLog(ns)
	if err != nil {
		return err
	}
	sb.dedupe = &netpolicy.Deduper{Window: denialWindow}
	sb.egressMu.Lock()
	sb.denials = dl
	sb.egressMu.Unlock()
	trail := sb.audit.trail
	dl.Start(func(d netpolicy.Denial) {
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
func stopDenialLog(sb *sandboxState, dl *netpolicy.DenialLog) {
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
	counters, err := netpolicy.Counters(ns)
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

// record writes a shim record to the trail of the container's sandbox.
func (s *service) record(containerID string, r *audit.Record, urgent bool) {
	sb, ok := s.sandboxes.of(containerID)
	if !ok || sb.audit == nil {
		return
	}
	if r.Container == "" {
		r.Container = containerID
	}
	sb.audit.trail.Emit(r, urgent)
}

func joinChanges(changes []string) string { return strings.Join(changes, "; ") }
