package ingest

import (
	"encoding/json"
	"fmt"
	"sort"

	"gvisor.dev/gvisor/pkg/sentry/seccheck"

	"agentbox.dev/agentbox/internal/audit"
)

var contextFields = []string{"time", "thread_id", "group_id", "container_id", "credentials", "cwd", "process_name", "parent_thread_group_id"}

type pointConfig struct {
	Name           string   `json:"name"`
	OptionalFields []string `json:"optional_fields,omitempty"`
	ContextFields  []string `json:"context_fields,omitempty"`
}

// PointNames lists the gVisor points a selection enables.
func PointNames(p audit.Points) []pointConfig {
	var out []pointConfig
	add := func(name string, optional ...string) {
		out = append(out, pointConfig{Name: name, OptionalFields: optional, ContextFields: contextFields})
	}
	// Container start is always recorded: it is how a container's life in
	// the trail begins.
	add("container/start", "env")
	if p.Process {
		add("sentry/execve")
		add("sentry/clone")
		add("sentry/task_exit")
		add("syscall/execve/exit", "envv")
		add("syscall/execveat/exit", "envv")
	}
	if p.File {
		for _, s := range []string{"openat", "creat", "fchdir"} {
			add("syscall/"+s+"/exit", "fd_path")
		}
		add("syscall/open/exit")
		add("syscall/chdir/exit")
		for _, s := range FilePatchedPoints {
			add("syscall/" + s + "/exit")
		}
	}
	if p.Network {
		add("syscall/socket/exit")
		for _, s := range []string{"connect", "bind", "accept", "accept4", "listen"} {
			add("syscall/"+s+"/exit", "fd_path")
		}
	}
	sort.SliceStable(out[1:], func(i, j int) bool { return out[1+i].Name < out[1+j].Name })
	return out
}

// PodInitConfig renders runsc's --pod-init-config: one trace session named
// Default whose remote sink is the receiver's socket. The sink's setup
// error is not ignored: a sandbox whose receiver is not there does not
// start.
//
// retries is how often gVisor retries (with exponential backoff from 25µs,
// at most 10ms apart) to write an event to a full socket before it drops
// it: a sandbox in an event storm is slowed down rather than leaving gaps.
// sendBuffer (bytes, 0: the kernel's default) sizes gVisor's end of the
// socket, through agentbox's runsc patch
// (hack/patches/runsc-sink-send-buffer.patch).
func PodInitConfig(p audit.Points, socket string, retries, sendBuffer int) ([]byte, error) {
	// The points are one of eight fixed sets (audit.Points' three switches),
	// checked against gVisor's registry by TestPodInitConfigValidatesAgainstGVisor
	// (the shim and runsc are built from the same gVisor module). They are
	// not checked here: initializing that registry costs ~5 ms of every
	// sandbox's start, and a session runsc cannot configure is refused at
	// Create anyway (the receiver is not live).
	points := PointNames(p)
	type sink struct {
		Name   string         `json:"name"`
		Config map[string]any `json:"config"`
	}
	sinkConfig := map[string]any{"endpoint": socket, "retries": retries}
	if sendBuffer > 0 {
		sinkConfig["send_buffer"] = sendBuffer
	}
	cfg := map[string]any{
		"trace_session": map[string]any{
			"name":   "Default",
			"points": points,
			"sinks":  []sink{{Name: "remote", Config: sinkConfig}},
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// FilePatchedPoints are the file operations that change things, whose
// points agentbox's runsc patch adds (hack/patches/runsc-file-points.patch):
// the gVisor module the shim is built from does not register them.
var FilePatchedPoints = []string{"unlink", "unlinkat", "rmdir", "mkdir", "mkdirat", "rename", "renameat", "renameat2",
	"link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "truncate", "ftruncate"}

// validatePoints checks points and fields against gVisor's own registry
// (the same gVisor version as runsc). runsc only warns about a session it
// cannot configure and boots the sandbox unaudited; the shim refuses first.
func validatePoints(points []pointConfig) error {
	seccheck.Initialize()
	patched := map[string]bool{}
	for _, s := range FilePatchedPoints {
		patched["syscall/"+s+"/exit"] = true
	}
	for _, pc := range points {
		if patched[pc.Name] && len(pc.OptionalFields) == 0 {
			continue // checked against the patch (TestFilePatchedPointsInPatch)
		}
		desc, ok := seccheck.Points[pc.Name]
		if !ok {
			return fmt.Errorf("gVisor has no trace point %q", pc.Name)
		}
		for _, f := range pc.OptionalFields {
			if !hasField(desc.OptionalFields, f) {
				return fmt.Errorf("trace point %q has no optional field %q", pc.Name, f)
			}
		}
		for _, f := range pc.ContextFields {
			if !hasField(desc.ContextFields, f) {
				return fmt.Errorf("trace point %q has no context field %q", pc.Name, f)
			}
		}
	}
	return nil
}

func hasField(fields []seccheck.FieldDesc, name string) bool {
	for _, f := range fields {
		if f.Name == name {
			return true
		}
	}
	return false
}
