package shim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/typeurl/v2"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func profile(egress string, mem int64, rules ...policy.EgressRule) *policy.Profile {
	return &policy.Profile{Role: "coder", Network: policy.NetworkProfile{Egress: egress, Allow: rules},
		Limits: policy.LimitsProfile{MemoryBytes: mem, WallClock: time.Hour}, Filesystem: policy.FilesystemProfile{Rootfs: "read-only"}}
}

func TestCheckRestoreWallClock(t *testing.T) {
	p := profile(policy.EgressNone, 0)
	prof, _ := json.Marshal(p)
	pl, _ := netpolicy.Compile(p)
	eg, _ := json.Marshal(pl)
	img := &checkpoint.Image{Manifest: checkpoint.Manifest{Name: "cp", Profile: prof, Egress: eg, WallClockUsed: 30 * time.Minute,
		Namespace: "k8s.io", PodNamespace: "team-a"}}
	req := policy.Request{ContainerdNamespace: "k8s.io", PodNamespace: "team-a"}
	if err := checkRestore(&restoring{image: img}, p, req); err != nil {
		t.Fatalf("half the wall clock used: %v", err)
	}
	img.Manifest.WallClockUsed = 2 * time.Hour
	if err := checkRestore(&restoring{image: img}, p, req); err == nil || !strings.Contains(err.Error(), "wall clock") {
		t.Fatalf("a used-up wall clock: %v", err)
	}
	// A template's agent is a new one: its clock starts afresh.
	if err := checkRestore(&restoring{image: img, template: true}, p, req); err != nil {
		t.Fatalf("a template: %v", err)
	}
	img.Manifest.WallClockUsed = time.Minute
	// Another tenant's pod, under a role as tight, does not get the
	// agent's memory; nor does a ctr container.
	for _, other := range []policy.Request{{ContainerdNamespace: "k8s.io", PodNamespace: "team-b"}, {ContainerdNamespace: "default"}} {
		if err := checkRestore(&restoring{image: img}, p, other); err == nil || !strings.Contains(err.Error(), "restored only where it was taken") {
			t.Fatalf("a restore into %+v: %v", other, err)
		}
	}
	// A role's template is the admin's: any namespace bound to the role.
	if err := checkRestore(&restoring{image: img, template: true}, p, policy.Request{ContainerdNamespace: "k8s.io", PodNamespace: "team-b"}); err != nil {
		t.Fatalf("a template in another namespace: %v", err)
	}
	img.Manifest.Quarantined = "exfiltration"
	if err := checkRestore(&restoring{image: img}, p, req); err == nil || !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("a quarantined checkpoint: %v", err)
	}
}

func TestCheckpointOptions(t *testing.T) {
	req := func(o *runcoptions.CheckpointOptions) *task.CheckpointTaskRequest {
		a, err := typeurl.MarshalAnyToProto(o)
		if err != nil {
			t.Fatal(err)
		}
		return &task.CheckpointTaskRequest{ID: "x", Path: "/tmp/x", Options: a}
	}
	if exit, err := checkpointOptions(&task.CheckpointTaskRequest{ID: "x"}); err != nil || exit {
		t.Fatalf("no options: %v %v", exit, err)
	}
	if exit, err := checkpointOptions(req(&runcoptions.CheckpointOptions{Exit: true, WorkPath: "/w"})); err != nil || !exit {
		t.Fatalf("exit: %v %v", exit, err)
	}
	if _, err := checkpointOptions(req(&runcoptions.CheckpointOptions{OpenTcp: true})); err == nil || !strings.Contains(err.Error(), "open_tcp") {
		t.Fatalf("open_tcp: %v", err)
	}
	if err := checkpoint.ValidName(defaultCheckpointName("0123456789abcdef0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
}

// A restored sandbox keeps the placeholders its agent holds in memory (the
// gateway knows them for what they are); its trail starts with the link.
func TestOpenRestoreKeepsPlaceholders(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Checkpoint.Dir, cfg.Checkpoint.KeyFile = filepath.Join(dir, "store"), filepath.Join(dir, "node.key")
	st, err := checkpoint.OpenStore(cfg.Checkpoint.Dir, cfg.Checkpoint.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	tmp, _ := st.Begin("cp")
	os.WriteFile(filepath.Join(tmp, "pages.img"), []byte("pages"), 0o600)
	ph := map[string]string{"GITHUB_TOKEN": "agentbox-placeholder-0123"}
	if _, err := st.Commit(tmp, &checkpoint.Manifest{Name: "cp", SandboxID: "old", Containers: []string{"old"}, Placeholders: ph,
		WallClockUsed: time.Minute, Trail: checkpoint.Trail{Sandbox: "old", LastSeq: 9, LastHash: strings.Repeat("a", 64)}}); err != nil {
		t.Fatal(err)
	}
	fs, err := audit.NewFileSink(filepath.Join(dir, "audit"), "new", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandboxState("new", cfg, nil, audit.NewTrail(audit.Meta{Sandbox: "new"}, fs))
	if err := openRestore(cfg, sb, "cp", false); err != nil {
		t.Fatal(err)
	}
	if got := sb.placeholder("GITHUB_TOKEN"); got != ph["GITHUB_TOKEN"] {
		t.Fatalf("placeholder %q, want the checkpoint's %q", got, ph["GITHUB_TOKEN"])
	}
	if sb.clock.Used() != time.Minute || sb.restore == nil || sb.restore.pending.Load() != 1 {
		t.Fatalf("restore state: %+v, wall clock used %v", sb.restore, sb.clock.Used())
	}
	sb.audit.trail.Close(audit.TypeSandboxEnd.New("Success", "end", nil))
	b, _ := os.ReadFile(filepath.Join(dir, "audit", "new.jsonl"))
	first := strings.SplitN(string(b), "\n", 2)[0]
	if !strings.Contains(first, `"event_code":"agentbox/restored"`) || !strings.Contains(first, strings.Repeat("a", 64)) {
		t.Fatalf("the trail's first record: %s", first)
	}
	// A template's agent is a new one: its own placeholders, its own clock.
	sb2 := newSandboxState("new2", cfg, nil, sb.audit.trail)
	if err := openRestore(cfg, sb2, "cp", true); err != nil && !strings.Contains(err.Error(), "closed") {
		t.Fatal(err)
	}
	if sb2.placeholder("GITHUB_TOKEN") == ph["GITHUB_TOKEN"] || sb2.clock.Used() != 0 {
		t.Fatal("a template start kept the checkpoint's placeholders or wall clock")
	}
}

func TestBriefError(t *testing.T) {
	dump := "&wire.Array{Contents:[]wire.Object{" + strings.Repeat("(*wire.Struct)(0x72bb), ", 2000) + "}}"
	for _, tc := range []struct{ in, want string }{
		{`checkpointing container "c1": error serializing object ` + dump + ": no space left on device:\ngoroutine 1 [running]:\nmain.main()",
			`checkpointing container "c1": error serializing object &wire.Array{Contents:[]wire.Object{(*wi... [47998 bytes left out]: no space left on device`},
		{"runsc: no space left on device", "runsc: no space left on device"},
		{strings.Repeat("x", 100) + ": " + strings.Repeat("y", 2000), strings.Repeat("x", 100) + ": " + strings.Repeat("y", 64) + "... [1936 bytes left out]"},
	} {
		if got := briefError(tc.in); got != tc.want {
			t.Errorf("briefError:\n got %q\nwant %q", got, tc.want)
		}
	}
}

func TestProcField(t *testing.T) {
	status := "Name:\trunsc-sandbox\nState:\tS (sleeping)\nPid:\t42\nPPid:\t7\n"
	if got := procField(status, "PPid"); got != "7" {
		t.Fatalf("PPid: %q", got)
	}
	if got := procField(status, "Uid"); got != "" {
		t.Fatalf("a field not there: %q", got)
	}
}
