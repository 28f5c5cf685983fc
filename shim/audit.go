package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/audit/forward"
	"agentbox.dev/agentbox/internal/audit/ingest"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/egressrec"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/shim/sandbox"
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
	receiver *ingest.Receiver
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
	prune := func() {
		if removed, err := audit.Prune(cfg.Audit.Dir, spool, cfg.Audit.MaxTotalBytes); err != nil {
			log.L.WithError(err).Warn("agentbox: audit retention")
		} else if len(removed) > 0 {
			log.L.Infof("agentbox: audit retention removed %d ended trail(s) past audit.max_total_bytes: %v", len(removed), removed)
		}
	}
	budget := audit.Budget{MaxBytes: cfg.Audit.MaxSandboxBytes, MinFree: cfg.Audit.MinFreeBytes, Reserve: cfg.Audit.ReserveBytes}
	open := func() (*audit.FileSink, error) {
		file, err := audit.NewFileSink(cfg.Audit.Dir, id, cfg.Audit.MaxFileBytes)
		if err != nil {
			return nil, fmt.Errorf("audit trail: %w", err)
		}
		if err := file.SetBudget(budget); err != nil {
			discardSink(file)
			return nil, errkind.ResourceExhausted(fmt.Errorf("audit trail: %w", err))
		}
		return file, nil
	}
	// Retention reads every trail in the directory: it runs beside the
	// sandbox's start, not in front of it, unless the trail does not fit
	// without it.
	file, err := open()
	if err != nil {
		prune()
		if file, err = open(); err != nil {
			return nil, err
		}
	} else {
		go prune()
	}
	var fwd []audit.Forwarder
	if cfg.Audit.Webhook.URL != "" {
		resumeOnce.Do(func() {
			// Spools left by shims that are gone are delivered from here.
			if n := forward.ResumeSpools(webhookConfig(cfg)); n > 0 {
				log.L.Infof("agentbox: delivering %d audit spool(s) left by earlier shims", n)
			}
		})
		w, err := forward.NewWebhook(webhookConfig(cfg), file.Name())
		if err != nil {
			discardSink(file)
			return nil, fmt.Errorf("audit webhook: %w", err)
		}
		fwd = append(fwd, w)
	}
	return audit.NewTrail(meta, file, fwd...), nil
}

func webhookConfig(cfg *config.Config) forward.WebhookConfig {
	w := cfg.Audit.Webhook
	spool := w.SpoolDir
	if spool == "" {
		spool = filepath.Join(cfg.Audit.Dir, "spool")
	}
	return forward.WebhookConfig{URL: w.URL, SpoolDir: spool, MaxSpoolBytes: w.MaxSpoolBytes, BatchRecords: w.BatchRecords, Format: w.Format}
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
func startReceiver(cfg *config.Config, containerdAddress, id, bundle string, sb *sandboxState, egress *netpolicy.Plan, points audit.Points) (*ingest.Receiver, string, error) {
	a := sb.audit
	scrub, err := scrubberOf(cfg, sb)
	if err != nil {
		return nil, "", err
	}
	opts := ingest.ReceiverOptions{SentryRetries: cfg.Audit.SentryRetries, MaxEventsPerSecond: cfg.Audit.MaxEventsPerSecond}
	if egress != nil && egress.Enforced {
		opts.Annotate = egressrec.ConnectDecision(egress, &sb.live, sb.dnsAddr)
	}
	if links := sb.links; links != nil {
		decide := opts.Annotate
		opts.Annotate = func(r *audit.Record) {
			if decide != nil {
				decide(r)
			}
			links.Annotate(r)
		}
	}
	if sb.connects != nil {
		opts.Emitted = sb.connects.Note
	}
	rcv, err := ingest.Listen(socketPath(cfg, containerdAddress, id), a.trail, scrub, opts)
	if err != nil {
		return nil, "", fmt.Errorf("audit receiver: %w", err)
	}
	b, err := ingest.PodInitConfig(points, rcv.Path(), cfg.Audit.SentryRetries, cfg.Audit.SentrySendBuffer)
	if err == nil {
		err = os.WriteFile(filepath.Join(bundle, podInitFile), b, 0o600)
	}
	if err != nil {
		rcv.Close(0)
		return nil, "", fmt.Errorf("audit: pod init config: %w", err)
	}
	return rcv, filepath.Join(bundle, podInitFile), nil
}

// closeAudit ends a sandbox's trail: the receiver drains, then the end
// record states the totals, with detail (what its cgroup used).
func closeAudit(ctx context.Context, a *sandboxAudit, status string, detail map[string]string) {
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
	end := audit.TypeSandboxEnd.New("Success", "sandbox ended: "+status, detail)
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
		// gVisor watches the sandbox's cgroup, shared by all of a pod's
		// containers, and names the sandbox (the pause container) in its
		// event: each container in the sandbox was killed with it, and the
		// CRI reports OOMKilled only for a container named in a TaskOOM.
		if sb, ok := p.s.sandboxes.sandbox(e.ContainerID); ok {
			sb.oomKills.Add(1)
			for _, id := range sb.members.List() {
				if id != e.ContainerID {
					if err := p.Publisher.Publish(ctx, topic, &events.TaskOOM{ContainerID: id}); err != nil {
						log.G(ctx).WithError(err).WithField("container_id", id).Warn("agentbox: publishing OOM")
					}
				}
			}
		}
	case *events.TaskExit:
		if e.ID == e.ContainerID {
			msg, d := fmt.Sprintf("container exited with status %d", e.ExitStatus), map[string]string{"container_id": e.ContainerID, "exit_status": fmt.Sprint(e.ExitStatus)}
			if sb, ok := p.s.sandboxes.of(e.ContainerID); ok {
				if name := sb.life.Now().SuspendedInto; name != "" {
					msg = fmt.Sprintf("container stopped (status %d): its sandbox was suspended into checkpoint %s", e.ExitStatus, name)
					d["suspended_into"] = name
				}
				if name := sb.life.Now().RestoreFailed; name != "" {
					msg = fmt.Sprintf("container stopped (status %d): its restore from checkpoint %s failed", e.ExitStatus, name)
					d["restore_failed"] = name
				}
			}
			p.s.record(e.ContainerID, audit.TypeContainerExit.New("Success", msg, d), true)
			if sb, ok := p.s.sandboxes.sandbox(e.ContainerID); ok {
				// Legal from every phase but Ended, which fire does not
				// report: nothing is left to do either way.
				_ = sb.fire(ctx, sandbox.Exit, "")
				// Off the publishing path: the shim holds the pod's
				// namespace, so the counters outlive the CRI's teardown;
				// Delete waits for them.
				sb.scheduleDrops(func(ns string) { recordDrops(context.WithoutCancel(ctx), sb, ns) })
			}
		}
	}
	return p.Publisher.Publish(ctx, topic, event)
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

// discardSink closes and removes a trail file the sandbox will not use (it
// was refused before its first record); what cannot be removed is logged,
// and retention prunes it later.
func discardSink(file *audit.FileSink) {
	if err := errors.Join(file.Close(), os.Remove(file.Path())); err != nil {
		log.L.WithError(err).Warn("agentbox: discarding an unused audit trail file")
	}
}
