// Package manager is the containerd shim manager shared by the agentbox shim
// and the benchmark's stock-gVisor reference: `shim start` and `shim delete`.
package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	types "github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/mount"
	_ "github.com/containerd/containerd/v2/core/runtime" // registers features.Features with typeurl
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsccmd"
	"gvisor.dev/gvisor/pkg/shim/v1/utils"

	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/oomadj"
	"agentbox.dev/agentbox/internal/version"
)

// shimOOMScoreAdj is what the stock gVisor shim asks for: keep the shim
// alive under memory pressure longer than the containers it serves.
const shimOOMScoreAdj = -999

// New returns a containerd shim manager for the runtime type name. It starts
// one shim process per sandbox (all containers of a CRI pod share it) and
// cleans up after a shim that died.
//
// Unlike the stock gVisor manager it does not fail when the host refuses to
// lower the shim's oom_score_adj: it says why once and carries on.
func New(name string, opts ...Option) cdshim.Manager {
	m := &manager{name: name}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Option configures a manager.
type Option func(*manager)

// TaskV3 says the shim daemon also serves containerd's task API v3. `shim
// start` then answers version 3 to a containerd that speaks it (2.x), which
// joins a pod's later containers to the pod's shim itself instead of
// running `shim start` for each: one process start of this binary less per
// container. containerd 1.7 refuses version 3, so it gets 2 (containerdV3).
func TaskV3() Option { return func(m *manager) { m.taskV3 = true } }

type manager struct {
	name   string
	taskV3 bool
}

var _ cdshim.Manager = (*manager)(nil)

func (m *manager) Name() string { return m.name }

// groupID is the shim a container belongs to: its pod sandbox for a CRI
// container, itself otherwise.
func groupID(id string) (string, error) {
	f, err := os.Open("config.json")
	if err != nil {
		return "", fmt.Errorf("read config.json when starting shim: %w", err)
	}
	defer f.Close()
	var s struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.NewDecoder(f).Decode(&s); err != nil {
		return "", fmt.Errorf("decode config.json when starting shim: %w", err)
	}
	for _, k := range []string{ocispec.SandboxIDAnnotation, ocispec.CRIOSandboxIDAnnotation} {
		if g := s.Annotations[k]; g != "" {
			return g, nil
		}
	}
	return id, nil
}

// Start implements shim.Manager: it starts (or finds) the shim daemon that
// serves id and returns its address.
func (m *manager) Start(ctx context.Context, id string, opts cdshim.StartOpts) (_ cdshim.BootstrapParams, retErr error) {
	version := 2
	if m.taskV3 && containerdV3(publishBinary()) {
		version = 3
	}
	params := func(addr string) cdshim.BootstrapParams {
		return cdshim.BootstrapParams{Version: version, Address: addr, Protocol: "ttrpc"}
	}
	group, err := groupID(id)
	if err != nil {
		return cdshim.BootstrapParams{}, err
	}
	address, err := cdshim.SocketAddress(ctx, opts.Address, group, opts.Debug)
	if err != nil {
		return cdshim.BootstrapParams{}, err
	}
	socket, err := cdshim.NewSocket(address)
	if err != nil {
		if !cdshim.SocketEaddrinuse(err) {
			return cdshim.BootstrapParams{}, fmt.Errorf("create shim socket %s: %w", address, err)
		}
		// Another container of the same pod: join its shim.
		if cdshim.CanConnect(address) {
			if err := os.WriteFile("address", []byte(address), 0o644); err != nil {
				return cdshim.BootstrapParams{}, err
			}
			return params(address), nil
		}
		if err := cdshim.RemoveSocket(address); err != nil {
			return cdshim.BootstrapParams{}, fmt.Errorf("remove stale shim socket %s: %w", address, err)
		}
		if socket, err = cdshim.NewSocket(address); err != nil {
			return cdshim.BootstrapParams{}, fmt.Errorf("create shim socket %s (second try): %w", address, err)
		}
	}
	defer func() {
		if retErr != nil {
			_ = socket.Close()
			_ = cdshim.RemoveSocket(address)
		}
	}()
	if err := os.WriteFile("address", []byte(address), 0o644); err != nil {
		return cdshim.BootstrapParams{}, err
	}
	f, err := socket.File()
	if err != nil {
		return cdshim.BootstrapParams{}, err
	}
	defer f.Close()

	cmd, err := daemonCommand(ctx, id, opts)
	if err != nil {
		return cdshim.BootstrapParams{}, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	if err := cmd.Start(); err != nil {
		return cdshim.BootstrapParams{}, fmt.Errorf("start shim daemon: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
	}()
	// Reap the daemon when it exits; its status is containerd's to see.
	go func() { _ = cmd.Wait() }()
	if err := cdshim.WritePidFile("shim.pid", cmd.Process.Pid); err != nil {
		return cdshim.BootstrapParams{}, err
	}
	// The stock gVisor shim fails here when the host refuses a negative
	// oom_score_adj. A shim somewhat more likely to be OOM-killed is better
	// than no container at all. Nothing may be logged here: containerd
	// parses this command's output as the bootstrap parameters. The daemon
	// logs the refusal once when it starts (see shim.New).
	if adj := oomadj.Host(); adj.Refused == nil {
		_ = oomadj.Write(fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid), shimOOMScoreAdj)
	}
	return params(address), nil
}

func daemonCommand(ctx context.Context, id string, opts cdshim.StartOpts) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-address", opts.Address, "-id", id}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// Stop implements shim.Manager: `shim delete`, run by containerd after the
// shim daemon is gone. It force-deletes the runsc container and unmounts the
// rootfs, using the state the daemon saved in the bundle.
func (*manager) Stop(ctx context.Context, id string) (cdshim.StopStatus, error) {
	bundle, err := os.Getwd()
	if err != nil {
		return cdshim.StopStatus{}, err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return cdshim.StopStatus{}, err
	}
	var st runsc.State
	if err := st.Load(bundle); err != nil {
		// Create never got far enough to save state: nothing to clean.
		log.G(ctx).WithError(err).Info("agentbox: no saved runsc state; nothing to delete")
	} else {
		r := proc.NewRunsc(st.Options.Root, bundle, ns, st.Options.BinaryName, st.Options.RunscConfig, nil)
		if err := r.Delete(ctx, id, &runsccmd.DeleteOpts{Force: true}); err != nil {
			log.G(ctx).WithError(err).Info("agentbox: runsc delete")
		}
		if err := mount.UnmountAll(st.Rootfs, 0); err != nil {
			log.G(ctx).WithError(err).Info("agentbox: unmount rootfs")
		}
	}
	// A shim that died leaves the container's checked mounts staged.
	if err := mountguard.Release(filepath.Join(bundle, mountguard.DirName)); err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: release staged mounts")
	}
	// A sandbox whose shim died leaves its cgroup behind.
	if spec, err := utils.ReadSpec(bundle); err == nil && spec.Linux != nil && !isJoining(spec.Annotations) {
		if err := cgroups.Remove(cgroups.Root, spec.Linux.CgroupsPath); err != nil {
			log.G(ctx).WithError(err).Info("agentbox: remove cgroup")
		}
	}
	return cdshim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(unix.SIGKILL)}, nil
}

func isJoining(ann map[string]string) bool {
	return ann[ocispec.ContainerTypeAnnotation] == ocispec.ContainerTypeContainer || ann[ocispec.CRIOContainerTypeAnnotation] == ocispec.ContainerTypeContainer
}

// Info implements shim.Manager.
func (m *manager) Info(ctx context.Context, _ io.Reader) (*types.RuntimeInfo, error) {
	feat, err := typeurl.MarshalAnyToProto(Features())
	if err != nil {
		return nil, fmt.Errorf("marshal runtime features: %w", err)
	}
	return &types.RuntimeInfo{
		Name:     m.Name(),
		Version:  &types.RuntimeVersion{Version: version.Version, Revision: version.Revision},
		Features: feat,
	}, nil
}

// Features is what agentbox honours of the OCI spec, for containerd's
// introspection (the CRI offers recursive read-only mounts to runtimes
// that list "rro"). Only what the shim enforces is listed: "rro" because
// every read-only bind is staged read-only recursively (mount_setattr
// AT_RECURSIVE) and served read-only by gVisor's gofer.
func Features() *features.Features {
	return &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		MountOptions:  []string{"bind", "rbind", "ro", "rro", "rw", "nosuid", "nodev", "noexec", "rprivate", "private"},
	}
}
