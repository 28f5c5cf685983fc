// Package shim is the agentbox containerd shim: gVisor's runsc task service,
// wrapped by a layer that resolves the shim configuration, rewrites each
// container's OCI spec before runsc sees it, and repairs what the stock
// gVisor shim gets wrong on hosts like ours (see the field notes in README).
package shim

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	types "github.com/containerd/containerd/v2/pkg/protobuf/types"
	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/pkg/sys/reaper"
	errgrpc "github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"github.com/pelletier/go-toml/v2"
	"google.golang.org/protobuf/proto"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
	"gvisor.dev/gvisor/pkg/shim/v1/utils"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/oomadj"
)

// RuntimeName is the containerd runtime type this shim serves.
const RuntimeName = "io.containerd.agentbox.v1"

// runscOptionsFile is the gVisor-format options file the shim derives from
// the agentbox config and writes into each bundle.
const runscOptionsFile = "agentbox-runsc.toml"

// runtimeOptionsTypeURL is the type of containerd's runtime options that
// carry a ConfigPath (ctr --runtime-config-path, CRI options.ConfigPath).
const runtimeOptionsTypeURL = "runtimeoptions.v1.Options"

// service is the agentbox task service. It forwards every call to gVisor's
// runsc task service (next) and adds its own work around Create and Delete.
type service struct {
	next  extension.TaskServiceExt
	exits *exitRepair
	// containerdAddress identifies the containerd instance this shim serves.
	containerdAddress string

	sd shutdown.Service
}

var _ cdshim.TTRPCService = (*service)(nil)
var _ task.TaskService = (*service)(nil)

// New builds the agentbox task service on top of gVisor's runsc task service.
func New(ctx context.Context, publisher cdshim.Publisher, sd shutdown.Service) (*service, error) {
	s := &service{exits: newExitRepair(), sd: sd}
	if f := flag.Lookup("address"); f != nil {
		s.containerdAddress = f.Value.String()
	}
	reaped := reaper.Default.Subscribe()
	err := s.exits.install(func() error {
		var err error
		s.next, err = runsc.NewTaskService(ctx, publisher, sd)
		return err
	}, reaped)
	if err != nil {
		reaper.Default.Unsubscribe(reaped)
		sd.Shutdown()
		return nil, err
	}
	if adj := oomadj.Host(); adj.Refused != nil {
		log.G(ctx).WithError(adj.Refused).Warnf("agentbox: this host refuses to lower oom_score_adj: the shim keeps %d and containers asking for less get %d", adj.Floor, adj.Floor)
	}
	if address, _ := cdshim.ReadAddress("address"); address != "" {
		sd.RegisterCallback(func(context.Context) error {
			return cdshim.RemoveSocket(address)
		})
	}
	return s, nil
}

// RegisterTTRPC implements shim.TTRPCService.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	task.RegisterTaskService(server, s)
	return nil
}

// Create resolves the shim config, rewrites the bundle's spec, points gVisor
// at a runsc options file derived from the config, then creates the
// container.
func (s *service) Create(ctx context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("container_id", r.ID))
	sandboxRoot, err := s.prepare(ctx, r)
	if err != nil {
		log.G(ctx).WithError(err).Error("agentbox: create refused")
		return nil, errgrpc.ToGRPC(err)
	}
	resp, err := s.next.Create(ctx, r)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if sandboxRoot {
		s.exits.track(r.ID, int(resp.Pid))
	}
	return resp, nil
}

// prepare does the agentbox part of Create. It reports whether the container
// is the root of its sandbox.
func (s *service) prepare(ctx context.Context, r *task.CreateTaskRequest) (bool, error) {
	cfgPath, named, err := configPathOf(r)
	if err != nil {
		return false, err
	}
	cfg, err := config.Load(cfgPath, named)
	if err != nil {
		return false, err
	}
	spec, err := utils.ReadSpec(r.Bundle)
	if err != nil {
		return false, fmt.Errorf("read OCI spec of %s: %w", r.ID, err)
	}
	rewrites := []ocispec.Rewrite{ocispec.MarkSandboxRoot}
	if adj := oomadj.Host(); adj.Refused != nil {
		rewrites = append(rewrites, ocispec.RaiseOOMScoreAdj(adj.Floor))
	}
	changes, err := ocispec.Apply(spec, rewrites...)
	if err != nil {
		return false, err
	}
	if len(changes) > 0 {
		if err := utils.WriteSpec(r.Bundle, spec); err != nil {
			return false, fmt.Errorf("write OCI spec of %s: %w", r.ID, err)
		}
		for _, c := range changes {
			log.G(ctx).Debugf("agentbox: spec: %s", c)
		}
	}
	_, joins := ocispec.IsSandboxContainerOf(spec)

	ns := namespaceOf(ctx)
	root := cfg.RunscRoot(s.containerdAddress)
	if err := os.MkdirAll(filepath.Join(root, ns), 0o711); err != nil {
		return false, fmt.Errorf("create runsc root %s: %w", root, err)
	}
	optsPath := filepath.Join(r.Bundle, runscOptionsFile)
	if err := writeRunscOptions(optsPath, cfg, root); err != nil {
		return false, err
	}
	any, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{TypeUrl: runtimeOptionsTypeURL, ConfigPath: optsPath})
	if err != nil {
		return false, fmt.Errorf("marshal runsc options: %w", err)
	}
	r.Options = any
	log.G(ctx).WithField("config", cfg.Source).WithField("runsc_root", root).Debug("agentbox: create")
	return !joins, nil
}

// configPathOf returns the config file containerd named for this container,
// or config.DefaultPath when it named none.
func configPathOf(r *task.CreateTaskRequest) (path string, named bool, err error) {
	if r.Options == nil || len(r.Options.GetValue()) == 0 && r.Options.GetTypeUrl() == "" {
		return config.DefaultPath, false, nil
	}
	if r.Options.GetTypeUrl() != runtimeOptionsTypeURL {
		return "", false, fmt.Errorf("unsupported runtime options type %q: agentbox takes %q with a ConfigPath (ctr --runtime-config-path, CRI options.ConfigPath)", r.Options.GetTypeUrl(), runtimeOptionsTypeURL)
	}
	var o runtimeoptions.Options
	if err := proto.Unmarshal(r.Options.GetValue(), &o); err != nil {
		return "", false, fmt.Errorf("decode runtime options: %w", err)
	}
	if o.ConfigPath == "" {
		return config.DefaultPath, false, nil
	}
	return o.ConfigPath, true, nil
}

// gvisorOptions mirrors the fields of gVisor's runsc.Options that the shim
// sets; gVisor's task service reads them back from the file.
type gvisorOptions struct {
	BinaryName  string            `toml:"binary_name"`
	Root        string            `toml:"root"`
	LogLevel    string            `toml:"log_level,omitempty"`
	RunscConfig map[string]string `toml:"runsc_config,omitempty"`
}

func writeRunscOptions(path string, cfg *config.Config, root string) error {
	b, err := toml.Marshal(gvisorOptions{
		BinaryName:  cfg.Runsc.Binary,
		Root:        root,
		LogLevel:    cfg.Shim.LogLevel,
		RunscConfig: cfg.Runsc.Flags,
	})
	if err != nil {
		return fmt.Errorf("encode runsc options: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write runsc options: %w", err)
	}
	return nil
}

func namespaceOf(ctx context.Context) string {
	if f := flag.Lookup("namespace"); f != nil && f.Value.String() != "" {
		return f.Value.String()
	}
	return "default"
}

// Delete forwards and forgets the container's exit bookkeeping.
func (s *service) Delete(ctx context.Context, r *task.DeleteRequest) (*task.DeleteResponse, error) {
	resp, err := s.next.Delete(ctx, r)
	if err == nil && r.ExecID == "" {
		s.exits.forget(r.ID)
	}
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Start(ctx context.Context, r *task.StartRequest) (*task.StartResponse, error) {
	resp, err := s.next.Start(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Exec(ctx context.Context, r *task.ExecProcessRequest) (*types.Empty, error) {
	resp, err := s.next.Exec(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) State(ctx context.Context, r *task.StateRequest) (*task.StateResponse, error) {
	resp, err := s.next.State(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Pids(ctx context.Context, r *task.PidsRequest) (*task.PidsResponse, error) {
	resp, err := s.next.Pids(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Pause(ctx context.Context, r *task.PauseRequest) (*types.Empty, error) {
	resp, err := s.next.Pause(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Resume(ctx context.Context, r *task.ResumeRequest) (*types.Empty, error) {
	resp, err := s.next.Resume(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Checkpoint(ctx context.Context, r *task.CheckpointTaskRequest) (*types.Empty, error) {
	resp, err := s.next.Checkpoint(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Kill(ctx context.Context, r *task.KillRequest) (*types.Empty, error) {
	resp, err := s.next.Kill(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) ResizePty(ctx context.Context, r *task.ResizePtyRequest) (*types.Empty, error) {
	resp, err := s.next.ResizePty(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) CloseIO(ctx context.Context, r *task.CloseIORequest) (*types.Empty, error) {
	resp, err := s.next.CloseIO(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Update(ctx context.Context, r *task.UpdateTaskRequest) (*types.Empty, error) {
	resp, err := s.next.Update(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Wait(ctx context.Context, r *task.WaitRequest) (*task.WaitResponse, error) {
	resp, err := s.next.Wait(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Stats(ctx context.Context, r *task.StatsRequest) (*task.StatsResponse, error) {
	resp, err := s.next.Stats(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) Connect(ctx context.Context, r *task.ConnectRequest) (*task.ConnectResponse, error) {
	resp, err := s.next.Connect(ctx, r)
	return resp, errgrpc.ToGRPC(err)
}

// Shutdown ends the shim once it serves no container. gVisor's task service
// answers an error while containers remain; that is not a failure.
func (s *service) Shutdown(ctx context.Context, r *task.ShutdownRequest) (*types.Empty, error) {
	resp, err := s.next.Shutdown(ctx, r)
	if err != nil {
		log.G(ctx).WithError(err).Debug("agentbox: shutdown deferred")
		return &types.Empty{}, nil
	}
	s.sd.Shutdown()
	return resp, nil
}
