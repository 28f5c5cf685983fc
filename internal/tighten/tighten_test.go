package tighten

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

func profile(egress string, mem int64, rules ...policy.EgressRule) *policy.Profile {
	return &policy.Profile{Role: "coder", Network: policy.NetworkProfile{Egress: egress, Allow: rules},
		Limits: policy.LimitsProfile{MemoryBytes: mem, WallClock: time.Hour}, Filesystem: policy.FilesystemProfile{Rootfs: "read-only"}}
}

// A restore takes a role only where it is as tight as, or tighter than,
// the one the checkpoint was taken under.
func TestLooserThan(t *testing.T) {
	a := policy.EgressRule{Host: "a.test", Ports: []int{443}}
	b := policy.EgressRule{Host: "b.test", Ports: []int{443}}
	net := policy.EgressRule{CIDR: "10.0.0.0/8", Ports: []int{443}}
	allow := policy.EgressAllowlist
	for _, tc := range []struct {
		name     string
		was, now *policy.Profile
		// narrowed: the sandbox ran under this egress (narrowed live).
		narrowed *policy.Profile
		looser   []string // substrings; none: accepted
	}{
		{name: "same", was: profile(allow, 1<<30, a, net), now: profile(allow, 1<<30, a, net)},
		{name: "a rule removed", was: profile(allow, 1<<30, a, b), now: profile(allow, 1<<30, a)},
		{name: "less memory", was: profile(allow, 1<<30, a), now: profile(allow, 1<<29, a)},
		{name: "a rule added", was: profile(allow, 1<<30, a), now: profile(allow, 1<<30, a, b), looser: []string{"egress: ", "b.test", "(loosens)"}},
		{name: "egress open", was: profile(allow, 1<<30, a), now: profile(policy.EgressOpen, 1<<30), looser: []string{"egress: "}},
		{name: "more memory", was: profile(allow, 1<<29, a), now: profile(allow, 1<<30, a), looser: []string{"memory limit", "(loosens)"}},
		{name: "no memory limit", was: profile(allow, 1<<29, a), now: profile(allow, 0, a), looser: []string{"memory limit"}},
		{name: "filesystem differs", was: profile(allow, 1<<30, a), now: func() *policy.Profile {
			p := profile(allow, 1<<30, a)
			p.Filesystem.Rootfs = "writable"
			return p
		}(), looser: []string{"filesystem differs"}},
		{name: "paths narrowed", was: profile(allow, 1<<30, a), now: profile(allow, 1<<30, paths(a, "/v1/*"))},
		{name: "paths taken away", was: profile(allow, 1<<30, paths(a, "/v1/*")), now: profile(allow, 1<<30, a), looser: []string{"egress: ", "a.test", "(loosens)"}},
		{name: "the role as it was, but the sandbox ran narrowed", was: profile(allow, 1<<30, a, b), narrowed: profile(allow, 1<<30, a),
			now: profile(allow, 1<<30, a, b), looser: []string{"b.test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := tc.was
			if tc.narrowed != nil {
				ran = tc.narrowed
			}
			wasEgress, err := netpolicy.Compile(ran)
			if err != nil {
				t.Fatal(err)
			}
			// What the manifest keeps, as the restore reads it back.
			b, _ := json.Marshal(wasEgress)
			var back netpolicy.Plan
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			got := strings.Join(LooserThan(tc.was, &back, tc.now), "; ")
			if len(tc.looser) == 0 && got != "" {
				t.Fatalf("refused as looser: %s", got)
			}
			for _, want := range tc.looser {
				if !strings.Contains(got, want) {
					t.Fatalf("looser: %q, want %q in it", got, want)
				}
			}
		})
	}
}

// A role's lower memory or CPU limit is applied to a running sandbox; a
// higher one is pending; an unchanged one changes nothing, even where the
// pod asked for less than its role.
func TestLowerLimits(t *testing.T) {
	role := policy.LimitsProfile{MemoryBytes: 512 << 20, CPUMillis: 1000}
	for _, tc := range []struct {
		name             string
		memory, cpu      int64
		next             policy.LimitsProfile
		memSet, cpuSet   int64
		applied, pending int
	}{
		{name: "lower both", memory: 512 << 20, cpu: 1000, next: policy.LimitsProfile{MemoryBytes: 256 << 20, CPUMillis: 500}, memSet: 256 << 20, cpuSet: 50000, applied: 2},
		{name: "higher both", memory: 512 << 20, cpu: 1000, next: policy.LimitsProfile{MemoryBytes: 1 << 30, CPUMillis: 2000}, pending: 2},
		{name: "unchanged, the pod asked for less", memory: 128 << 20, cpu: 250, next: role},
		{name: "lower than the role, above the pod's own", memory: 128 << 20, cpu: 1000, next: policy.LimitsProfile{MemoryBytes: 256 << 20, CPUMillis: 1000}},
		{name: "no limit any more", memory: 512 << 20, cpu: 1000, next: policy.LimitsProfile{CPUMillis: 1000}, pending: 1},
	} {
		res, applied, pending := LowerLimits(tc.memory, tc.cpu, role, tc.next)
		var mem, quota int64
		if res != nil && res.Memory != nil {
			mem = *res.Memory.Limit
		}
		if res != nil && res.CPU != nil {
			quota = *res.CPU.Quota
		}
		if mem != tc.memSet || quota != tc.cpuSet || len(applied) != tc.applied || len(pending) != tc.pending {
			t.Errorf("%s: memory %d quota %d applied %q pending %q", tc.name, mem, quota, applied, pending)
		}
	}
}

// Each part a running sandbox cannot take is named when it differs, and
// only then.
func TestUnchangeable(t *testing.T) {
	base := func() *policy.Profile { return profile(policy.EgressAllowlist, 1<<30) }
	for _, tc := range []struct {
		name   string
		change func(*policy.Profile)
		want   string
	}{
		{"nothing", func(*policy.Profile) {}, ""},
		{"egress and memory are not among them", func(p *policy.Profile) { p.Network.Egress = policy.EgressNone; p.Limits.MemoryBytes = 1 }, ""},
		{"filesystem", func(p *policy.Profile) { p.Filesystem.Writable = []string{"/work"} }, "filesystem"},
		{"process", func(p *policy.Profile) { p.Process.MaxProcesses = 7 }, "process (user, capabilities, syscalls, maxProcesses)"},
		{"credentials", func(p *policy.Profile) { p.Credentials.EnvAllow = []string{"X"} }, "credentials"},
		{"wall clock", func(p *policy.Profile) { p.Limits.WallClock = time.Minute }, "limits (wall clock, CPU time, open files)"},
		{"open files", func(p *policy.Profile) { p.Limits.OpenFiles = 10 }, "limits (wall clock, CPU time, open files)"},
		{"port-forward", func(p *policy.Profile) { p.Network.PortForward = []int{8080} }, "network.portForward"},
	} {
		next := base()
		tc.change(next)
		if got := strings.Join(Unchangeable(base(), next), "; "); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A role's new version narrows a running sandbox's egress and lowers its
// limits at once; what loosens, or cannot change under it, is pending.
func TestDiff(t *testing.T) {
	a := policy.EgressRule{Host: "a.test", Ports: []int{443}}
	b := policy.EgressRule{Host: "b.test", Ports: []int{443}}
	cur := profile(policy.EgressAllowlist, 1<<30, a, b)
	plan, err := netpolicy.Compile(cur)
	if err != nil {
		t.Fatal(err)
	}
	running := Running{Profile: cur, Plan: plan, MemoryBytes: 1 << 30}

	next := profile(policy.EgressAllowlist, 1<<29, a)
	next.Filesystem.Rootfs = "writable"
	c, err := Diff(running, next)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Tightens() || c.Resources == nil || *c.Resources.Memory.Limit != 1<<29 {
		t.Fatalf("tightening: %+v", c)
	}
	if len(c.Plan.Allow) != 1 || c.Plan.Allow[0].Host != "a.test" {
		t.Fatalf("egress after: %+v", c.Plan.Allow)
	}
	if got := strings.Join(c.Pending, "; "); !strings.Contains(got, "filesystem: applies to new sandboxes") {
		t.Fatalf("pending: %q", got)
	}

	// Loosening only: nothing applies, and the egress stays as it is.
	c, err = Diff(running, profile(policy.EgressOpen, 2<<30))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tightens() || c.Resources != nil || len(c.Pending) < 2 {
		t.Fatalf("loosening: %+v", c)
	}
	if len(c.Plan.Allow) != 2 || c.Plan.DefaultAccept {
		t.Fatalf("loosening changed the egress: %+v", c.Plan)
	}

	// A sandbox without a plan yet (no egress) takes none.
	if _, err := Diff(Running{Profile: cur}, next); err != nil {
		t.Fatal(err)
	}
}

// paths is r restricted to paths.
func paths(r policy.EgressRule, p ...string) policy.EgressRule {
	r.HTTP = &policy.HTTPRule{Paths: p}
	return r
}
