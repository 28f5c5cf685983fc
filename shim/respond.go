package shim

// Responding to a running sandbox: each sandbox's control socket
// (internal/control), on which root quarantines and releases it, freezes
// and thaws it, or stops it. Each response is recorded in the sandbox's own
// trail (Remediation Activity), with the reason and who asked, as the
// kernel named the peer. A quarantine that cannot be applied never leaves
// the sandbox as it was: it is frozen instead, or stopped.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/netpolicy"
)

// response is what an admin's responses hold on a sandbox now.
type response struct {
	// applying serializes what changes the sandbox's enforcement: an
	// admin's requests and its role's live tightening (a release must not
	// load rules a tightening is replacing).
	applying sync.Mutex
	mu       sync.Mutex
	// quarantined is the quarantine's reason ("" when there is none).
	// Protected by mu.
	quarantined   string
	quarantinedAt time.Time
	// frozen: runsc paused the sandbox at frozenAt. Protected by mu.
	frozen   bool
	frozenAt time.Time
	// stopped: an admin (or a failed quarantine) stopped it. Protected
	// by mu.
	stopped bool
	// commands numbers the requests applied. Protected by mu.
	commands int
	// liveDigest is the digest of the role version the sandbox took the
	// tightenings of (its start digest until its role changes); seen the
	// newest version it was told of. Protected by mu.
	liveDigest, seen string
}

func (r *response) isFrozen() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.frozen
}

// startControl serves the sandbox's control socket. A sandbox that could
// not be reached to respond to does not start.
func (s *service) startControl(cfg *config.Config, sb *sandboxState) error {
	path := control.SocketPath(cfg.Shim.ControlDir, s.containerdAddress, sb.id)
	srv, err := control.Listen(path, uint32(os.Geteuid()), func(ctx context.Context, peer control.Peer, req control.Request) control.Response {
		return s.respond(ctx, cfg, sb, peer, req)
	})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	sb.ctl = srv
	return nil
}

// stopControl closes the sandbox's control socket (at Delete).
func stopControl(sb *sandboxState) {
	if sb.ctl != nil {
		sb.ctl.Close()
	}
}

// respond applies one request (the control server serializes them).
func (s *service) respond(ctx context.Context, cfg *config.Config, sb *sandboxState, peer control.Peer, req control.Request) control.Response {
	ctx = log.WithLogger(ctx, log.L.WithField("sandbox_id", sb.id))
	who := map[string]string{"requested_by_uid": fmt.Sprint(peer.UID), "requested_by_pid": fmt.Sprint(peer.PID)}
	if req.Op != control.OpInfo {
		sb.resp.mu.Lock()
		sb.resp.commands++
		who["command_uid"] = fmt.Sprintf("%s/%s-%d", sb.id, req.Op, sb.resp.commands)
		sb.resp.mu.Unlock()
		if req.Reason != "" {
			who["reason"] = req.Reason
		}
	}
	var msg string
	var err error
	var cp *control.Checkpointed
	if req.Op != control.OpInfo {
		sb.resp.applying.Lock()
		defer sb.resp.applying.Unlock()
	}
	switch req.Op {
	case control.OpInfo:
	case control.OpQuarantine:
		msg, err = s.quarantine(ctx, sb, who)
	case control.OpRelease:
		msg, err = s.release(sb, who)
	case control.OpFreeze:
		msg, err = s.freeze(ctx, sb, who)
	case control.OpThaw:
		msg, err = s.thaw(ctx, sb, who)
	case control.OpStop:
		msg, err = s.stopByAdmin(ctx, sb, who)
	case control.OpCheckpoint, control.OpSuspend:
		msg, cp, err = s.checkpointByAdmin(ctx, sb, req, who)
	}
	if req.Op != control.OpInfo {
		l := log.G(ctx).WithFields(log.Fields{"op": req.Op, "uid": peer.UID, "pid": peer.PID})
		if err != nil {
			l.WithError(err).Warn("agentbox: control request failed")
		} else {
			l.Info("agentbox: " + msg)
		}
	}
	resp := control.Response{OK: err == nil, Message: msg, Sandbox: s.info(cfg, sb), Checkpoint: cp}
	if err != nil {
		resp.Error = err.Error()
	}
	return resp
}

// info is what the sandbox runs and what holds now.
func (s *service) info(cfg *config.Config, sb *sandboxState) *control.Sandbox {
	p := sb.profile
	in := &control.Sandbox{ID: sb.id, Namespace: sb.audit.trail.Meta().Namespace, Role: p.Role, StartDigest: p.Digest,
		Egress: string(p.Network.Egress), EgressNow: string(p.Network.Egress), State: "running",
		Containers: s.sandboxes.containersOf(sb), Trail: filepath.Join(cfg.Audit.Dir, audit.FileName(sb.id)), Started: sb.started}
	if m := sb.audit.trail.Meta(); sb.inCRI && m.PodName != "" {
		// Only a CRI pod sandbox: its name is the CRI's, not a claim.
		in.Pod = m.PodNamespace + "/" + m.PodName
	}
	if d, ok := s.sandboxes.wallClockLeft(sb); ok {
		in.WallClockLeft = d.Round(time.Second).String()
	}
	if pl := sb.live.Load(); pl != nil {
		in.EgressNow = pl.Mode()
	}
	sb.resp.mu.Lock()
	defer sb.resp.mu.Unlock()
	in.LiveDigest = sb.liveDigestLocked()
	if sb.resp.quarantined != "" {
		in.Quarantined, in.QuarantineReason, in.EgressNow = true, sb.resp.quarantined, "none (quarantined)"
	}
	switch {
	case sb.resp.stopped:
		in.State = "stopping"
	case sb.resp.frozen:
		in.State = "frozen"
	}
	return in
}

// egressSummary says what the sandbox's egress is, for records.
func egressSummary(sb *sandboxState) string {
	pl := sb.live.Load()
	if pl == nil || sb.egress().netns == "" {
		return string(sb.profile.Network.Egress) + " (no network interface)"
	}
	mode := pl.Mode()
	var rules []string
	for _, r := range pl.Allow {
		rules = append(rules, r.Name)
	}
	def := "deny"
	if pl.DefaultAccept {
		def = "accept"
	}
	return fmt.Sprintf("%s: %s; default %s", mode, strings.Join(rules, ", "), def)
}

// quarantine cuts the sandbox's egress: every packet it sends is dropped
// (its interface and the resolver's link), its resolver answers nothing,
// its gateway closes every connection and refuses new ones. The agent
// keeps running. If that cannot be done, the sandbox is frozen, or if that
// fails too, stopped.
func (s *service) quarantine(ctx context.Context, sb *sandboxState, detail map[string]string) (string, error) {
	start := time.Now()
	sb.resp.mu.Lock()
	already, since := sb.resp.quarantined, sb.resp.quarantinedAt
	sb.resp.mu.Unlock()
	if already != "" {
		return fmt.Sprintf("already quarantined since %s: %s", since.UTC().Format(time.RFC3339), already), nil
	}
	detail["egress_before"] = egressSummary(sb)
	detail["egress_after"] = "none: every packet the sandbox sends is dropped; its resolver and gateway answer nothing"
	cut, err := cutEgress(sb, "quarantined: "+detail["reason"])
	detail["cut"] = strings.Join(cut, "; ")
	if err != nil {
		fallback, ferr := s.failClosed(ctx, sb)
		detail["error"], detail["fallback"] = err.Error(), fallback
		rec := audit.TypeQuarantined.New("Failure", fmt.Sprintf("quarantine failed (%v): the sandbox was %s instead", err, fallback), detail)
		sb.audit.trail.Emit(rec, true)
		if ferr != nil {
			return "", fmt.Errorf("quarantine failed (%v), and so did freezing (%v): the sandbox was %s", err, ferr, fallback)
		}
		return "", fmt.Errorf("quarantine failed (%v): the sandbox was %s instead", err, fallback)
	}
	sb.resp.mu.Lock()
	sb.resp.quarantined, sb.resp.quarantinedAt = detail["reason"], time.Now()
	sb.resp.mu.Unlock()
	took := time.Since(start)
	detail["applied_in"] = took.Round(time.Microsecond).String()
	msg := fmt.Sprintf("quarantined in %v: %s", took.Round(time.Microsecond), detail["cut"])
	sb.audit.trail.Emit(audit.TypeQuarantined.New("Success", msg, detail), true)
	return msg, nil
}

// cutEgress does a quarantine's cuts and says what it cut; the error is
// the first that failed (a cut that failed is not listed).
func cutEgress(sb *sandboxState, why string) ([]string, error) {
	e := sb.egress()
	var cut []string
	if e.netns != "" {
		ifaces := []string{e.iface}
		if e.resolver != nil {
			ifaces = append(ifaces, dnsproxy.PodLink)
		}
		if err := netpolicy.Quarantine(e.held, ifaces...); err != nil {
			return cut, err
		}
		cut = append(cut, "every packet dropped on "+strings.Join(ifaces, " and "))
	}
	if e.resolver != nil {
		e.resolver.Suspend()
		cut = append(cut, "resolver answers nothing")
	}
	if e.gateway != nil {
		n := e.gateway.Suspend(why)
		cut = append(cut, fmt.Sprintf("gateway refuses every connection (%d open closed)", n))
	}
	if len(cut) == 0 {
		cut = append(cut, "nothing to cut: the sandbox has no network interface")
	}
	return cut, nil
}

// failClosed freezes a sandbox whose rules could not be loaded (a
// quarantine, a tightening), else stops it, and says which.
func (s *service) failClosed(ctx context.Context, sb *sandboxState) (string, error) {
	return fallBack(func() error { return s.pause(ctx, sb) }, func() error { s.kill(ctx, sb); return nil })
}

// fallBack is failClosed's order: freeze, else stop.
func fallBack(freeze, stop func() error) (string, error) {
	ferr := freeze()
	if ferr == nil {
		return "frozen", nil
	}
	if err := stop(); err != nil {
		return "neither frozen nor stopped", errors.Join(ferr, err)
	}
	return "stopped", ferr
}

// release loads the role's egress rules again and lets the resolver and
// gateway decide by them. A release that cannot load them leaves the
// sandbox quarantined.
func (s *service) release(sb *sandboxState, detail map[string]string) (string, error) {
	sb.resp.mu.Lock()
	reason, since := sb.resp.quarantined, sb.resp.quarantinedAt
	sb.resp.mu.Unlock()
	if reason == "" {
		return "", errors.New("the sandbox is not quarantined")
	}
	e := sb.egress()
	detail["quarantine_reason"] = reason
	if e.netns != "" {
		// The live plan: what the role says now, as far as it tightened.
		if err := netpolicy.Restore(e.held, sb.live.Load(), e.iface); err != nil {
			detail["error"] = err.Error()
			sb.audit.trail.Emit(audit.TypeReleased.New("Failure", "release failed: the sandbox stays quarantined: "+err.Error(), detail), true)
			return "", fmt.Errorf("release failed, the sandbox stays quarantined: %w", err)
		}
	}
	if e.resolver != nil {
		e.resolver.Resume()
		detail["dns_questions_dropped"] = fmt.Sprint(e.resolver.Dropped())
	}
	if e.gateway != nil {
		e.gateway.Resume()
	}
	sb.resp.mu.Lock()
	sb.resp.quarantined = ""
	sb.resp.mu.Unlock()
	d := time.Since(since).Round(time.Millisecond)
	detail["quarantined_for"] = d.String()
	detail["egress_after"] = egressSummary(sb)
	msg := fmt.Sprintf("released after %v: egress %s", d, detail["egress_after"])
	sb.audit.trail.Emit(audit.TypeReleased.New("Success", msg, detail), true)
	return msg, nil
}

// pause freezes the whole sandbox (runsc pause stops its kernel: every
// container) and holds its wall clock.
func (s *service) pause(ctx context.Context, sb *sandboxState) error {
	if _, err := s.next.Pause(ctx, &task.PauseRequest{ID: sb.id}); err != nil {
		return err
	}
	s.sandboxes.holdTimer(sb)
	sb.resp.mu.Lock()
	sb.resp.frozen, sb.resp.frozenAt = true, time.Now()
	sb.resp.mu.Unlock()
	return nil
}

// unpause resumes a frozen sandbox and its wall clock, and says how long
// it was frozen.
func (s *service) unpause(ctx context.Context, sb *sandboxState) (time.Duration, error) {
	if _, err := s.next.Resume(ctx, &task.ResumeRequest{ID: sb.id}); err != nil {
		return 0, err
	}
	sb.resp.mu.Lock()
	d := time.Since(sb.resp.frozenAt)
	sb.resp.frozen = false
	sb.resp.mu.Unlock()
	s.sandboxes.thawTimer(sb, s.expire)
	return d, nil
}

func (s *service) freeze(ctx context.Context, sb *sandboxState, detail map[string]string) (string, error) {
	if sb.resp.isFrozen() {
		return "already frozen", nil
	}
	if err := s.pause(ctx, sb); err != nil {
		detail["error"] = err.Error()
		sb.audit.trail.Emit(audit.TypeFrozen.New("Failure", "freeze failed: "+err.Error(), detail), true)
		return "", fmt.Errorf("freeze failed: %w", err)
	}
	msg := "frozen: every process of the sandbox paused; its wall clock is held"
	sb.audit.trail.Emit(audit.TypeFrozen.New("Success", msg, detail), true)
	return msg, nil
}

func (s *service) thaw(ctx context.Context, sb *sandboxState, detail map[string]string) (string, error) {
	if !sb.resp.isFrozen() {
		return "", errors.New("the sandbox is not frozen")
	}
	d, err := s.unpause(ctx, sb)
	if err != nil {
		detail["error"] = err.Error()
		sb.audit.trail.Emit(audit.TypeThawed.New("Failure", "thaw failed: "+err.Error(), detail), true)
		return "", fmt.Errorf("thaw failed: %w", err)
	}
	d = d.Round(time.Millisecond)
	detail["frozen_for"] = d.String()
	msg := fmt.Sprintf("thawed after %v frozen", d)
	sb.audit.trail.Emit(audit.TypeThawed.New("Success", msg, detail), true)
	return msg, nil
}

// stopByAdmin kills every container of the sandbox; their exits report
// 137, and the trail says who and why.
func (s *service) stopByAdmin(ctx context.Context, sb *sandboxState, detail map[string]string) (string, error) {
	ids := s.sandboxes.containersOf(sb)
	msg := fmt.Sprintf("stopping %d container(s) (SIGKILL)", len(ids))
	sb.audit.trail.Emit(audit.TypeStopped.New("Success", msg, detail), true)
	s.kill(ctx, sb)
	return msg, nil
}

// kill kills every container of the sandbox, the root last.
func (s *service) kill(ctx context.Context, sb *sandboxState) {
	sb.resp.mu.Lock()
	sb.resp.stopped = true
	sb.resp.mu.Unlock()
	s.killAll(ctx, s.sandboxes.containersRootLast(sb))
}

// thawForKill resumes a frozen sandbox that is to be killed: runsc signals
// no container of a paused sandbox. Its tasks run between the thaw and the
// kill (milliseconds).
func (s *service) thawForKill(ctx context.Context, sb *sandboxState) {
	if !sb.resp.isFrozen() {
		return
	}
	if d, err := s.unpause(ctx, sb); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: thawing a frozen sandbox to deliver a kill")
	} else {
		sb.audit.trail.Emit(audit.TypeThawed.New("Success", fmt.Sprintf("thawed after %v frozen, to be killed", d.Round(time.Millisecond)), nil), true)
	}
}
