package shim

// Restore: a new sandbox that asks for a checkpoint by name is checked
// against it (its role no looser, its owner proven, its wall clock left),
// and restored in place of its containers' start.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/tighten"
	"agentbox.dev/agentbox/shim/sandbox"
)

// restoring is a sandbox being restored from a checkpoint.
type restoring struct {
	image *checkpoint.Image
	// pending counts the containers not yet restored (runsc restores the
	// sandbox when its last container is).
	pending atomic.Int64
	// template: the role's template, not the pod's own checkpoint.
	template bool
}

// take counts a container of a restoring sandbox as restored; false when
// all were (the container starts as any other).
func (r *restoring) take() bool {
	for {
		n := r.pending.Load()
		if n <= 0 {
			return false
		}
		if r.pending.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// openRestore checks the checkpoint a sandbox root asks to be restored
// from (by its annotation, or its role's template), and records the link to
// the trail of the sandbox it was taken of (the first record, for an
// annotation). A template's agent is a new one: its wall clock starts
// afresh; a resumed one's counts on.
func openRestore(cfg *config.Config, sb *sandboxState, name string, template bool) error {
	store, err := storeOf(cfg)
	if err != nil {
		return err
	}
	from := "annotation " + policy.RestoreAnnotation
	if template {
		from = "the role's template"
	}
	imported, err := importShared(cfg, store, name)
	if err != nil {
		return errkind.PermissionDenied(fmt.Errorf("%s: checkpoint %s: %w", from, name, err))
	}
	img, err := store.Open(name)
	if err != nil {
		return errkind.PermissionDenied(fmt.Errorf("%s: %w", from, err))
	}
	m := img.Manifest
	sb.restore = &restoring{image: img, template: template}
	sb.restore.pending.Store(int64(len(m.Containers)))
	if !template && len(m.Placeholders) > 0 {
		// The restored agent holds these in its memory: the gateway keeps
		// knowing them for what they are.
		sb.egressMu.Lock()
		sb.placeholders = maps.Clone(m.Placeholders)
		sb.egressMu.Unlock()
	}
	if !template {
		sb.clock.CountFrom(m.WallClockUsed)
	}
	d := map[string]string{"checkpoint": m.Name, "image_digest": img.Digest, "previous_sandbox": m.Trail.Sandbox,
		"previous_seq": fmt.Sprint(m.Trail.LastSeq), "previous_hash": m.Trail.LastHash, "previous_pod": m.Pod,
		"previous_role": m.Role, "previous_policy_digest": m.PolicyDigest, "wall_clock_used": sb.clock.Used().String(),
		"containers": fmt.Sprint(len(m.Containers)), "template": fmt.Sprint(template)}
	if imported != "" {
		d["shared_store"] = imported
	}
	sb.audit.trail.Emit(audit.TypeRestored.New("Success",
		fmt.Sprintf("restores checkpoint %s (%s) of sandbox %s, taken %s under role %s; that trail's record %d links here",
			m.Name, img.Digest, m.SandboxID, m.Created.Format(time.RFC3339), m.Role, m.Trail.LastSeq),
		d), true)
	return nil
}

// checkRestore refuses a restore whose profile is looser than the one the
// checkpoint was taken under, or whose wall clock has run out.
//
// A checkpoint holds its agent's memory, secrets and data included: only a
// sandbox in the same containerd namespace, and for a pod the same
// Kubernetes namespace (as the CRI says, never an annotation), may be
// restored from it; a role's template, which an admin named, is exempt. A
// checkpoint of a quarantined sandbox is not restored: lifting a
// quarantine is an admin's act (agentbox sandbox quarantine --release).
func checkRestore(r *restoring, p *policy.Profile, req policy.Request) error {
	img := r.image
	m := img.Manifest
	if !r.template && (m.Namespace != req.ContainerdNamespace || m.PodNamespace != req.PodNamespace) {
		return errkind.PermissionDenied(fmt.Errorf("annotation %s: checkpoint %s was taken in containerd namespace %q, pod namespace %q; this sandbox is in %q, %q: a checkpoint holds its agent's memory and is restored only where it was taken",
			policy.RestoreAnnotation, m.Name, m.Namespace, m.PodNamespace, req.ContainerdNamespace, req.PodNamespace))
	}
	if m.Quarantined != "" {
		return errkind.PermissionDenied(fmt.Errorf("restore: checkpoint %s was taken of a quarantined sandbox (%s): it is not restored (a restored sandbox would have its role's egress)", m.Name, m.Quarantined))
	}
	var was policy.Profile
	if err := json.Unmarshal(img.Manifest.Profile, &was); err != nil {
		return fmt.Errorf("checkpoint %s: its profile: %w", img.Manifest.Name, err)
	}
	var wasEgress netpolicy.Plan
	if err := json.Unmarshal(img.Manifest.Egress, &wasEgress); err != nil {
		return fmt.Errorf("checkpoint %s: its egress: %w", img.Manifest.Name, err)
	}
	if looser := tighten.LooserThan(&was, &wasEgress, p); len(looser) > 0 {
		return errkind.PermissionDenied(fmt.Errorf("restore: role %s (%s) is looser than role %s (%s), which checkpoint %s was taken under: %s",
			p.Role, policy.ShortDigest(p.Digest), was.Role, policy.ShortDigest(img.Manifest.PolicyDigest), img.Manifest.Name, strings.Join(looser, "; ")))
	}
	if wc := p.Limits.WallClock; wc > 0 && !r.template && img.Manifest.WallClockUsed >= wc {
		return errkind.PermissionDenied(fmt.Errorf("annotation %s: checkpoint %s had used %v of its wall clock, and role %s allows %v",
			policy.RestoreAnnotation, img.Manifest.Name, img.Manifest.WallClockUsed.Round(time.Second), p.Role, wc))
	}
	return nil
}

// restoreStart restores a container of a sandbox being restored, in place
// of starting it. It says false when the container is not to be restored.
func (s *service) restoreStart(ctx context.Context, r *task.StartRequest) (*task.StartResponse, bool, error) {
	if r.ExecID != "" {
		return nil, false, nil
	}
	sb, ok := s.sandboxes.of(r.ID)
	if !ok || sb.restore == nil || !sb.restore.take() {
		return nil, false, nil
	}
	start := time.Now()
	resp, err := s.next.Restore(ctx, &extension.RestoreRequest{Start: r, Conf: extension.RestoreConfig{ImagePath: sb.restore.image.Dir, Background: true}})
	if err != nil {
		sb.audit.trail.Emit(audit.TypeSandboxFailed.New("Failure", fmt.Sprintf("restoring container %s from checkpoint %s: %s", r.ID, sb.restore.image.Manifest.Name, briefError(err.Error())),
			map[string]string{"container_id": r.ID, "checkpoint": sb.restore.image.Manifest.Name}), true)
		s.abandonRestore(ctx, sb, r.ID)
		return nil, true, err
	}
	log.G(ctx).WithField("container_id", r.ID).Infof("agentbox: restored from checkpoint %s in %v", sb.restore.image.Manifest.Name, time.Since(start))
	return resp, true, nil
}

// abandonRestore ends a sandbox whose restore failed at Start. runsc
// leaves its sandbox process waiting, and gVisor's task service learns of
// a container's exit only from a wait it starts after a successful start:
// a kill, a wait or `ctr task delete -f` of the container would wait
// forever, and the sandbox and its gofer would outlive the pod. The shim
// kills the sandbox process and reports the container exited (SIGKILL's
// status); Delete then removes it by force.
func (s *service) abandonRestore(ctx context.Context, sb *sandboxState, id string) {
	// Illegal only when the sandbox ended or stopped meanwhile (fire
	// logged it): its sandbox process is killed all the same.
	_ = sb.fire(ctx, sandbox.Abandon, sb.restore.image.Manifest.Name)
	if err := killSandboxProcess(s.exits, id); err != nil {
		log.G(ctx).WithError(err).WithField("container_id", id).Warn("agentbox: killing the sandbox of a failed restore")
	}
	proc.ExitCh <- proc.Exit{ID: id, Status: 128 + int(unix.SIGKILL), Timestamp: time.Now()}
}

// restoredFrom names the checkpoint a container's sandbox was restored from.
// ownerProofWait bounds how long the creation of a sandbox restoring a
// Sandbox's checkpoint waits for the node agent to prove the new pod is that Sandbox's.
const ownerProofWait = 30 * time.Second

// proveOwner holds the restore of a checkpoint taken of an agent-sandbox
// Sandbox's pod until the node agent says which Sandbox the new pod
// belongs to (from the API server: the pod, by its UID, and the Sandbox),
// and refuses it unless that is the same Sandbox, by UID. An annotation a
// pod author writes names a checkpoint; it never proves whose memory the
// pod may take.
func (s *service) proveOwner(ctx context.Context, sb *sandboxState) error {
	if sb.restore == nil || sb.restore.template {
		return nil
	}
	m := sb.restore.image.Manifest
	if m.SandboxUID == "" {
		return nil
	}
	deadline := time.Now().Add(ownerProofWait)
	for {
		if o := sb.owner.Load(); o != nil {
			// A fork's copy: the node agent proved the source answered
			// its fork naming this Sandbox, for this very image.
			if o.Sandbox.UID != m.SandboxUID && (o.ForkOf == "" || o.ForkOf != m.Name) {
				return fmt.Errorf("it is Sandbox %s's (uid %s), and this pod belongs to %s (uid %s), which is no copy of it its fork named", m.SandboxObject, m.SandboxUID, o.Sandbox, o.Sandbox.UID)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("it is Sandbox %s's (uid %s), and in %v the node agent (agentbox sync) did not prove this pod is that Sandbox's", m.SandboxObject, m.SandboxUID, ownerProofWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *service) restoredFrom(id string) string {
	if sb, ok := s.sandboxes.of(id); ok && sb.restore != nil {
		return sb.restore.image.Manifest.Name
	}
	return ""
}
