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
	"os"
	"path/filepath"
	"strings"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	errgrpc "github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
	pb "gvisor.dev/gvisor/pkg/shim/v1/taskserver/task_server_go_proto"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/errkind"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/shim/sandbox"
)

// PointerFile is what a checkpoint taken through containerd's task API
// leaves in containerd's checkpoint directory (and so in its checkpoint
// image): the signed manifest of the image in the node's store. The memory
// itself stays in the store.
const PointerFile = "agentbox-checkpoint.json"

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
	// Made or not, a checkpoint returns the sandbox to the phase it began
	// in; a suspend that was made stops it instead. A kill waiting for the
	// checkpoint (waitCheckpoint) sees either move.
	defer func() {
		if !stopped {
			// Illegal only when a stop or an exit came meanwhile:
			// the sandbox has moved on, and fire logged it.
			_ = sb.fire(ctx, sandbox.CheckpointDone, "")
		}
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
		Containers: sb.members.List(), WallClockUsed: used, Suspended: !leaveRunning, PauseImage: sb.pauseImage,
		Trail: checkpoint.Trail{Sandbox: sb.id, LastSeq: seq, LastHash: hash}}
	if o := sb.owner.Load(); o != nil {
		m.SandboxObject, m.SandboxUID = o.Sandbox.Namespace+"/"+o.Sandbox.Name, o.Sandbox.UID
	}
	if gw := sb.egress().gateway; gw != nil {
		u := gw.ModelUsage()
		m.ModelTokens, m.ModelRequests = u.Tokens, u.Requests
		m.MCPCalls = gw.MCPUsage()
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
	// Illegal only when a stop or an exit came meanwhile (fire logged
	// it): the image is made, and the sandbox is stopped all the same.
	_ = sb.fire(ctx, sandbox.Suspend, name)
	s.stopSuspended(ctx, sb)
	shareImage(sb, store, cp)
	return cp, nil
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
