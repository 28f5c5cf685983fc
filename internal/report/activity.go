package report

// The builder's files and hosts: what the sandbox did to each file and
// each name, grouped, and what is left to do once every record is read.

import (
	"net/netip"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

func (b *builder) file(r *audit.Record, t time.Time) {
	if r.File == nil {
		return
	}
	item := Item{Time: t, Event: r.Event, Seq: r.Seq, PID: pidOf(r)}
	if r.Status == "Failure" {
		if denied[r.Errno] {
			b.refusal(item, strings.TrimPrefix(r.Event, "syscall/")+" "+r.File.Path+": "+errnoText(r.Errno))
		}
		return
	}
	if strings.HasPrefix(r.File.Path, "/dev/") || strings.HasPrefix(r.File.Path, "/proc/") {
		return // a redirect to /dev/null or a write to /proc changes no file
	}
	fc := FileChange{Time: t, Path: r.File.Path, PID: item.PID}
	if r.Process != nil {
		fc.Comm = r.Process.Name
	}
	switch r.ActivityName {
	case "Open":
		switch {
		case strings.Contains(r.File.Flags, "O_CREAT"):
			fc.Op = "created"
		case strings.Contains(r.File.Flags, "O_TRUNC"), strings.Contains(r.File.Flags, "O_WRONLY"), strings.Contains(r.File.Flags, "O_RDWR"), strings.Contains(r.File.Flags, "O_APPEND"):
			fc.Op = "changed"
		default:
			return // a read changes nothing
		}
	case "Create":
		fc.Op = "created"
		if r.Target != nil {
			fc.Op, fc.Target = "linked", r.Target.Path
		}
	case "Delete":
		fc.Op = "deleted"
	case "Rename":
		fc.Op = "renamed"
		if r.Target != nil {
			fc.Target = r.Target.Path
		}
	case "Set Security":
		fc.Op, fc.Mode = "mode", "0"+strconv.FormatUint(uint64(r.File.Mode), 8)
	case "Update":
		fc.Op = "changed"
	default:
		return
	}
	b.files = append(b.files, fc)
}

func (b *builder) host(name string) *Host {
	if name == "" {
		name = "(no name)"
	}
	h := b.hosts[name]
	if h == nil {
		h = &Host{Host: name}
		b.hosts[name] = h
	}
	return h
}

func (b *builder) finish() {
	rep := b.rep
	rep.Processes = b.roots
	byDir := map[string][]FileChange{}
	for _, f := range b.files {
		d := path.Dir(f.Path)
		byDir[d] = append(byDir[d], f)
	}
	for d, fs := range byDir {
		rep.Files = append(rep.Files, Directory{Dir: d, Files: fs})
	}
	sort.Slice(rep.Files, func(i, j int) bool { return rep.Files[i].Dir < rep.Files[j].Dir })
	for _, h := range b.hosts {
		rep.Network = append(rep.Network, *h)
	}
	sort.Slice(rep.Network, func(i, j int) bool { return rep.Network[i].Host < rep.Network[j].Host })
	sort.SliceStable(rep.Timeline, func(i, j int) bool { return rep.Timeline[i].Seq < rep.Timeline[j].Seq })
}

func pidOf(r *audit.Record) int32 {
	if r.Process == nil {
		return 0
	}
	return r.Process.PID
}

func mustAddr(s string) netip.Addr {
	a, _ := netip.ParseAddr(s)
	return a
}

func appendUnique(l []string, s string) []string {
	for _, x := range l {
		if x == s {
			return l
		}
	}
	return append(l, s)
}

var errnoNames = map[int64]string{1: "EPERM (not permitted)", 2: "ENOENT", 13: "EACCES (permission denied)", 30: "EROFS (read-only file system)",
	39: "ENOTEMPTY", 17: "EEXIST", 111: "ECONNREFUSED", 101: "ENETUNREACH"}

func errnoText(n int64) string {
	if s, ok := errnoNames[n]; ok {
		return s
	}
	return "errno " + strconv.FormatInt(n, 10)
}
