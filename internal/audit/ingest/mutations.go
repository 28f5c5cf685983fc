package ingest

// File mutations (unlink, rename, mkdir, chmod...) as records of one path
// or two.

import (
	"fmt"

	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
)

// mutation is a file operation that changes something, as agentbox's
// runsc patch (hack/patches/runsc-file-points.patch) reports it: one
// path in an Open message, two in an Execve message, told apart by sysno.
type mutation struct {
	name     string
	activity int
	caption  string
	twoPaths bool
	// mode: the message's Mode is the call's (mkdir, chmod).
	mode bool
}

// mutations, by amd64 syscall number.
var mutations = map[uint64]mutation{
	76:  {"truncate", 3, "Update", false, false},
	77:  {"ftruncate", 3, "Update", false, false},
	82:  {"rename", 5, "Rename", true, false},
	83:  {"mkdir", 1, "Create", false, true},
	84:  {"rmdir", 4, "Delete", false, false},
	86:  {"link", 1, "Create", true, false},
	87:  {"unlink", 4, "Delete", false, false},
	88:  {"symlink", 1, "Create", true, false},
	90:  {"chmod", 7, "Set Security", false, true},
	91:  {"fchmod", 7, "Set Security", false, true},
	258: {"mkdirat", 1, "Create", false, true},
	263: {"unlinkat", 4, "Delete", false, false},
	264: {"renameat", 5, "Rename", true, false},
	265: {"linkat", 1, "Create", true, false},
	266: {"symlinkat", 1, "Create", true, false},
	268: {"fchmodat", 7, "Set Security", false, true},
	316: {"renameat2", 5, "Rename", true, false},
}

// atRemoveDir is unlinkat's AT_REMOVEDIR: the call is an rmdir.
const atRemoveDir = 0x200

// onePathRecord: unlink, rmdir, mkdir, chmod, truncate and their forms.
// fchmod and ftruncate name no path: the file is the fd's.
func onePathRecord(p *pb.Open, m mutation) *audit.Record {
	e, r := base(p.GetContextData(), audit.ClassFileSystem, m.activity, m.caption, "syscall/"+m.name)
	e.setResult(p.GetExit())
	f := &e.file
	if p.GetPathname() == "" {
		f.Path = clip(p.GetFdPath())
	} else {
		f.Path = resolve(p.GetFdPath(), p.GetPathname(), r.Process.Cwd)
	}
	if m.mode {
		f.Mode = p.GetMode()
	}
	if m.name == "unlinkat" && p.GetFlags()&atRemoveDir != 0 {
		f.Flags = "AT_REMOVEDIR"
	}
	r.File = f
	return r
}

// twoPathRecord: rename, link, symlink and their forms. File is the old
// name (rename) or the existing file (link), Target the new name; for a
// symlink, File is the new link and Target its target as written (not a
// path the call resolves).
func twoPathRecord(p *pb.Execve, m mutation) *audit.Record {
	e, r := base(p.GetContextData(), audit.ClassFileSystem, m.activity, m.caption, "syscall/"+m.name)
	e.setResult(p.GetExit())
	var second string
	if argv := p.GetArgv(); len(argv) == 2 {
		second = resolve(argv[0], argv[1], r.Process.Cwd)
	}
	first := resolve(p.GetFdPath(), p.GetPathname(), r.Process.Cwd)
	if m.name == "symlink" || m.name == "symlinkat" {
		first, second = second, clip(p.GetPathname())
	}
	e.file = audit.File{Path: first}
	r.File = &e.file
	r.Target = &audit.File{Path: second}
	if fl := p.GetFlags(); fl != 0 {
		r.File.Flags = fmt.Sprintf("0x%x", fl)
	}
	return r
}
