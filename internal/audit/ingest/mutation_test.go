package ingest

import (
	"fmt"
	"os"
	"strings"
	"testing"

	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
)

// Every point the shim asks for beyond gVisor's own is registered by the
// runsc patch, under the syscall number the decoder expects, and wired to
// a converter.
func TestFilePatchedPointsInPatch(t *testing.T) {
	b, err := os.ReadFile("../../../hack/patches/runsc-file-points.patch")
	if err != nil {
		t.Fatal(err)
	}
	patch := string(b)
	byName := map[string]uint64{}
	for no, m := range mutations {
		byName[m.name] = no
	}
	for _, name := range FilePatchedPoints {
		no, ok := byName[name]
		if !ok {
			t.Errorf("%s: the decoder has no syscall number for it", name)
			continue
		}
		if !strings.Contains(patch, fmt.Sprintf("+\taddSyscallPoint(%d, %q, nil)", no, name)) {
			t.Errorf("%s: the patch does not register syscall/%s as amd64 syscall %d", name, name, no)
		}
		if !strings.Contains(patch, fmt.Sprintf("syscalls.SupportedPoint(%q, ", name)) {
			t.Errorf("%s: the patch does not give the syscall table a converter", name)
		}
	}
	if len(byName) != len(FilePatchedPoints) {
		t.Errorf("%d syscall numbers for %d points", len(byName), len(FilePatchedPoints))
	}
}

func TestMutationRecords(t *testing.T) {
	cd := &pb.ContextData{ThreadGroupId: 3, ThreadId: 3, Cwd: "/work", ProcessName: "rm"}
	ok, fail := &pb.Exit{}, &pb.Exit{Errorno: 2}
	for _, tc := range []struct {
		msg                   Message
		event, activity, path string
		target, flags         string
		mode                  uint32
		status                string
	}{
		{Message{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 87, Pathname: "repo/.git/config"}}, "syscall/unlink", "Delete", "/work/repo/.git/config", "", "", 0, "Success"},
		{Message{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 263, Fd: 5, FdPath: "/work/repo", Pathname: "src", Flags: atRemoveDir}}, "syscall/unlinkat", "Delete", "/work/repo/src", "", "AT_REMOVEDIR", 0, "Success"},
		{Message{Payload: &pb.Open{ContextData: cd, Exit: fail, Sysno: 84, Pathname: "/nope"}}, "syscall/rmdir", "Delete", "/nope", "", "", 0, "Failure"},
		{Message{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 258, Fd: -100, Pathname: "d", Mode: 0o755}}, "syscall/mkdirat", "Create", "/work/d", "", "", 0o755, "Success"},
		{Message{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 268, Fd: -100, Pathname: "/etc/x", Mode: 0o4755}}, "syscall/fchmodat", "Set Security", "/etc/x", "", "", 0o4755, "Success"},
		{Message{Payload: &pb.Open{ContextData: cd, Exit: ok, Sysno: 77, Fd: 4, FdPath: "/work/log"}}, "syscall/ftruncate", "Update", "/work/log", "", "", 0, "Success"},
		{Message{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 82, Pathname: "a.yaml", Argv: []string{"", "/etc/app.yaml"}}}, "syscall/rename", "Rename", "/work/a.yaml", "/etc/app.yaml", "", 0, "Success"},
		{Message{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 316, Fd: 3, FdPath: "/work", Pathname: "x", Argv: []string{"/tmp", "y"}, Flags: 1}}, "syscall/renameat2", "Rename", "/work/x", "/tmp/y", "0x1", 0, "Success"},
		{Message{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 88, Pathname: "../../etc/shadow", Argv: []string{"", "s"}}}, "syscall/symlink", "Create", "/work/s", "../../etc/shadow", "", 0, "Success"},
		{Message{Payload: &pb.Execve{ContextData: cd, Exit: ok, Sysno: 265, Fd: -100, Pathname: "/etc/passwd", Argv: []string{"", "p"}}}, "syscall/linkat", "Create", "/etc/passwd", "/work/p", "", 0, "Success"},
	} {
		r := ToRecord(tc.msg, nopScrubber{})
		if r == nil || r.Event != tc.event || r.ActivityName != tc.activity || r.ClassUID != audit.ClassFileSystem || r.File == nil || r.File.Path != tc.path ||
			r.File.Flags != tc.flags || r.File.Mode != tc.mode || r.Status != tc.status {
			t.Errorf("%s: %+v file %+v", tc.event, r, r.File)
			continue
		}
		if (tc.target == "") != (r.Target == nil) || r.Target != nil && r.Target.Path != tc.target {
			t.Errorf("%s: target %+v, want %q", tc.event, r.Target, tc.target)
		}
	}
	// A real execve still is one.
	if r := ToRecord(Message{Payload: &pb.Execve{ContextData: cd, Exit: &pb.Exit{Errorno: 13}, Sysno: 59, Pathname: "/tmp/x"}}, nopScrubber{}); r == nil || r.Event != "syscall/execve" {
		t.Fatalf("execve: %+v", r)
	}
}
