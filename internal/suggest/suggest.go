// Package suggest reads what an agent really did from its trail, and
// writes the tightest role that would have let it do the same (Suggest),
// or says what a given role would have refused of it (Diff). Pure: the
// records come in, text and findings go out.
package suggest

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/report"
)

// Use is what the trail shows the agent used.
type Use struct {
	Sandboxes []string
	Roles     []string
	// Wall is the longest sandbox's time, first record to last.
	Wall time.Duration
	// Hosts are the names it reached through the gateway, by name and
	// port.
	Hosts []Host
	// Refused are the names and hosts refused to it, with how often.
	Refused map[string]int
	// Direct are the addresses it connected to without a name (a CIDR
	// rule's), allowed.
	Direct []string
	// Written are the files it created, changed or deleted; Executed,
	// those of them it then ran.
	Written  []string
	Executed []string
	// PeakProcesses is the most processes alive at once (threads not
	// counted).
	PeakProcesses int
	// MemoryPeak (bytes) and CPU are the most a sandbox's cgroup used,
	// from its trail's end record (0: not recorded).
	MemoryPeak int64
	CPU        time.Duration
}

// Host is a name and port the agent reached.
type Host struct {
	Name     string
	Port     int
	API      string // the model API its calls were read as ("" none)
	Requests int    // requests (or connections, for TLS passed through)
	// Tools are the MCP tools called on it (api: mcp).
	Tools []string
}

// Observe reads the records of one or more sandboxes' trails.
func Observe(recs []*audit.Record) Use {
	u := Use{Refused: map[string]int{}}
	bySandbox := map[string][]*audit.Record{}
	hosts := map[string]*Host{}
	direct := map[string]bool{}
	for _, r := range recs {
		if _, ok := bySandbox[r.Sandbox]; !ok {
			u.Sandboxes = append(u.Sandboxes, r.Sandbox)
		}
		bySandbox[r.Sandbox] = append(bySandbox[r.Sandbox], r)
		if r.Role != "" && !slices.Contains(u.Roles, r.Role) {
			u.Roles = append(u.Roles, r.Role)
		}
		host := func(name string) {
			port := 0
			if r.Dst != nil {
				port = r.Dst.Port
			}
			k := fmt.Sprintf("%s:%d", name, port)
			h := hosts[k]
			if h == nil {
				h = &Host{Name: name, Port: port}
				hosts[k] = h
			}
			h.Requests++
			if r.Model != nil && r.Model.API != "" {
				h.API = r.Model.API
			}
		}
		switch r.Event {
		case "agentbox/egress_request", "agentbox/model_call":
			if r.Detail["host"] != "" {
				host(r.Detail["host"])
			}
		case "agentbox/mcp_call":
			// Its request's record counted the request: the tool is kept.
			if m := r.MCP; m != nil && m.Server != "" {
				port := 0
				if r.Dst != nil {
					port = r.Dst.Port
				}
				k := fmt.Sprintf("%s:%d", m.Server, port)
				if hosts[k] == nil {
					hosts[k] = &Host{Name: m.Server, Port: port}
				}
				hosts[k].API = policy.APIMCP
				if !slices.Contains(hosts[k].Tools, m.Tool) {
					hosts[k].Tools = append(hosts[k].Tools, m.Tool)
				}
			}
		case "agentbox/egress_connection":
			if r.Detail["sni"] != "" {
				host(r.Detail["sni"])
			}
		case "agentbox/dns_refused":
			if n := r.Detail["name"]; n != "" {
				u.Refused[n]++
			}
		case "agentbox/egress_refused", "agentbox/model_limit":
			if n := r.Detail["host"]; n != "" {
				u.Refused[n]++
			} else if n := r.Detail["sni"]; n != "" {
				u.Refused[n]++
			}
		case "agentbox/sandbox_end":
			if n, err := strconv.ParseInt(r.Detail["memory_peak_bytes"], 10, 64); err == nil && n > u.MemoryPeak {
				u.MemoryPeak = n
			}
			if f, err := strconv.ParseFloat(r.Detail["cpu_seconds"], 64); err == nil {
				u.CPU = max(u.CPU, time.Duration(f*float64(time.Second)))
			}
		case "syscall/connect":
			// A connect the rules allowed by address: a CIDR rule's (the
			// resolver and gateway are reached by every pod).
			if r.Dst != nil && r.Dst.IP != "" && r.Detail["egress"] == "allow" && strings.HasPrefix(r.Detail["egress_rule"], "allow[") {
				direct[fmt.Sprintf("%s:%d", r.Dst.IP, r.Dst.Port)] = true
			}
		}
	}
	for _, h := range hosts {
		u.Hosts = append(u.Hosts, *h)
	}
	sort.Slice(u.Hosts, func(i, j int) bool {
		if u.Hosts[i].Name != u.Hosts[j].Name {
			return u.Hosts[i].Name < u.Hosts[j].Name
		}
		return u.Hosts[i].Port < u.Hosts[j].Port
	})
	u.Direct = slices.Sorted(maps.Keys(direct))
	written, executed := map[string]bool{}, map[string]bool{}
	for _, sb := range u.Sandboxes {
		rep := report.Build(bySandbox[sb], audit.VerifyResult{})
		if !rep.Start.IsZero() && rep.End.Sub(rep.Start) > u.Wall {
			u.Wall = rep.End.Sub(rep.Start)
		}
		for _, d := range rep.Files {
			for _, f := range d.Files {
				written[f.Path] = true
				if f.Target != "" && (f.Op == "renamed" || f.Op == "linked") {
					written[f.Target] = true
				}
			}
		}
		var walk func([]*report.Process)
		walk = func(ps []*report.Process) {
			for _, p := range ps {
				for _, exe := range append([]string{p.Exe}, p.Execs...) {
					if written[exe] {
						executed[exe] = true
					}
				}
				walk(p.Children)
			}
		}
		walk(rep.Processes)
		if n := peak(bySandbox[sb]); n > u.PeakProcesses {
			u.PeakProcesses = n
		}
	}
	u.Written, u.Executed = slices.Sorted(maps.Keys(written)), slices.Sorted(maps.Keys(executed))
	return u
}

// peak is the most processes alive at once in one sandbox's records: a
// process is alive from its first record (or its parent's clone) to its
// exit.
func peak(recs []*audit.Record) int {
	alive, exited := map[int32]bool{}, map[int32]bool{}
	most := 0
	for _, r := range recs {
		if r.Process == nil || !strings.HasPrefix(r.Event, "sentry/") && !strings.HasPrefix(r.Event, "syscall/") {
			continue
		}
		switch {
		case r.Event == "sentry/task_exit":
			delete(alive, r.Process.PID)
			exited[r.Process.PID] = true
			continue
		case r.Event == "sentry/clone" && r.Process.ChildPID != 0:
			alive[r.Process.ChildPID] = true
		}
		if r.Process.PID != 0 && !exited[r.Process.PID] {
			alive[r.Process.PID] = true
		}
		most = max(most, len(alive))
	}
	return most
}

// root is the first component of an absolute path ("/workspace").
func root(p string) string {
	p = path.Clean(p)
	if i := strings.IndexByte(p[1:], '/'); i >= 0 {
		return p[:i+1]
	}
	return p
}

// Options shape a suggestion.
type Options struct {
	Name     string // the role's name
	Inherits string // its parent (default baseline)
}

// Suggest writes the tightest role that lets the agent do what u shows,
// as YAML, each line with a comment saying where it came from.
func Suggest(u Use, o Options) string {
	if o.Name == "" {
		o.Name = "suggested"
	}
	if o.Inherits == "" {
		o.Inherits = "baseline"
	}
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Suggested by agentbox policy suggest from %d sandbox(es) (%s), run under role %s.\n",
		len(u.Sandboxes), strings.Join(u.Sandboxes, ", "), orNone(strings.Join(u.Roles, ", ")))
	p("# The tightest role that lets the agent do what its trail shows, each line saying where it\n")
	p("# came from. Lists replace the parent's. Review it before you bind it.\n")
	p("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: %s}\nspec:\n  inherits: %s\n", o.Name, o.Inherits)

	// Files: each top directory it wrote in is writable; those it ran
	// what it wrote from may execute.
	dirs := map[string][]string{}
	for _, f := range u.Written {
		dirs[root(f)] = append(dirs[root(f)], f)
	}
	execDirs := map[string][]string{}
	for _, f := range u.Executed {
		execDirs[root(f)] = append(execDirs[root(f)], f)
	}
	p("  filesystem:\n")
	p("    writable: [%s]\n", strings.Join(slices.Sorted(maps.Keys(dirs)), ", "))
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		p("      # %s: %d file(s) written, e.g. %s\n", d, len(dirs[d]), examples(dirs[d]))
	}
	if len(dirs) == 0 {
		p("      # it wrote no file\n")
	}
	p("    allowExec: [%s]\n", strings.Join(slices.Sorted(maps.Keys(execDirs)), ", "))
	for _, d := range slices.Sorted(maps.Keys(execDirs)) {
		p("      # %s: it ran what it wrote there: %s\n", d, examples(execDirs[d]))
	}
	if len(execDirs) == 0 {
		p("      # it ran nothing it wrote\n")
	}

	// Network: each name and port it reached, a model host with its API.
	p("  network:\n")
	if len(u.Hosts) == 0 && len(u.Direct) == 0 {
		// An empty list, not none: lists replace the parent's, and a
		// parent's allow list under egress none does not load.
		p("    egress: none   # it reached no host\n    allow: []   # none of the parent's hosts\n")
	} else {
		p("    egress: allowlist\n    allow:\n")
		byName := map[string][]Host{}
		for _, h := range u.Hosts {
			byName[h.Name] = append(byName[h.Name], h)
		}
		for _, name := range slices.Sorted(maps.Keys(byName)) {
			hs := byName[name]
			var ports []string
			n, api := 0, ""
			var tools []string
			for _, h := range hs {
				ports = append(ports, fmt.Sprint(h.Port))
				n += h.Requests
				if h.API != "" {
					api = h.API
				}
				for _, t := range h.Tools {
					if !slices.Contains(tools, t) {
						tools = append(tools, t)
					}
				}
			}
			rule := fmt.Sprintf("{host: %s, ports: [%s]", name, strings.Join(ports, ", "))
			if api != "" {
				rule += ", api: " + api
			}
			if api == policy.APIMCP {
				// The tools it called, and none other.
				slices.Sort(tools)
				quoted := make([]string, len(tools))
				for i, t := range tools {
					quoted[i] = strconv.Quote(t)
				}
				rule += ", tools: {allow: [" + strings.Join(quoted, ", ") + "]}"
			}
			p("      - %s}   # %d request(s)\n", rule, n)
		}
		for _, a := range u.Direct {
			p("      # by address, not added (give it a name, or a cidr rule): %s\n", a)
		}
	}
	if len(u.Refused) > 0 {
		p("    # refused under the role it ran under, and not added: %s\n", refusedList(u.Refused))
	}

	// Processes and time, with headroom.
	procs := max(32, 2*u.PeakProcesses)
	p("  process:\n    maxProcesses: %d   # at most %d processes at once (threads not counted), x2, at least 32\n", procs, u.PeakProcesses)
	wall := (2 * u.Wall).Round(time.Minute)
	if wall < 5*time.Minute {
		wall = 5 * time.Minute
	}
	p("  limits:\n    wallClock: %s   # its longest run took %s, x2, at least 5m\n", durationText(wall), u.Wall.Round(time.Second))
	if u.MemoryPeak > 0 {
		mib := max(128, (u.MemoryPeak*3/2+(1<<20)-1)>>20)
		p("    memory: %dMi   # its sandbox's peak was %d MiB (gVisor included), x1.5, at least 128Mi\n", mib, u.MemoryPeak>>20)
	} else {
		p("    # memory: the trail records no peak, so it stays the parent's\n")
	}
	if u.CPU > 0 {
		p("    cpuTime: %s   # its sandbox used %s of CPU, x2, at least 1m\n", durationText(max(time.Minute, (2*u.CPU+time.Minute-1).Truncate(time.Minute))), u.CPU.Round(time.Millisecond))
	} else {
		p("    # cpuTime: the trail records no CPU time, so it stays the parent's\n")
	}
	p("    # syscall classes: gVisor reports no event for the calls the baseline classes cover, so allowSyscalls stays the parent's\n")
	return b.String()
}

// Finding is something a role would have refused of what u shows.
type Finding struct {
	What, Why string
}

// Diff says what role p would have refused of what u shows.
func Diff(u Use, p *policy.Profile) ([]Finding, error) {
	var out []Finding
	plan, err := netpolicy.Compile(p)
	if err != nil {
		return nil, err
	}
	for _, h := range u.Hosts {
		what := fmt.Sprintf("%s:%d (%d request(s))", h.Name, h.Port, h.Requests)
		switch {
		case p.Network.Egress == policy.EgressNone:
			out = append(out, Finding{what, "egress none"})
		case p.Network.Egress == policy.EgressOpen:
		default:
			if _, why := egressgw.Decide(plan, h.Name, h.Port); why != "" {
				out = append(out, Finding{what, why})
			}
		}
	}
	for _, a := range u.Direct {
		if p.Network.Egress == policy.EgressNone {
			out = append(out, Finding{a, "egress none"})
		}
	}
	for _, f := range u.Written {
		if p.Filesystem.Rootfs != policy.RootfsReadOnly {
			break
		}
		if !under(f, p.Filesystem.Writable) {
			out = append(out, Finding{"write " + f, fmt.Sprintf("not under filesystem.writable %v", p.Filesystem.Writable)})
		}
	}
	for _, f := range u.Executed {
		if p.Filesystem.NoExecWritable && under(f, p.Filesystem.Writable) && !under(f, p.Filesystem.AllowExec) {
			out = append(out, Finding{"run " + f + ", which it wrote", fmt.Sprintf("not under filesystem.allowExec %v", p.Filesystem.AllowExec)})
		}
	}
	if p.Process.MaxProcesses > 0 && u.PeakProcesses > p.Process.MaxProcesses {
		out = append(out, Finding{fmt.Sprintf("%d processes at once", u.PeakProcesses), fmt.Sprintf("process.maxProcesses %d", p.Process.MaxProcesses)})
	}
	if p.Limits.MemoryBytes > 0 && u.MemoryPeak > p.Limits.MemoryBytes {
		out = append(out, Finding{fmt.Sprintf("a peak of %d MiB", u.MemoryPeak>>20), fmt.Sprintf("limits.memory %d MiB", p.Limits.MemoryBytes>>20)})
	}
	if p.Limits.CPUTimeSeconds > 0 && u.CPU > time.Duration(p.Limits.CPUTimeSeconds)*time.Second {
		out = append(out, Finding{fmt.Sprintf("%s of CPU", u.CPU.Round(time.Millisecond)), fmt.Sprintf("limits.cpuTime %ds", p.Limits.CPUTimeSeconds)})
	}
	if p.Limits.WallClock > 0 && u.Wall > p.Limits.WallClock {
		out = append(out, Finding{fmt.Sprintf("a run of %s", u.Wall.Round(time.Second)), fmt.Sprintf("limits.wallClock %s", p.Limits.WallClock)})
	}
	return out, nil
}

func under(f string, dirs []string) bool {
	for _, d := range dirs {
		d = path.Clean(d)
		if f == d || strings.HasPrefix(f, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

func examples(files []string) string {
	const n = 3
	if len(files) <= n {
		return strings.Join(files, ", ")
	}
	return strings.Join(files[:n], ", ") + fmt.Sprintf(" and %d more", len(files)-n)
}

func refusedList(m map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s (%d)", k, m[k]))
	}
	return strings.Join(out, ", ")
}

func durationText(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%dm", d/time.Minute)
}

func orNone(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
