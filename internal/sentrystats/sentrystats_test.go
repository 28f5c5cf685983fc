package sentrystats

import (
	"agentbox.dev/agentbox/internal/runscctl"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	runc "github.com/containerd/go-runc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

func TestSandboxCgroup(t *testing.T) {
	spec := func(path string, ann map[string]string) *specs.Spec {
		return &specs.Spec{Linux: &specs.Linux{CgroupsPath: path}, Annotations: ann}
	}
	for _, c := range []struct {
		name string
		spec *specs.Spec
		want string
	}{
		{"a pod's sandbox joins its pod's cgroup", spec("/kubepods/burstable/pod123/abc", map[string]string{containerTypeAnnotation: "sandbox"}), "/kubepods/burstable/pod123"},
		{"relative path", spec("kubepods/pod9/abc", nil), "kubepods/pod9"},
		{"no pod element", spec("/default/abc", nil), "/default/abc"},
		{"the annotation wins", spec("/kubepods/pod1/abc", map[string]string{cgroupParentAnnotation: "/elsewhere"}), "/elsewhere"},
		{"a pod's container keeps its own", spec("/kubepods/pod1/def", map[string]string{containerTypeAnnotation: "container"}), "/kubepods/pod1/def"},
		{"none", &specs.Spec{}, ""},
		{"nil", nil, ""},
	} {
		if got := SandboxCgroup(c.spec); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestFor(t *testing.T) {
	spec := &specs.Spec{Linux: &specs.Linux{CgroupsPath: "/kubepods/pod1/abc"}}
	sb, ok := For("/run/agentbox/runsc/k8s.io/runsc-abc.sock", spec, false)
	if !ok || sb.Socket != "/run/agentbox/runsc/k8s.io/runsc-abc.sock" || sb.Cgroup != "/kubepods/pod1" {
		t.Errorf("%+v %v", sb, ok)
	}
	if _, ok := For("/run/runsc-abc.sock", spec, true); ok {
		t.Error("a systemd cgroup is left to runsc")
	}
	if _, ok := For("/run/runsc-abc.sock", &specs.Spec{Linux: &specs.Linux{CgroupsPath: "kubepods.slice:cri:abc"}}, false); ok {
		t.Error("a systemd-style path is left to runsc")
	}
}

func TestSplitCPU(t *testing.T) {
	usage := map[string]uint64{"a": 100, "b": 300}
	for _, c := range []struct {
		name   string
		usage  map[string]uint64
		id     string
		cgroup uint64
		have   bool
		want   uint64
	}{
		{"scaled to the cgroup", usage, "a", 800, true, 200},
		{"the other container", usage, "b", 800, true, 600},
		{"no cgroup: the sentry's own", usage, "a", 0, false, 100},
		{"cgroup reads 0: the sentry's own", usage, "a", 0, true, 100},
		{"no sentry usage: split evenly", map[string]uint64{"a": 0, "b": 0}, "a", 800, true, 400},
		{"no containers", nil, "a", 800, true, 0},
		{"unknown container", usage, "z", 800, true, 0},
		{"no overflow", map[string]uint64{"a": 20e9}, "a", 20e9, true, 20e9},
	} {
		if got := splitCPU(c.usage, c.id, c.cgroup, c.have); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestDecodeReply(t *testing.T) {
	good := `{"success":true,"err":"","result":{"event":{"type":"stats","id":"c1","data":{"cpu":{"usage":{"total":5}},"memory":{"usage":{"usage":4096,"limit":8192}},"pids":{"current":3}}},"containerUsage":{"c1":5}}}`
	ev, err := decodeReply(strings.NewReader(good), "c1")
	if err != nil || ev.Event.Stats.Memory.Usage.Usage != 4096 || ev.Event.Stats.Pids.Current != 3 || ev.ContainerUsage["c1"] != 5 {
		t.Fatalf("%+v %v", ev, err)
	}
	for _, c := range []struct{ name, reply, want string }{
		{"the sandbox's error", `{"success":false,"err":"no container was found","result":null}`, "no container was found"},
		{"not JSON", `stats!`, "reply"},
		{"cut short", good[:40], "reply"},
		{"another container's", strings.Replace(good, `"id":"c1"`, `"id":"c2"`, 1), `"c2", not "c1"`},
		{"another event", strings.Replace(good, `"stats"`, `"oom"`, 1), `"oom"`},
		{"no data", `{"success":true,"result":{"event":{"type":"stats","id":"c1"}}}`, "without data"},
		{"a result of the wrong shape", `{"success":true,"result":[1,2]}`, "result"},
		{"a long error is cut", `{"success":false,"err":"` + strings.Repeat("x", 5000) + `"}`, "..."},
	} {
		_, err := decodeReply(strings.NewReader(c.reply), "c1")
		if err == nil || !strings.Contains(err.Error(), c.want) || len(err.Error()) > 400 {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	// A reply past the bound is not read whole.
	huge := `{"success":true,"result":{"event":{"type":"stats","id":"c1","data":{}},"containerUsage":{"` + strings.Repeat("a", maxReply) + `":1}}}`
	if _, err := decodeReply(io.LimitReader(strings.NewReader(huge), maxReply), "c1"); err == nil {
		t.Error("a reply past maxReply was accepted")
	}
}

func TestMetricsV1(t *testing.T) {
	var s runc.Stats
	s.Cpu.Usage.Total, s.Memory.Usage.Usage, s.Memory.Usage.Limit, s.Memory.Cache, s.Pids.Current = 7, 4096, 8192, 12, 3
	a, err := metricsV1(&s)
	if err != nil {
		t.Fatal(err)
	}
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		t.Fatal(err)
	}
	m := v.(*cgroup1stats.Metrics)
	if m.CPU.Usage.Total != 7 || m.Memory.Usage.Usage != 4096 || m.Memory.Usage.Limit != 8192 || m.Memory.Cache != 12 || m.Pids.Current != 3 {
		t.Errorf("%+v", m)
	}
}

// containerManager stands in for the sandbox's control server object, served
// by gVisor's own urpc server: the wire is the one runsc speaks.
type containerManager struct{ calls chan string }

type testEventOut struct {
	Event          map[string]any    `json:"event"`
	ContainerUsage map[string]uint64 `json:"containerUsage"`
}

func (cm *containerManager) Event(cid *string, out *testEventOut) error {
	cm.calls <- *cid
	if *cid == "gone" {
		return errors.New("no container was found")
	}
	out.Event = map[string]any{"type": "stats", "id": *cid, "data": map[string]any{
		"cpu": map[string]any{"usage": map[string]any{"total": 10}}, "memory": map[string]any{"usage": map[string]any{"usage": 1 << 20}}, "pids": map[string]any{"current": 2}}}
	out.ContainerUsage = map[string]uint64{*cid: 10, "other": 30}
	return nil
}

func TestLiveReadOverURPC(t *testing.T) {
	// A path past sun_path's bound, as runsc's roots under containerd's
	// state give (bound here through the directory's fd).
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "runsc-"+strings.Repeat("a", 64)+".sock")
	if len(sock) <= runscctl.MaxSocketPath {
		t.Fatalf("socket path %d bytes: not past the bound", len(sock))
	}
	dirFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirFD)
	ln, err := unet.BindAndListen(fmt.Sprintf("/proc/self/fd/%d/%s", dirFD, filepath.Base(sock)), false)
	if err != nil {
		t.Fatal(err)
	}
	srv := urpc.NewServer()
	cm := &containerManager{calls: make(chan string, 4)}
	srv.Register(cm)
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			srv.StartHandling(s)
		}
	}()
	defer ln.Close()

	sb := Sandbox{Socket: sock, Cgroup: "/no/such/cgroup"}
	a, err := sb.Read(context.Background(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-cm.calls; got != "c1" {
		t.Errorf("the sandbox was asked for %q", got)
	}
	v, _ := typeurl.UnmarshalAny(a)
	if m := v.(*cgroup1stats.Metrics); m.Memory.Usage.Usage != 1<<20 || m.Pids.Current != 2 || m.CPU.Usage.Total != 10 {
		t.Errorf("%+v", m)
	}
	if _, err := sb.Read(context.Background(), "gone"); err == nil || !strings.Contains(err.Error(), "no container was found") {
		t.Errorf("the sandbox's error: %v", err)
	}
	<-cm.calls
}

func TestQueryBounded(t *testing.T) {
	dir := t.TempDir()
	// No server: an error, not a hang.
	if _, err := query(context.Background(), filepath.Join(dir, "none.sock"), "c1"); err == nil {
		t.Error("no socket: no error")
	}
	// A server that never answers: the caller's deadline ends the call.
	sock := filepath.Join(dir, "mute.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := query(ctx, sock, "c1"); err == nil {
		t.Error("a mute sandbox: no error")
	}
}
