package shim

// Checkpoint and restore: a running sandbox's memory (all its containers)
// is written by gVisor into the node's checkpoint store, under a manifest the
// node key signs, and a new sandbox that asks for it by name
// (agentbox.dev/restore-from) is restored from it instead of booting, under
// a role no looser than the one it was taken under, with its egress, secrets,
// gateway and limits applied anew and its wall clock counting on. Its trail
// begins with a record that names the checkpoint's record in the old trail.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	errgrpc "github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
	pb "gvisor.dev/gvisor/pkg/shim/v1/taskserver/task_server_go_proto"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/tighten"
	"agentbox.dev/agentbox/shim/sandbox"
)

// PointerFile is what a checkpoint taken through containerd's task API
// leaves in containerd's checkpoint directory (and so in its checkpoint
// image): the signed manifest of the image in the node's store. The memory
// itself stays in the store.
const PointerFile = "agentbox-checkpoint.json"

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

// Checkpoint is containerd's task API checkpoint (ctr task checkpoint):
// the whole sandbox of the container, into the node's store. Options are
// runc's, as containerd's clients send them: exit stops the sandbox after
// (a suspend); CRIU's own options are refused.
func (s *service) Checkpoint(ctx context.Context, r *task.CheckpointTaskRequest) (*types.Empty, error) {
	sb, ok := s.sandboxes.of(r.ID)
	if !ok {
		return nil, errgrpc.ToGRPC(errkind.NotFound(fmt.Errorf("container %s is not served by this shim", r.ID)))
	}
	exit, err := checkpointOptions(r)
	if err != nil {
		return nil, errgrpc.ToGRPC(errkind.InvalidArgument(err))
	}
	if r.Path == "" {
		return nil, errgrpc.ToGRPC(errkind.InvalidArgument(errors.New("checkpoint request carries no path")))
	}
	name := defaultCheckpointName(sb.id)
	who := map[string]string{"requested_by": "containerd's task API (ctr task checkpoint, or the CRI's CheckpointContainer)"}
	sb.ops.Lock()
	// containerd pauses the task around its checkpoint (a frozen sandbox,
	// held wall clock): that is the one frozen sandbox that is checkpointed.
	cp, err := s.checkpoint(ctx, sb, name, !exit, true, who)
	sb.ops.Unlock()
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	// containerd archives this directory into its checkpoint image: it
	// gets the signed manifest, which names the image in the store.
	b, err := os.ReadFile(filepath.Join(cp.Dir, checkpoint.ManifestFile))
	if err == nil {
		err = os.WriteFile(filepath.Join(r.Path, PointerFile), b, 0o600)
	}
	if err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("checkpoint %s was made, but its pointer could not be written into %s: %w", cp.Name, r.Path, err))
	}
	log.G(ctx).WithField("checkpoint", cp.Name).Info("agentbox: checkpointed through the task API")
	return &types.Empty{}, nil
}

// checkpointOptions reads containerd's checkpoint options: whether to stop
// the sandbox after. What gVisor's checkpoint cannot honour is refused.
func checkpointOptions(r *task.CheckpointTaskRequest) (exit bool, err error) {
	if r.Options == nil || len(r.Options.GetValue()) == 0 && r.Options.GetTypeUrl() == "" {
		return false, nil
	}
	v, err := typeurl.UnmarshalAny(r.Options)
	if err != nil {
		return false, fmt.Errorf("checkpoint options: %w", err)
	}
	o, ok := v.(*runcoptions.CheckpointOptions)
	if !ok {
		return false, fmt.Errorf("checkpoint options of type %T: agentbox takes runc's CheckpointOptions (exit, image_path, work_path)", v)
	}
	for _, f := range []struct {
		set  bool
		name string
	}{
		{o.OpenTcp, "open_tcp"}, {o.ExternalUnixSockets, "external_unix_sockets"}, {o.Terminal, "terminal"},
		{o.FileLocks, "file_locks"}, {len(o.EmptyNamespaces) > 0, "empty_namespaces"}, {o.CgroupsMode != "", "cgroups_mode"},
	} {
		if f.set {
			return false, fmt.Errorf("checkpoint options: %s is CRIU's; gVisor's checkpoint does not take it (open TCP connections are reset at restore)", f.name)
		}
	}
	return o.Exit, nil
}

// defaultCheckpointName names a checkpoint by its sandbox and time.
func defaultCheckpointName(id string) string {
	if len(id) > 24 {
		id = id[:24]
	}
	id = strings.ToLower(id)
	var b strings.Builder
	for _, c := range id {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		b.WriteString("sandbox")
	}
	return b.String() + "-" + time.Now().UTC().Format("20060102t150405.000z")
}

// storeOf is the node's checkpoint store the config names.
func storeOf(cfg *config.Config) (*checkpoint.Store, error) {
	return checkpoint.OpenStore(cfg.Checkpoint.Dir, cfg.Checkpoint.KeyFile)
}

// checkpoint has gVisor write the sandbox's memory into the store under
// name, records it in the trail, and signs the image with that record's
// hash. leaveRunning: a snapshot; otherwise a suspend, which stops the
// sandbox only once its image is committed and verified: the sandbox is
// frozen first, gVisor writes it and leaves it frozen, and a checkpoint
// that fails thaws it (if the suspend froze it) with the agent as it was.
// (gVisor's own stop-after-save kills the sandbox whether or not the save
// succeeded: a full store would stop the agent with nothing kept.)
// A kill that arrives meanwhile waits for the checkpoint (waitCheckpoint).
// The caller holds sb.ops.
func (s *service) checkpoint(ctx context.Context, sb *sandboxState, name string, leaveRunning, frozenOK bool, detail map[string]string) (*control.Checkpointed, error) {
	fail := func(err error) (*control.Checkpointed, error) {
		d := map[string]string{"checkpoint": name, "error": err.Error()}
		for k, v := range detail {
			d[k] = v
		}
		what := "the sandbox runs on"
		if !leaveRunning {
			what = "the suspend is abandoned and the agent runs on"
		}
		if ph := sb.life.Now().Phase; ph != sandbox.Running && ph != sandbox.Checkpointing {
			what = "the sandbox is " + ph.String()
		}
		sb.audit.trail.Emit(audit.TypeCheckpointFailed.New("Failure", fmt.Sprintf("checkpoint %s not made: %v; %s", name, err, what), d), true)
		return nil, err
	}
	if sb.restore != nil && sb.restore.pending.Load() > 0 {
		return fail(errkind.FailedPrecondition(errors.New("the sandbox is still being restored (not all its containers have started)")))
	}
	if sb.life.Now().Phase == sandbox.Frozen && !frozenOK {
		return fail(errkind.FailedPrecondition(errors.New("the sandbox is frozen: thaw it first (an admin's checkpoint is of a running sandbox)")))
	}
	store, err := storeOf(sb.cfg)
	if err != nil {
		return fail(err)
	}
	// A suspend freezes the sandbox for the whole checkpoint, so that what
	// is stopped is what was saved; a failure thaws it again.
	stopped := false
	if !leaveRunning && sb.life.Now().Phase != sandbox.Frozen {
		if err := s.pause(ctx, sb); err != nil {
			return fail(fmt.Errorf("freezing the sandbox to suspend it: %w", err))
		}
		defer func() {
			if stopped {
				return
			}
			if _, err := s.unpause(ctx, sb); err != nil {
				log.G(ctx).WithError(err).Warn("agentbox: thawing a sandbox whose suspend failed")
				sb.audit.trail.Emit(audit.TypeThawed.New("Failure", "the suspend failed, and so did thawing the sandbox: it stays frozen: "+err.Error(), nil), true)
			}
		}()
	}
	if _, err := sb.life.Fire(sandbox.Checkpoint, ""); err != nil {
		return fail(errkind.FailedPrecondition(err))
	}
	doneCh := make(chan struct{})
	sb.checkpointing.Store(&doneCh)
	// Made or not, a checkpoint returns the sandbox to the phase it began
	// in; a suspend that was made stops it instead.
	defer func() {
		if !stopped {
			sb.fire(ctx, sandbox.CheckpointDone)
		}
		sb.checkpointing.Store(nil)
		close(doneCh)
	}()
	tmp, err := store.Begin(name)
	if err != nil {
		return fail(errkind.InvalidArgument(err))
	}
	committed := false
	defer func() {
		if !committed {
			store.Abort(tmp)
		}
	}()
	// What the sandbox runs under now: its profile, the egress it has
	// (narrowed live, perhaps), and what it used of its wall clock.
	profile, err := json.Marshal(sb.profile)
	if err != nil {
		return fail(err)
	}
	live := sb.live.Load()
	if live == nil {
		live = &netpolicy.Plan{}
	}
	egress, err := json.Marshal(live)
	if err != nil {
		return fail(err)
	}
	used := sb.clock.Spent()
	start := time.Now()
	gts := runsc.NewGvisorTaskServer(s.next)
	if gts == nil {
		return fail(errors.New("gVisor's task service has no checkpoint"))
	}
	if _, err := gts.Checkpoint(ctx, &pb.CheckpointRequest{Id: sb.id, ImagePath: tmp, LeaveRunning: true}); err != nil {
		return fail(fmt.Errorf("runsc checkpoint: %s", briefError(err.Error())))
	}
	took := time.Since(start)
	var size int64
	if ents, err := os.ReadDir(tmp); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil {
				size += fi.Size()
			}
		}
	}
	meta := sb.audit.trail.Meta()
	d := map[string]string{"checkpoint": name, "store": store.Dir, "took": took.Round(time.Millisecond).String(),
		"bytes": fmt.Sprint(size), "suspended": fmt.Sprint(!leaveRunning), "wall_clock_used": used.Round(time.Millisecond).String()}
	for k, v := range detail {
		d[k] = v
	}
	what := "left running"
	if !leaveRunning {
		what = "stopped (suspended)"
	}
	seq, hash, err := sb.audit.trail.Mark(audit.TypeCheckpointed.New("Success",
		fmt.Sprintf("checkpoint %s: %d bytes of memory and state in %v; the sandbox was %s", name, size, took.Round(time.Millisecond), what), d))
	if err != nil {
		return fail(fmt.Errorf("the trail could not record it (%w): the image is discarded", err))
	}
	pod, podNS := "", ""
	if sb.inCRI {
		podNS = sb.request.PodNamespace
		if meta.PodName != "" {
			pod = meta.PodNamespace + "/" + meta.PodName
		}
	}
	m := &checkpoint.Manifest{Name: name, Created: time.Now().UTC(), SandboxID: sb.id, Namespace: meta.Namespace, Pod: pod, PodNamespace: podNS,
		Quarantined: sb.life.Now().Quarantine, Placeholders: sb.placeholdersNow(),
		Role: sb.profile.Role, PolicyDigest: sb.liveDigestNow(), Profile: profile, Egress: egress,
		Containers: sb.members.List(), WallClockUsed: used, Suspended: !leaveRunning,
		Trail: checkpoint.Trail{Sandbox: sb.id, LastSeq: seq, LastHash: hash}}
	if o := sb.owner.Load(); o != nil {
		m.SandboxObject, m.SandboxUID = o.Sandbox.Namespace+"/"+o.Sandbox.Name, o.Sandbox.UID
	}
	if gw := sb.egress().gateway; gw != nil {
		u := gw.ModelUsage()
		m.ModelTokens, m.ModelRequests = u.Tokens, u.Requests
	}
	digest, err := store.Commit(tmp, m)
	if err != nil {
		return fail(fmt.Errorf("signing the image: %w", err))
	}
	committed = true
	cp := &control.Checkpointed{Name: name, Digest: digest, Dir: filepath.Join(store.Dir, name), Bytes: size,
		Millis: took.Milliseconds(), Suspended: !leaveRunning}
	if leaveRunning {
		return cp, nil
	}
	// The agent stops only for an image a restore would accept.
	if img, err := store.Open(name); err != nil || img.Digest != digest {
		if rmErr := store.Remove(name); rmErr != nil {
			log.G(ctx).WithError(rmErr).Warn("agentbox: removing a checkpoint that does not verify")
		}
		if err == nil {
			err = fmt.Errorf("its digest is %s, not the %s signed", img.Digest, digest)
		}
		return fail(fmt.Errorf("the image written does not verify (%w): removed", err))
	}
	stopped = true
	sb.suspendedInto.Store(&name)
	sb.fire(ctx, sandbox.Suspend)
	s.stopSuspended(ctx, sb)
	shareImage(sb, store, cp)
	return cp, nil
}

// restoreKeyWait bounds how long a restore waits for the node agent to
// place its image's data key (it asks the broker once the pod is bound).
const restoreKeyWait = 60 * time.Second

// sharedOf is the cluster's shared store (nil when the config names none):
// with the broker's public key, this node wraps and the node agent places
// what the broker unwrapped; with a key file, the node does both.
func sharedOf(cfg *config.Config) (*checkpoint.Shared, error) {
	c := cfg.Checkpoint
	if c.SharedDir == "" {
		return nil, nil
	}
	if c.SharedKeyFile != "" {
		kek, err := checkpoint.LoadSymmetricKEK(c.SharedKeyFile)
		if err != nil {
			return nil, err
		}
		return checkpoint.OpenShared(c.SharedDir, kek, kek)
	}
	pub, err := checkpoint.LoadPublicKEK(c.SharedPublicKey)
	if err != nil {
		return nil, err
	}
	return checkpoint.OpenShared(c.SharedDir, pub, checkpoint.KeyDir{Dir: c.KeysDir, Wait: restoreKeyWait})
}

// shareImage writes a suspend's image to the cluster's shared store,
// encrypted, so that the sandbox can resume on another node. A failure is
// recorded; the image stays on this node.
func shareImage(sb *sandboxState, store *checkpoint.Store, cp *control.Checkpointed) {
	sh, err := sharedOf(sb.cfg)
	if sh == nil && err == nil {
		return
	}
	start := time.Now()
	var n int64
	if err == nil {
		n, err = store.Export(cp.Name, sh)
	}
	took := time.Since(start)
	if err != nil {
		sb.audit.trail.Emit(audit.TypeCheckpointShared.New("Failure", fmt.Sprintf("checkpoint %s not written to the shared store (%v): it resumes only on this node", cp.Name, err),
			map[string]string{"checkpoint": cp.Name, "error": err.Error()}), true)
		return
	}
	cp.SharedBytes, cp.SharedMillis = n, took.Milliseconds()
	sb.audit.trail.Emit(audit.TypeCheckpointShared.New("Success", fmt.Sprintf("checkpoint %s written to the shared store %s, encrypted: %d bytes in %v", cp.Name, sh.Dir, n, took.Round(time.Millisecond)),
		map[string]string{"checkpoint": cp.Name, "store": sh.Dir, "bytes": fmt.Sprint(n), "took": took.Round(time.Millisecond).String(), "direction": "export"}), true)
}

// importShared takes checkpoint name from the shared store into the
// node's when the node's lacks it, and says what it did ("" : nothing).
func importShared(cfg *config.Config, store *checkpoint.Store, name string) (string, error) {
	if _, err := os.Lstat(filepath.Join(store.Dir, name)); err == nil || checkpoint.ValidName(name) != nil {
		return "", nil
	}
	sh, err := sharedOf(cfg)
	if sh == nil || err != nil || !sh.Has(name) {
		return "", err
	}
	start := time.Now()
	err = store.Import(name, sh)
	// The image's data key has served: it goes, imported or not.
	checkpoint.KeyDir{Dir: cfg.Checkpoint.KeysDir}.Remove(name)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("taken from the shared store %s in %v", sh.Dir, time.Since(start).Round(time.Millisecond)), nil
}

// stopSuspended stops a sandbox whose suspend image is committed, still
// frozen: its sandbox process is killed (as an OOM kill does), so that no
// task of it runs after the image was taken. Only when that process cannot
// be told apart safely does gVisor resume its kernel to kill every
// container (runsc signals no container of a paused sandbox): its tasks
// then run for milliseconds, and what they do is not in the image.
func (s *service) stopSuspended(ctx context.Context, sb *sandboxState) {
	err := killSandboxProcess(s.exits, sb.id)
	if err == nil {
		return
	}
	log.G(ctx).WithError(err).Warn("agentbox: killing a suspended sandbox's process; resuming it to kill its containers instead")
	if _, err := s.next.Resume(ctx, &task.ResumeRequest{ID: sb.id}); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: resuming a suspended sandbox to stop it")
	}
	s.killMembers(ctx, sb)
}

// forceDelete has runsc delete a container of a sandbox stopSuspended
// killed. gVisor's task service then finds it gone, as it expects of a
// checkpointed container.
func forceDelete(ctx context.Context, cfg *config.Config, containerdAddress, id string) {
	root := filepath.Join(cfg.RunscRoot(containerdAddress), namespaceOf(ctx))
	out, err := exec.CommandContext(ctx, cfg.Runsc.Binary, "--root", root, "delete", "--force", id).CombinedOutput()
	if err != nil {
		log.G(ctx).WithError(err).WithField("container_id", id).Warnf("agentbox: runsc delete --force of a suspended container: %s", briefError(string(out)))
	}
}

// killSandboxProcess sends SIGKILL to the sandbox process of root
// container id, through a pidfd, once /proc says that process is the
// shim's own child (the shim is the sandbox's subreaper) and not reaped.
func killSandboxProcess(x *exitRepair, id string) error {
	pid, ok := x.livePid(id)
	if !ok {
		return errors.New("no live sandbox process is known")
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	defer func() { _ = unix.Close(fd) }()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	if ppid := procField(string(status), "PPid"); ppid != fmt.Sprint(os.Getpid()) {
		return fmt.Errorf("process %d's parent is %s, not this shim", pid, ppid)
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// briefError is runsc's error message without what makes it unreadable:
// only its first line (a stack trace may follow), and each ": "-separated
// part longer than 160 bytes (a dump of the object gVisor failed on can
// be megabytes) cut to its start and size. The cause, usually the last part,
// stays.
func briefError(msg string) string {
	msg, _, _ = strings.Cut(msg, "\n")
	parts := strings.Split(msg, ": ")
	for i, p := range parts {
		if len(p) > 160 {
			parts[i] = strings.ToValidUTF8(p[:64], "") + fmt.Sprintf("... [%d bytes left out]", len(p)-64)
		}
	}
	out := strings.TrimRight(strings.Join(parts, ": "), ": ")
	if len(out) > 1024 {
		out = strings.ToValidUTF8(out[:1024], "") + " [...]"
	}
	return out
}

// procField is a field of a /proc/PID/status file.
func procField(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// suspendHold is how long a stop of an agent-sandbox Sandbox's pod whose
// role keeps memory on suspend waits for the node agent's suspend to begin:
// the Sandbox's controller deletes the pod as the node agent, seeing the
// same change, asks for the checkpoint.
const suspendHold = 5 * time.Second

// holdForSuspend holds a stop of a pod that a suspend may be about to
// save (its role keeps memory, and the node agent linked it to a Sandbox)
// until a checkpoint begins, at most suspendHold. Any other stop goes at
// once.
func holdForSuspend(ctx context.Context, sb *sandboxState) {
	if sb.profile == nil || sb.profile.Suspend != policy.SuspendMemory || sb.owner.Load() == nil || sb.suspendedInto.Load() != nil {
		return
	}
	deadline := time.Now().Add(suspendHold)
	for sb.checkpointing.Load() == nil && sb.suspendedInto.Load() == nil && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkpointStopWait bounds how long a kill waits for a checkpoint under
// way (the kubelet's stop of a pod being suspended).
const checkpointStopWait = 60 * time.Second

// waitCheckpoint holds a kill while the sandbox is being checkpointed, at
// most checkpointStopWait: a suspend's image is then complete before the
// stop, and a snapshot is not cut short. It says how long it waited.
func waitCheckpoint(ctx context.Context, sb *sandboxState) (time.Duration, bool) {
	ch := sb.checkpointing.Load()
	if ch == nil {
		return 0, true
	}
	start := time.Now()
	t := time.NewTimer(checkpointStopWait)
	defer t.Stop()
	select {
	case <-*ch:
		return time.Since(start), true
	case <-t.C:
		return time.Since(start), false
	case <-ctx.Done():
		return time.Since(start), false
	}
}

// checkpointByAdmin is the control socket's checkpoint and suspend.
func (s *service) checkpointByAdmin(ctx context.Context, sb *sandboxState, req control.Request, detail map[string]string) (string, *control.Checkpointed, error) {
	name := req.Name
	if name == "" {
		name = defaultCheckpointName(sb.id)
	}
	cp, err := s.checkpoint(ctx, sb, name, req.Op == control.OpCheckpoint, false, detail)
	if err != nil {
		return "", nil, err
	}
	verb := "checkpointed"
	if cp.Suspended {
		verb = "suspended"
	}
	return fmt.Sprintf("%s into %s (%d bytes in %d ms)", verb, cp.Dir, cp.Bytes, cp.Millis), cp, nil
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
		sb.placeholders = maps.Clone(m.Placeholders)
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
	name := sb.restore.image.Manifest.Name
	sb.restoreFailed.Store(&name)
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
			if o.Sandbox.UID != m.SandboxUID {
				return fmt.Errorf("it is Sandbox %s's (uid %s), and this pod belongs to %s (uid %s)", m.SandboxObject, m.SandboxUID, o.Sandbox, o.Sandbox.UID)
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
