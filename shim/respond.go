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
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netenforce"
	"agentbox.dev/agentbox/shim/sandbox"
)

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
//
// +checklocksignore: sb.ops is held for every op but info, taken
// conditionally (checklocks follows no lock taken under a condition).
func (s *service) respond(ctx context.Context, cfg *config.Config, sb *sandboxState, peer control.Peer, req control.Request) control.Response {
	ctx = log.WithLogger(ctx, log.L.WithField("sandbox_id", sb.id))
	who := map[string]string{"requested_by_uid": fmt.Sprint(peer.UID), "requested_by_pid": fmt.Sprint(peer.PID)}
	if req.Op != control.OpInfo {
		who["command_uid"] = fmt.Sprintf("%s/%s-%d", sb.id, req.Op, sb.commands.Add(1))
		if req.Reason != "" {
			who["reason"] = req.Reason
		}
	}
	var msg string
	var err error
	var cp *control.Checkpointed
	if req.Op != control.OpInfo {
		sb.ops.Lock()
		defer sb.ops.Unlock()
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
	case control.OpOwner:
		msg, err = s.setOwner(ctx, sb, req.Owner, who)
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
		Containers: sb.members.List(), Trail: filepath.Join(cfg.Audit.Dir, audit.FileName(sb.id)), Started: sb.started}
	if m := sb.audit.trail.Meta(); sb.inCRI && m.PodName != "" {
		// Only a CRI pod sandbox: its name is the CRI's, not a claim.
		in.Pod = m.PodNamespace + "/" + m.PodName
		in.PodUID = sb.podUID
	}
	if d, ok := sb.clock.Left(); ok {
		in.WallClockLeft = d.Round(time.Second).String()
	}
	if pl := sb.live.Load(); pl != nil {
		in.EgressNow = pl.Mode()
	}
	in.LiveDigest = sb.liveDigestNow()
	st := sb.life.Now()
	if st.Quarantined() {
		in.Quarantined, in.QuarantineReason, in.EgressNow = true, st.Quarantine, "none (quarantined)"
	}
	// The phase: a quarantine is said by its own fields.
	in.State = st.Phase.String()
	in.Owner = sb.owner.Load()
	in.Suspend = p.Suspend
	if sb.restore != nil {
		in.RestoredFrom = sb.restore.image.Manifest.Name
	}
	return in
}

// setOwner notes the agent-sandbox Sandbox the pod belongs to, and what
// holds it, as the node agent says: a record each time that changes (a
// warm Sandbox claimed). A Sandbox of another namespace than the pod's is
// refused: the node agent would not send one, and nothing may link a pod
// to another namespace's Sandbox.
// +checklocks:sb.ops
func (s *service) setOwner(ctx context.Context, sb *sandboxState, o *control.Owner, detail map[string]string) (string, error) {
	if !sb.inCRI {
		return "", errkind.FailedPrecondition(errors.New("not a Kubernetes pod: it has no Sandbox"))
	}
	if ns := sb.request.PodNamespace; o.Sandbox.Namespace != ns {
		return "", errkind.InvalidArgument(fmt.Errorf("owner.sandbox.namespace: %q, and the pod is in %q", o.Sandbox.Namespace, ns))
	}
	prev := sb.owner.Load()
	if prev != nil && prev.SameHolder(o) && (prev.ClaimRead() || !o.ClaimRead()) {
		// A claim's identity is bound once, when first read: the same
		// holder never changes it.
		if prev.Ready != o.Ready {
			return s.readyChanged(sb, prev, o.Ready, detail), nil
		}
		return "unchanged: " + ownerText(prev), nil
	}
	if prev != nil && prev.Sandbox.UID != o.Sandbox.UID {
		// A pod's controller does not change: the API said otherwise
		// before, and the first stays.
		return "", errkind.FailedPrecondition(fmt.Errorf("the pod belongs to %s (uid %s), not %s (uid %s)", prev.Sandbox, prev.Sandbox.UID, o.Sandbox, o.Sandbox.UID))
	}
	rc, bind, err := s.prepareClaim(sb, o.Claim)
	if err == nil {
		err = s.applyClaimRole(ctx, sb, rc, detail)
	}
	if err != nil {
		// Nothing of the claim binds, its identity neither; a claim's
		// keys bound before are unbound.
		o = refusedClaim(o, err)
		rc = nil
		if bind, err = prepareClaimKeys(sb, nil); err != nil {
			return "", err
		}
	}
	if bind != nil {
		detail["claim_keys"] = bind.text
	}
	detail["sandbox_object"] = o.Sandbox.Namespace + "/" + o.Sandbox.Name
	detail["sandbox_uid"] = o.Sandbox.UID
	if h := o.Holder; h != nil {
		detail["holder_kind"], detail["holder"], detail["holder_uid"] = h.Kind, h.Name, h.UID
	}
	if prev != nil && prev.Holder != nil {
		detail["previous_holder"] = prev.Holder.Kind + " " + prev.Holder.Name
	}
	if o.ClaimRefused != "" {
		detail["claim_refused"] = o.ClaimRefused
	}
	warmCPU(sb, o, detail)
	sb.owner.Store(o)
	m := sb.audit.trail.Meta()
	m.Claim, m.WarmPool = claimOf(o), ""
	if rc != nil {
		m.Role, m.PolicyDigest = rc.next.Role, rc.next.Digest
	}
	if h := o.Holder; h != nil && h.Kind == "SandboxWarmPool" {
		m.WarmPool = h.Name
	}
	msg := ownerText(o)
	// This record on carries the claim, or the pool.
	sb.audit.trail.Rejoin(m, audit.TypeOwner.New("Success", msg, detail))
	// The claim's keys from its record on.
	bind.commit(sb)
	settleClaimKeys(sb, o)
	return msg, nil
}

// ownerText says what a pod belongs to.
func ownerText(o *control.Owner) string {
	msg := fmt.Sprintf("the pod belongs to %s (uid %s)", o.Sandbox, o.Sandbox.UID)
	if h := o.Holder; h != nil {
		verb := "held by"
		switch h.Kind {
		case "SandboxClaim":
			verb = "claimed by"
		case "SandboxWarmPool":
			verb = "kept warm by"
		}
		msg += fmt.Sprintf(", %s %s %s (uid %s)", verb, h.Kind, h.Name, h.UID)
	}
	switch {
	case o.Claim != nil:
		msg += ", for " + claimText(o.Claim)
	case o.ClaimRefused != "":
		msg += "; the claim's identity is not bound: " + o.ClaimRefused
	}
	return msg
}

// claimOf is the trail's claim for o: its SandboxClaim holder, with the
// task's identity when the broker gave it.
func claimOf(o *control.Owner) *audit.Claim {
	h := o.Holder
	if h == nil || h.Kind != "SandboxClaim" {
		return nil
	}
	c := &audit.Claim{Name: h.Name, UID: h.UID}
	if id := o.Claim; id != nil {
		c.Subject, c.Tenant, c.Task = id.Subject, id.Tenant, id.Task
	}
	return c
}

// claimText says who a claim's task is for.
func claimText(c *control.Claim) string {
	var parts []string
	for _, f := range []struct{ k, v string }{{"subject", c.Subject}, {"tenant", c.Tenant}, {"task", c.Task}} {
		if f.v != "" {
			parts = append(parts, fmt.Sprintf("%s %q", f.k, f.v))
		}
	}
	if len(parts) == 0 {
		return "a task the claim does not name"
	}
	return strings.Join(parts, ", ")
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
	if st := sb.life.Now(); st.Quarantined() {
		return fmt.Sprintf("already quarantined since %s: %s", st.QuarantinedAt.UTC().Format(time.RFC3339), st.Quarantine), nil
	}
	if err := sb.life.Can(sandbox.Quarantine); err != nil {
		return "", errkind.FailedPrecondition(err)
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
	if _, err := sb.life.Fire(sandbox.Quarantine, detail["reason"]); err != nil {
		// Only a stop or an exit could have moved it meanwhile: the cuts
		// stay, and the trail says the quarantine was applied.
		log.G(ctx).WithError(err).Warn("agentbox: quarantine applied to a sandbox that moved on")
	}
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
		if err := netenforce.Quarantine(e.held, ifaces...); err != nil {
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
	return fallBack(func() error { return s.pause(ctx, sb) }, func() error { s.stopAll(ctx, sb, "failClosed"); return nil })
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
	st := sb.life.Now()
	if !st.Quarantined() {
		return "", errkind.FailedPrecondition(errors.New("the sandbox is not quarantined"))
	}
	if err := sb.life.Can(sandbox.Release); err != nil {
		return "", errkind.FailedPrecondition(err)
	}
	reason, since := st.Quarantine, st.QuarantinedAt
	e := sb.egress()
	detail["quarantine_reason"] = reason
	if e.netns != "" {
		// The live plan: what the role says now, as far as it tightened.
		if err := netenforce.Restore(e.held, sb.live.Load(), e.iface); err != nil {
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
	if _, err := sb.life.Fire(sandbox.Release, ""); err != nil {
		log.L.WithField("sandbox_id", sb.id).WithError(err).Warn("agentbox: release applied to a sandbox that moved on")
	}
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
	sb.pauseMu.Lock()
	defer sb.pauseMu.Unlock()
	if err := sb.life.Can(sandbox.Freeze); err != nil {
		return errkind.FailedPrecondition(err)
	}
	if _, err := s.next.Pause(ctx, &task.PauseRequest{ID: sb.id}); err != nil {
		return err
	}
	sb.clock.Hold()
	return sb.fire(ctx, sandbox.Freeze, "")
}

// unpause resumes a frozen sandbox and its wall clock, and says how long
// it was frozen.
func (s *service) unpause(ctx context.Context, sb *sandboxState) (time.Duration, error) {
	sb.pauseMu.Lock()
	defer sb.pauseMu.Unlock()
	if err := sb.life.Can(sandbox.Thaw); err != nil {
		return 0, errkind.FailedPrecondition(err)
	}
	if _, err := s.next.Resume(ctx, &task.ResumeRequest{ID: sb.id}); err != nil {
		return 0, err
	}
	before, err := sb.life.Fire(sandbox.Thaw, "")
	if err != nil {
		return 0, errkind.FailedPrecondition(err)
	}
	sb.clock.Thaw()
	return time.Since(before.FrozenAt), nil
}

func (s *service) freeze(ctx context.Context, sb *sandboxState, detail map[string]string) (string, error) {
	if sb.life.Now().Phase == sandbox.Frozen {
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
	if sb.life.Now().Phase != sandbox.Frozen {
		return "", errkind.FailedPrecondition(errors.New("the sandbox is not frozen"))
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
	ids := sb.members.List()
	msg := fmt.Sprintf("stopping %d container(s) (SIGKILL)", len(ids))
	sb.audit.trail.Emit(audit.TypeStopped.New("Success", msg, detail), true)
	s.stopAll(ctx, sb, "admin")
	return msg, nil
}
