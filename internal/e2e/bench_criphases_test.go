//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/shim"
)

// runscFloor names runsc alone (runscAlone) among the CRI variants: gVisor's
// stock shim cannot run a CRI pod on these hosts (it asks for an
// oom_score_adj they refuse), so runsc's floor is runsc itself.
var runscFloor = criVariant{name: "runsc alone"}

// machineCPU is the CPU time every core has spent busy since boot
// (/proc/stat: all but idle and iowait), in USER_HZ ticks of 10 ms.
func machineCPU(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) // cpu user nice system idle iowait irq softirq steal
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// criSample is one pod's start: its three CRI calls and the machine's CPU
// spent on its batch, per pod.
type criSample struct {
	p   *pod
	cpu time.Duration
	// timers is what containerd's CRI timers grew by for this pod (for 4
	// at a time, its batch's growth over 4); nil when not read.
	timers criTimers
}

// runtimeTypes are the CRI runtime types of the handlers the benchmarks
// use, as containerd's timers label them.
var runtimeTypes = map[string]string{"agentbox": runtimeType, "runc": "io.containerd.runc.v2"}

// TestBenchmarkCRIPhases attributes a CRI pod's start, one pod at a time
// and four at a time: each CRI call's wall time, split into the shim's
// traced phases (runsc_* gVisor's own, the rest agentbox's) and what is
// outside them (containerd's CRI, the CNI plugins, the shim's own process
// start, crictl), beside gVisor's own shim and runc doing the same, with
// the machine's CPU per pod. AGENTBOX_BENCH=1 only (hack/bench.sh); it
// asserts no timing.
func TestBenchmarkCRIPhases(t *testing.T) {
	requireBench(t)
	rounds := benchRounds("AGENTBOX_BENCH_CRI_ROUNDS", 15)
	variants := []criVariant{criVariants[0], runscAsAgentbox, runscFloor, criVariants[2]}
	one, four := map[string][]criSample{}, map[string][]criSample{}
	rate := map[string]float64{}
	alone := map[string]*runscAlone{runscFloor.name: newRunscAlone(t), runscAsAgentbox.name: newRunscAsAgentbox(t)}
	startPod := func(v criVariant, name string) (*pod, error) {
		r := alone[v.name]
		if r == nil {
			p, _, err := criPod(v, name, sleeper)
			return p, err
		}
		calls, err := r.pod(name)
		return &pod{calls: calls}, err
	}
	remove := func(v criVariant, p *pod) error {
		if r := alone[v.name]; r != nil {
			r.remove()
			return nil
		}
		_, err := removePod(p)
		return err
	}
	for i := -1; i < rounds; i++ { // round -1 warms up
		for j := range variants {
			// Rotated each round, and reversed every other one: no variant
			// always starts right after the same other.
			k := (i + 1 + j) % len(variants)
			if i%2 != 0 {
				k = len(variants) - 1 - k
			}
			v := variants[k]
			m0 := readCRITimers(t)
			cpu0 := machineCPU(t)
			p, err := startPod(v, fmt.Sprintf("phase-%d", i))
			cpu := machineCPU(t) - cpu0
			timers := readCRITimers(t).since(m0)
			if rerr := remove(v, p); err != nil || rerr != nil {
				t.Fatalf("%s: %v %v", v.name, err, rerr)
			}
			if i >= 0 {
				one[v.name] = append(one[v.name], criSample{p, cpu, timers})
			}
		}
	}
	const batches, workers = 3, 4
	for _, v := range variants {
		var elapsed time.Duration
		for b := 0; b < batches; b++ {
			pods := make([]*pod, workers)
			errs := make([]error, workers)
			var wg sync.WaitGroup
			m0 := readCRITimers(t)
			cpu0, start := machineCPU(t), time.Now()
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pods[w], errs[w] = startPod(v, fmt.Sprintf("phase4-%d-%d", b, w))
				}()
			}
			wg.Wait()
			elapsed += time.Since(start)
			cpu := (machineCPU(t) - cpu0) / workers
			timers := readCRITimers(t).since(m0)
			for k := range timers {
				timers[k] /= workers
			}
			for w, p := range pods {
				if rerr := remove(v, p); errs[w] != nil || rerr != nil {
					t.Fatalf("%s, 4 at a time: %v %v", v.name, errs[w], rerr)
				}
				four[v.name] = append(four[v.name], criSample{p, cpu, timers})
			}
		}
		rate[v.name] = float64(batches*workers) / elapsed.Seconds()
	}
	traces := readPhaseTraces(t)
	var b strings.Builder
	fmt.Fprintf(&b, "CRI pod start attributed (medians; 1 at a time over %d interleaved rounds, 4 at a time over %d pods; wall / the shim's CPU, with runsc's commands it waited for)\n", rounds, batches*workers)
	b.WriteString(attribution(traces, one[variants[0].name], four[variants[0].name], runtimeTypes[variants[0].handler]))
	b.WriteString(containerdTimers(variants, one, four))
	fmt.Fprintf(&b, "%-44s %9s %9s %9s %9s   %9s %9s\n", "the same calls, by runtime", "runp", "create", "start", "pod", "CPU/pod", "4x pods/s")
	for _, v := range variants {
		for _, c := range []struct {
			label string
			s     []criSample
		}{{"1 at a time", one[v.name]}, {"4 at a time", four[v.name]}} {
			r := ""
			if c.label == "4 at a time" {
				r = fmt.Sprintf("%9.2f", rate[v.name])
			}
			fmt.Fprintf(&b, "%-44s %9s %9s %9s %9s   %9s %s\n", v.name+", "+c.label,
				ms(callMedian(c.s, 0)), ms(callMedian(c.s, 1)), ms(callMedian(c.s, 2)), ms(callMedian(c.s, -1)), ms(cpuMedian(c.s)), r)
		}
	}
	med := func(n string, s map[string][]criSample) float64 { return float64(callMedian(s[n], -1)) }
	fmt.Fprintf(&b, "ratio agentbox/runc pod start: %.2fx alone, %.2fx 4 at a time (goal <= 1.5x alone); agentbox/runsc alone: %.2fx alone, %.2fx 4 at a time\n",
		med("agentbox-baseline", one)/med("runc", one), med("agentbox-baseline", four)/med("runc", four),
		med("agentbox-baseline", one)/med("runsc alone", one), med("agentbox-baseline", four)/med("runsc alone", four))
	fmt.Fprintf(&b, "ratio pods/s 4 at a time: agentbox/runc %.2fx (goal >= 0.6x); runsc alone/runc %.2fx; agentbox/runsc alone %.2fx\n",
		rate["agentbox-baseline"]/rate["runc"], rate["runsc alone"]/rate["runc"], rate["agentbox-baseline"]/rate["runsc alone"])
	// The floor under the role: runsc doing what agentbox asks of it,
	// with no containerd or shim around it.
	as := runscAsAgentbox.name
	fmt.Fprintf(&b, "the role's floor: runsc alone with agentbox's specs/runsc alone pod start %.2fx alone, %.2fx 4 at a time; pods/s 4 at a time %.2fx; agentbox/it pod start %.2fx alone, %.2fx 4 at a time; agentbox/it pods/s %.2fx; it/runc pod start %.2fx alone, pods/s %.2fx\n",
		med(as, one)/med("runsc alone", one), med(as, four)/med("runsc alone", four), rate[as]/rate["runsc alone"],
		med("agentbox-baseline", one)/med(as, one), med("agentbox-baseline", four)/med(as, four), rate["agentbox-baseline"]/rate[as],
		med(as, one)/med("runc", one), rate[as]/rate["runc"])
	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

// readPhaseTraces reads the shims' phase trace by op and id.
func readPhaseTraces(t *testing.T) map[string]shim.PhaseTrace {
	t.Helper()
	data, err := os.ReadFile(os.Getenv(shim.PhaseTraceEnv))
	if err != nil {
		t.Fatalf("no phase trace: %v", err)
	}
	out := map[string]shim.PhaseTrace{}
	for _, raw := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var l shim.PhaseTrace
		if json.Unmarshal([]byte(raw), &l) == nil {
			out[l.Op+" "+l.ID] = l
		}
	}
	return out
}

func callMedian(s []criSample, call int) time.Duration {
	var d []time.Duration
	for _, x := range s {
		if call < 0 {
			d = append(d, x.p.calls[0]+x.p.calls[1]+x.p.calls[2])
		} else {
			d = append(d, x.p.calls[call])
		}
	}
	return stats(d).median
}

func cpuMedian(s []criSample) time.Duration {
	var d []time.Duration
	for _, x := range s {
		d = append(d, x.cpu)
	}
	return stats(d).median
}

// attribution splits each CRI call of agentbox's pods into the shim's
// phases and what is outside them, as two columns (1 and 4 at a time) of
// medians, wall and CPU.
func attribution(traces map[string]shim.PhaseTrace, one, four []criSample, runtime string) string {
	type cell struct{ wall, cpu []time.Duration }
	var rows []string
	cols := []map[string]*cell{{}, {}}
	add := func(col int, row string, wall, cpu float64) {
		c := cols[col][row]
		if c == nil {
			c = &cell{}
			cols[col][row] = c
		}
		if !slices.Contains(rows, row) {
			rows = append(rows, row)
		}
		c.wall = append(c.wall, time.Duration(wall*float64(time.Millisecond)))
		c.cpu = append(c.cpu, time.Duration(cpu*float64(time.Millisecond)))
	}
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for col, samples := range [][]criSample{one, four} {
		for _, s := range samples {
			cid := ""
			if len(s.p.containers) > 0 {
				cid = s.p.containers[0]
			}
			// Each CRI call and the shim requests it makes: RunPodSandbox
			// creates and starts the pause container (the sandbox).
			for i, call := range []struct {
				name string
				reqs []string
			}{
				{"RunPodSandbox", []string{"create " + s.p.id, "start " + s.p.id}},
				// containerd's CRI creates the container's task (the
				// shim's Create) in StartContainer, not CreateContainer.
				{"CreateContainer", nil},
				{"StartContainer", []string{"create " + cid, "start " + cid}},
			} {
				add(col, call.name+"|"+call.name, msOf(s.p.calls[i]), 0)
				traced := 0.0
				for _, req := range call.reqs {
					tr, ok := traces[req]
					if !ok {
						continue
					}
					op := strings.Fields(req)[0]
					var own, ownCPU float64
					for _, ph := range tr.Phases {
						if strings.HasPrefix(ph.Name, "runsc_") {
							add(col, call.name+"|"+fmt.Sprintf("  shim %s: %s (gVisor's)", op, ph.Name), ph.MS, ph.CPUMS)
							continue
						}
						own, ownCPU = own+ph.MS, ownCPU+ph.CPUMS
					}
					add(col, call.name+"|"+fmt.Sprintf("  shim %s: agentbox's phases", op), own, ownCPU)
					for _, ph := range tr.Phases {
						if !strings.HasPrefix(ph.Name, "runsc_") {
							add(col, call.name+"|"+op+" "+fmt.Sprintf("    %s", ph.Name), ph.MS, ph.CPUMS)
						}
					}
					traced += tr.TotalMS
				}
				// containerd's CRI, the CNI plugins, the shim's own process
				// start, crictl's: split by containerd's timers when read.
				for _, o := range outsideShim(call.name, msOf(s.p.calls[i]), traced, s.timers, runtime) {
					add(col, call.name+"|  "+o.label, o.ms, 0)
				}
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-52s %19s %19s\n", "agentbox-baseline", "1 at a time", "4 at a time")
	for _, r := range rows {
		label := r[strings.Index(r, "|")+1:]
		if i := strings.Index(label, "    "); i > 0 { // a phase: "create    NAME"
			label = label[i:]
		}
		fmt.Fprintf(&b, "%-52s", label)
		for _, col := range cols {
			c := col[r]
			if c == nil {
				fmt.Fprintf(&b, " %19s", "-")
				continue
			}
			fmt.Fprintf(&b, " %9s %9s", ms(stats(c.wall).median), ms(stats(c.cpu).median))
		}
		b.WriteString("\n")
	}
	return b.String()
}
