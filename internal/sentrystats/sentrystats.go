// Package sentrystats answers a gVisor container's stats in the shim's own
// process. gVisor's task service answers each Stats call by running
// `runsc events --stats`, and containerd's CRI asks every running
// container once a second (its stats collector): a node paid one runsc
// process, about 33 ms of CPU on the benchmark machine, per container per
// second, idle pods included. This package asks the sandbox's control
// server the same question over its socket (the call runsc makes), splits
// the sandbox cgroup's CPU time as runsc does, and builds the metrics
// gVisor's task service would.
//
// The sandbox is untrusted: its reply is bounded in size and time, and a
// reply that does not parse is an error (the shim then asks gVisor's task
// service, as before).
package sentrystats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	runc "github.com/containerd/go-runc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/runscctl"
)

const (
	// eventMethod is the sandbox control server's method runsc events calls.
	eventMethod = "containerManager.Event"
	// maxReply bounds what is read of the sandbox's reply: a container's
	// stats are a few KiB.
	maxReply = 1 << 20
	// callTimeout bounds a call when the caller's context sets no sooner
	// deadline.
	callTimeout = 5 * time.Second
	// cgroupParentAnnotation is where gVisor's task service puts a pod's
	// cgroup for its sandbox to join (runsc reads it).
	cgroupParentAnnotation = "dev.gvisor.spec.cgroup-parent"
	// containerTypeAnnotation marks a CRI container as a pod's sandbox or
	// a container in it.
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
)

// Sandbox is where a sandbox's containers' stats come from.
type Sandbox struct {
	// Socket is the sandbox's control socket.
	Socket string
	// Cgroup is the sandbox's cgroup (cgroupfs form, below
	// /sys/fs/cgroup), whose CPU time is split among its containers.
	Cgroup string
}

// For is the Sandbox whose runsc control socket is socket and whose root
// container has spec; ok is false when its stats are left to runsc: a
// systemd cgroup (runsc reads it through systemd, and gVisor's task
// service then answers cgroup v2 metrics).
func For(socket string, spec *specs.Spec, systemdCgroup bool) (Sandbox, bool) {
	sb := Sandbox{Socket: socket, Cgroup: SandboxCgroup(spec)}
	if systemdCgroup || strings.Contains(sb.Cgroup, ":") {
		return Sandbox{}, false
	}
	return sb, true
}

// SandboxCgroup is the cgroup runsc puts a sandbox in, from its root
// container's spec as the shim passes it to gVisor's task service: the
// cgroup-parent annotation; else, for a pod's sandbox, the pod's cgroup
// (the path up to its "pod..." element, as gVisor's task service sets that
// annotation); else the container's own cgroupsPath.
func SandboxCgroup(spec *specs.Spec) string {
	if spec == nil {
		return ""
	}
	if p, ok := spec.Annotations[cgroupParentAnnotation]; ok {
		return p
	}
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return ""
	}
	path := spec.Linux.CgroupsPath
	if t, ok := spec.Annotations[containerTypeAnnotation]; ok && t != "sandbox" {
		return path
	}
	parts := strings.Split(path, "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if strings.HasPrefix(parts[i], "pod") {
			pod := filepath.Join(parts[:i+1]...)
			if filepath.IsAbs(path) {
				pod = "/" + pod
			}
			return pod
		}
	}
	return path
}

// Read is container id's stats, read from its sandbox sb, as gVisor's
// task service builds them; err is set when the sandbox did not answer as
// expected. Which containers are read so (those started and not ended) is
// the caller's to say.
func (sb Sandbox) Read(ctx context.Context, id string) (*anypb.Any, error) {
	ev, err := query(ctx, sb.Socket, id)
	if err != nil {
		return nil, err
	}
	cpu, ok := cgroups.ReadCPU(cgroups.Root, sb.Cgroup)
	ev.Event.Stats.Cpu.Usage.Total = splitCPU(ev.ContainerUsage, id, uint64(cpu), ok)
	return metricsV1(ev.Event.Stats)
}

// eventOut is the control server's reply to containerManager.Event
// (runsc/boot.EventOut): its event's data decodes as runc's stats, as
// `runsc events --stats` prints them for gVisor's task service.
type eventOut struct {
	Event          runc.Event        `json:"event"`
	ContainerUsage map[string]uint64 `json:"containerUsage"`
}

// query calls containerManager.Event for container id over the urpc
// control socket: one JSON call, one JSON reply.
func query(ctx context.Context, socket, id string) (*eventOut, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var ev eventOut
	if err := runscctl.Call(ctx, socket, eventMethod, id, &ev, maxReply); err != nil {
		return nil, err
	}
	return checkEvent(&ev, id)
}

// decodeReply reads one urpc reply to containerManager.Event for id.
func decodeReply(r io.Reader, id string) (*eventOut, error) {
	var ev eventOut
	if err := runscctl.DecodeReply(r, &ev); err != nil {
		return nil, err
	}
	return checkEvent(&ev, id)
}

// checkEvent checks that ev is container id's stats.
func checkEvent(ev *eventOut, id string) (*eventOut, error) {
	switch {
	case ev.Event.Type != "stats":
		return nil, fmt.Errorf("sandbox control socket: event of type %q, not stats", runscctl.Brief(ev.Event.Type))
	case ev.Event.ID != id:
		return nil, fmt.Errorf("sandbox control socket: stats of container %q, not %q", runscctl.Brief(ev.Event.ID), id)
	case ev.Event.Stats == nil:
		return nil, errors.New("sandbox control socket: stats without data")
	}
	return ev, nil
}

// splitCPU is container id's share of its sandbox cgroup's CPU time
// (cgroupUsage ns; haveCgroup false when it could not be read), in
// proportion to the sentry's own per-container accounting, as runsc's
// events command computes it (runsc/container.populateStats).
func splitCPU(usage map[string]uint64, id string, cgroupUsage uint64, haveCgroup bool) uint64 {
	if len(usage) == 0 {
		return 0
	}
	var mine, all uint64
	for c, u := range usage {
		all += u
		if c == id {
			mine = u
		}
	}
	if !haveCgroup || cgroupUsage == 0 {
		return mine
	}
	if all == 0 {
		all, mine = cgroupUsage, cgroupUsage/uint64(len(usage))
	}
	// Floats: the product overflows a uint64 after 16 s of each.
	return uint64(float64(mine) * (float64(cgroupUsage) / float64(all)))
}

// metricsV1 builds the cgroup v1 metrics gVisor's task service answers
// for a container (pkg/shim/v1/runsc.Container.getV1Stats).
func metricsV1(s *runc.Stats) (*anypb.Any, error) {
	entry := func(e runc.MemoryEntry) *cgroup1stats.MemoryEntry {
		return &cgroup1stats.MemoryEntry{Limit: e.Limit, Usage: e.Usage, Max: e.Max, Failcnt: e.Failcnt}
	}
	m := &cgroup1stats.Metrics{
		CPU: &cgroup1stats.CPUStat{
			Usage: &cgroup1stats.CPUUsage{Total: s.Cpu.Usage.Total, Kernel: s.Cpu.Usage.Kernel, User: s.Cpu.Usage.User, PerCPU: s.Cpu.Usage.Percpu},
			Throttling: &cgroup1stats.Throttle{Periods: s.Cpu.Throttling.Periods,
				ThrottledPeriods: s.Cpu.Throttling.ThrottledPeriods, ThrottledTime: s.Cpu.Throttling.ThrottledTime},
		},
		Memory: &cgroup1stats.MemoryStat{
			Cache: s.Memory.Cache, Usage: entry(s.Memory.Usage), Swap: entry(s.Memory.Swap),
			Kernel: entry(s.Memory.Kernel), KernelTCP: entry(s.Memory.KernelTCP),
		},
		Pids: &cgroup1stats.PidsStat{Current: s.Pids.Current, Limit: s.Pids.Limit},
	}
	return typeurl.MarshalAnyToProto(m)
}
