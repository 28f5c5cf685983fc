package policy

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const ceilingRoles = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: base}
spec: {}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: narrow}
spec:
  process:
    runAsUser: 2000
    allowUsers: ["1000-1099"]
    allowGroups: ["3000"]
    capabilities: [NET_BIND_SERVICE, NET_ADMIN]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: rootok}
spec:
  filesystem: {rootfs: overlay}
  process:
    allowUsers: ["0-65535"]
    allowGroups: ["0-65535"]
    allowPrivilegeEscalation: true
    capabilities: [CHOWN, KILL]
`

// request is what a container asks for, in OCI terms.
type request struct {
	uid, gid   uint32
	groups     []uint32
	caps       []string
	nnp        bool
	readonly   bool
	nofileHard uint64
}

func (r request) process() *specs.Process {
	caps := append([]string(nil), r.caps...)
	proc := &specs.Process{
		User:            specs.User{UID: r.uid, GID: r.gid, AdditionalGids: r.groups},
		Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
		NoNewPrivileges: r.nnp,
	}
	if r.nofileHard > 0 {
		proc.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: r.nofileHard, Soft: r.nofileHard}}
	}
	return proc
}

func rlimit(rl []specs.POSIXRlimit, typ string) (specs.POSIXRlimit, bool) {
	for _, r := range rl {
		if r.Type == typ {
			return r, true
		}
	}
	return specs.POSIXRlimit{}, false
}

// TestCeiling is the merge as a table: request x role -> process, or a
// refusal naming the field.
func TestCeiling(t *testing.T) {
	set := mustParse(t, ceilingRoles)
	defaults := RuntimeDefaultCapabilities
	type want struct {
		uid, gid uint32
		groups   []uint32
		caps     []string
		nnp      bool
		nofile   uint64
		readonly bool
		refused  string // the field the refusal names
	}
	for _, c := range []struct {
		name, role string
		req        request
		want       want
	}{
		{"nothing asked: the role's defaults", "base", request{caps: defaults, groups: []uint32{0, 1, 10}},
			want{uid: DefaultUID, gid: DefaultUID, caps: []string{}, nnp: true, nofile: 1024, readonly: true}},
		{"uid 1000, its own group", "base", request{uid: 1000, gid: 1000, groups: []uint32{1000}, caps: defaults},
			want{uid: 1000, gid: 1000, groups: []uint32{1000}, caps: []string{}, nnp: true, nofile: 1024, readonly: true}},
		{"uid 1000, group root: the role's group", "base", request{uid: 1000, gid: 0, groups: []uint32{0, 5678}},
			want{uid: 1000, gid: DefaultUID, groups: []uint32{5678}, caps: []string{}, nnp: true, nofile: 1024, readonly: true}},
		{"fewer open files kept", "base", request{uid: 1000, gid: 1000, nofileHard: 64},
			want{uid: 1000, gid: 1000, caps: []string{}, nnp: true, nofile: 64, readonly: true}},
		{"more open files lowered", "base", request{uid: 1000, gid: 1000, nofileHard: 1 << 20},
			want{uid: 1000, gid: 1000, caps: []string{}, nnp: true, nofile: 1024, readonly: true}},
		{"privilege escalation asked, not allowed", "base", request{uid: 1000, gid: 1000, nnp: false},
			want{uid: 1000, gid: 1000, caps: []string{}, nnp: true, nofile: 1024, readonly: true}},
		{"a capability outside the runtime's defaults", "base", request{uid: 1000, gid: 1000, caps: append(slices.Clone(defaults), "CAP_NET_ADMIN")},
			want{refused: "process.capabilities: CAP_NET_ADMIN not granted"}},
		{"ALL capabilities", "base", request{caps: allCapabilities()}, want{refused: "process.capabilities: "}},
		{"narrow: uid in range", "narrow", request{uid: 1050, gid: 3000, caps: []string{"CAP_NET_BIND_SERVICE", "CAP_CHOWN"}},
			want{uid: 1050, gid: 3000, caps: []string{"CAP_NET_BIND_SERVICE"}, nnp: true, nofile: 1024, readonly: true}},
		{"narrow: the role's own uid", "narrow", request{uid: 2000, gid: 2000},
			want{uid: 2000, gid: 2000, caps: []string{}, nnp: true, nofile: 1024, readonly: true}},
		{"narrow: added NET_ADMIN granted", "narrow", request{uid: 1000, gid: 3000, caps: append(slices.Clone(defaults), "CAP_NET_ADMIN")},
			want{uid: 1000, gid: 3000, caps: []string{"CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE"}, nnp: true, nofile: 1024, readonly: true}},
		{"narrow: uid out of range", "narrow", request{uid: 1100, gid: 3000}, want{refused: "process.user.uid: uid 1100"}},
		{"narrow: gid out of range", "narrow", request{uid: 1000, gid: 1000}, want{refused: "process.user.gid: gid 1000"}},
		{"narrow: supplemental group out of range", "narrow", request{uid: 1000, gid: 3000, groups: []uint32{3000, 1234}},
			want{refused: "process.user.additionalGids[1]: gid 1234"}},
		{"rootok: root kept", "rootok", request{uid: 0, gid: 0, groups: []uint32{0, 10}, caps: defaults},
			want{uid: 0, gid: 0, groups: []uint32{0, 10}, caps: []string{"CAP_CHOWN", "CAP_KILL"}, nnp: false, nofile: 1024}},
		{"rootok: no_new_privs asked is kept", "rootok", request{uid: 0, nnp: true},
			want{uid: 0, gid: 0, caps: []string{}, nnp: true, nofile: 1024}},
		{"rootok: read-only root asked under overlay", "rootok", request{uid: 5, gid: 5, readonly: true},
			want{uid: 5, gid: 5, caps: []string{}, nofile: 1024, readonly: true}},
		{"rootok: drop ALL", "rootok", request{uid: 5, gid: 5, caps: nil},
			want{uid: 5, gid: 5, caps: []string{}, nofile: 1024}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := set.Profile(c.role)
			if err != nil {
				t.Fatal(err)
			}
			proc := c.req.process()
			_, err = p.ApplyProcess(proc, nil)
			if c.want.refused != "" {
				if err == nil || !strings.Contains(err.Error(), c.want.refused) {
					t.Fatalf("want refusal %q, got %v (process %+v)", c.want.refused, err, proc)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			u := proc.User
			if u.UID != c.want.uid || u.GID != c.want.gid || !slices.Equal(u.AdditionalGids, c.want.groups) {
				t.Errorf("user %+v, want uid %d gid %d groups %v", u, c.want.uid, c.want.gid, c.want.groups)
			}
			caps := proc.Capabilities
			for _, set := range [][]string{caps.Bounding, caps.Effective, caps.Permitted, caps.Inheritable, caps.Ambient} {
				if !slices.Equal(set, c.want.caps) {
					t.Errorf("capabilities %+v, want %v in every set", caps, c.want.caps)
					break
				}
			}
			if proc.NoNewPrivileges != c.want.nnp {
				t.Errorf("no_new_privs %v, want %v", proc.NoNewPrivileges, c.want.nnp)
			}
			if r, _ := rlimit(proc.Rlimits, "RLIMIT_NOFILE"); r.Hard != c.want.nofile || r.Soft != c.want.nofile {
				t.Errorf("RLIMIT_NOFILE %+v, want %d", r, c.want.nofile)
			}
			if got := p.boundRootReadonly(c.req.readonly); got != c.want.readonly {
				t.Errorf("root read-only %v, want %v", got, c.want.readonly)
			}
		})
	}
}

func allCapabilities() []string { return AllCapabilities() }

// TestCeilingNeverExceedsRole: for random requests under random roles, the
// process the shim hands runsc is at or below the role, or the request is
// refused.
func TestCeilingNeverExceedsRole(t *testing.T) {
	rng := rand.New(rand.NewSource(13))
	caps := allCapabilities()
	ids := []uint32{0, 1, 10, 999, 1000, 1050, 1100, 2000, 3000, 65532, 65534, 70000, math.MaxUint32 - 1}
	pickIDs := func() []uint32 {
		var out []uint32
		for n := rng.Intn(4); n > 0; n-- {
			out = append(out, ids[rng.Intn(len(ids))])
		}
		return out
	}
	pickCaps := func(max int) []string {
		var out []string
		for n := rng.Intn(max + 1); n > 0; n-- {
			out = append(out, caps[rng.Intn(len(caps))])
		}
		return out
	}
	ranges := func(idl []uint32) string {
		var parts []string
		for _, id := range idl {
			hi := id + uint32(rng.Intn(100))
			if hi < id || hi == math.MaxUint32 {
				hi = id
			}
			parts = append(parts, fmt.Sprintf("%q", fmt.Sprintf("%d-%d", id, hi)))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	refused, kept := 0, 0
	for i := 0; i < 3000; i++ {
		var spec strings.Builder
		fmt.Fprintf(&spec, "spec:\n  filesystem: {rootfs: %s}\n  process:\n", []string{"read-only", "overlay"}[rng.Intn(2)])
		fmt.Fprintf(&spec, "    runAsUser: %d\n    runAsGroup: %d\n", ids[rng.Intn(len(ids))], ids[rng.Intn(len(ids))])
		if rng.Intn(3) > 0 {
			fmt.Fprintf(&spec, "    allowUsers: %s\n    allowGroups: %s\n", ranges(pickIDs()), ranges(pickIDs()))
		}
		var roleCaps []string
		for _, c := range pickCaps(4) {
			if c != "CAP_SYS_ADMIN" && c != "CAP_SYS_RESOURCE" && !slices.Contains(roleCaps, c) {
				roleCaps = append(roleCaps, c)
			}
		}
		fmt.Fprintf(&spec, "    capabilities: [%s]\n    allowPrivilegeEscalation: %v\n", strings.Join(roleCaps, ", "), rng.Intn(2) == 0)
		fmt.Fprintf(&spec, "  limits: {openFiles: %d}\n", 16+rng.Intn(4096))
		set := mustParse(t, roleHead+spec.String())
		p, err := set.Profile("r")
		if err != nil {
			t.Fatalf("%v\n%s", err, spec.String())
		}
		req := request{uid: ids[rng.Intn(len(ids))], gid: ids[rng.Intn(len(ids))], groups: pickIDs(), nnp: rng.Intn(2) == 0, readonly: rng.Intn(2) == 0}
		if rng.Intn(2) == 0 {
			req.caps = pickCaps(3)
		} else {
			req.caps = append(slices.Clone(RuntimeDefaultCapabilities), pickCaps(1)...)
		}
		if rng.Intn(2) == 0 {
			req.nofileHard = uint64(rng.Intn(1 << 20))
		}
		proc := req.process()
		if _, err := p.ApplyProcess(proc, nil); err != nil {
			refused++
			continue
		}
		kept++
		fail := func(format string, args ...any) {
			t.Fatalf("request %+v under\n%s\n"+format, append([]any{req, spec.String()}, args...)...)
		}
		if !p.userAllowed(proc.User.UID) {
			fail("uid %d outside the role", proc.User.UID)
		}
		if !p.groupAllowed(proc.User.GID) {
			fail("gid %d outside the role", proc.User.GID)
		}
		for _, g := range proc.User.AdditionalGids {
			if !p.groupAllowed(g) {
				fail("supplemental gid %d outside the role", g)
			}
		}
		for _, set := range [][]string{proc.Capabilities.Bounding, proc.Capabilities.Effective, proc.Capabilities.Permitted, proc.Capabilities.Inheritable, proc.Capabilities.Ambient} {
			for _, c := range set {
				if !slices.Contains(p.Process.Capabilities, c) {
					fail("capability %s outside the role", c)
				}
				if !slices.Contains(req.caps, c) {
					fail("capability %s was not asked for", c)
				}
			}
		}
		if !proc.NoNewPrivileges && !p.Process.AllowPrivilegeEscalation {
			fail("no_new_privs off under a role that does not allow escalation")
		}
		if r, ok := rlimit(proc.Rlimits, "RLIMIT_NOFILE"); !ok || r.Hard > uint64(p.Limits.OpenFiles) || r.Soft > r.Hard {
			fail("RLIMIT_NOFILE %+v above the role's %d", r, p.Limits.OpenFiles)
		}
		if r, ok := rlimit(proc.Rlimits, "RLIMIT_NPROC"); !ok || r.Hard > uint64(p.Process.MaxProcesses) {
			fail("RLIMIT_NPROC %+v above the role's %d", r, p.Process.MaxProcesses)
		}
		if p.Filesystem.Rootfs == RootfsReadOnly && !p.boundRootReadonly(req.readonly) {
			fail("writable root under a read-only role")
		}
		if req.readonly && !p.boundRootReadonly(req.readonly) {
			fail("a read-only root asked for became writable")
		}
	}
	if refused == 0 || kept == 0 {
		t.Fatalf("the generator never exercised both outcomes: %d kept, %d refused", kept, refused)
	}
	t.Logf("%d kept, %d refused", kept, refused)
}

func TestIDRangesParse(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
		err  string
	}{
		{nil, "1-4294967294", ""},
		{[]string{}, "none", ""},
		{[]string{"2000", "1000-1999"}, "1000-1999, 2000", ""},
		{[]string{"0"}, "0", ""},
		{[]string{"1-"}, "", `process.allowUsers[0]: "1-" is not an id`},
		{[]string{"x"}, "", `process.allowUsers[0]: "x" is not an id`},
		{[]string{"5", "-3"}, "", `process.allowUsers[1]`},
		{[]string{"+3"}, "", `process.allowUsers[0]`},
		{[]string{"4294967295"}, "", `process.allowUsers[0]`},
		{[]string{"9-3"}, "", `the range is empty`},
	} {
		got, err := parseIDRanges("process.allowUsers", c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: want error %q, got %v", c.in, c.err, err)
			}
			continue
		}
		if err != nil || got.String() != c.want {
			t.Errorf("%q: got %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

// A running container's update stays under its role: lower or equal limits
// pass; higher ones, none, or limits through the cgroup's files are
// refused with the field named.
func TestBoundUpdate(t *testing.T) {
	p := &Profile{Role: "coder", Limits: LimitsProfile{MemoryBytes: 512 << 20, CPUMillis: 1000}}
	i64 := func(v int64) *int64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	for _, tc := range []struct {
		name string
		r    *specs.LinuxResources
		want string // "" accepted
	}{
		{"nothing", nil, ""},
		{"lower memory", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(256 << 20)}}, ""},
		{"the role's memory", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(512 << 20)}}, ""},
		{"more memory", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(1 << 30)}}, "linux.resources.memory.limit 1073741824"},
		{"unlimited memory", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(-1)}}, "linux.resources.memory.limit -1"},
		{"half a CPU", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(50000), Period: u64(100000)}}, ""},
		{"shares only", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(1024)}}, ""},
		{"two CPUs", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(200000), Period: u64(100000)}}, "is 2000m"},
		{"two CPUs by a short period", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(20000), Period: u64(10000)}}, "is 2000m"},
		{"no CPU limit", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000)}}, "linux.resources.cpu.quota"},
		{"memory.max through unified", &specs.LinuxResources{Unified: map[string]string{"memory.max": "max"}}, "unified[memory.max]"},
		{"io through unified", &specs.LinuxResources{Unified: map[string]string{"io.weight": "100"}}, ""},
	} {
		err := p.BoundUpdate(tc.r)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.IsPermissionDenied(err)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A role without limits bounds nothing.
	if err := (&Profile{}).BoundUpdate(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(-1)}}); err != nil {
		t.Error(err)
	}
}
