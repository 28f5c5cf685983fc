//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// criVariant is one way the kubelet could start a pod.
type criVariant struct {
	name, handler, namespace string
	annotations              map[string]string
}

var criVariants = []criVariant{
	{"agentbox-baseline", "agentbox", "bench", nil},
	// An allowlist role: the pod's resolver and its nftables rules too.
	{"agentbox-allowlist", "agentbox", "e2e-allow", map[string]string{"agentbox.dev/role": "e2e-allow"}},
	{"runc", "runc", "bench", nil},
}

// sleeper is the CRI benchmark's container.
var sleeper = map[string]any{
	"metadata": map[string]any{"name": "sleeper"}, "image": map[string]any{"image": agentImage},
	"command": []string{"sleep", "3600"}, "log_path": "sleeper.log", "linux": map[string]any{},
}

// criPod runs one pod with container c through the CRI as the kubelet
// does: RunPodSandbox, CreateContainer, StartContainer. It returns the pod
// (the container is p.containers[0]) and how long it took until the
// container was running.
func criPod(v criVariant, name string, c map[string]any) (*pod, time.Duration, error) {
	dir, err := os.MkdirTemp("", "abx-cribench-")
	if err != nil {
		return nil, 0, err
	}
	p := &pod{dir: dir, logDir: filepath.Join(dir, "logs"), uid: uniqueID("uid")}
	p.podJSON = filepath.Join(dir, "pod.json")
	if err := writeJSONFile(p.podJSON, map[string]any{
		"metadata":    map[string]any{"name": name, "namespace": v.namespace, "uid": p.uid, "attempt": 0},
		"annotations": v.annotations, "log_directory": p.logDir, "linux": map[string]any{},
	}); err != nil {
		return p, 0, err
	}
	cfg := filepath.Join(dir, "c.json")
	if err := writeJSONFile(cfg, c); err != nil {
		return p, 0, err
	}
	start := time.Now()
	r := dev.crictl(90*time.Second, "runp", "--runtime", v.handler, p.podJSON)
	if r.code != 0 {
		return p, 0, fmt.Errorf("runp: %v", r)
	}
	p.id = strings.TrimSpace(r.stdout)
	p.calls[0] = time.Since(start)
	r = dev.crictl(90*time.Second, "create", p.id, cfg, p.podJSON)
	if r.code != 0 {
		return p, 0, fmt.Errorf("create: %v", r)
	}
	cid := strings.TrimSpace(r.stdout)
	p.containers = append(p.containers, cid)
	p.calls[1] = time.Since(start) - p.calls[0]
	if r = dev.crictl(90*time.Second, "start", cid); r.code != 0 {
		return p, 0, fmt.Errorf("start: %v", r)
	}
	total := time.Since(start)
	p.calls[2] = total - p.calls[0] - p.calls[1]
	return p, total, nil
}

// removePod stops and removes a pod, returning how long that took.
func removePod(p *pod) (time.Duration, error) {
	defer os.RemoveAll(p.dir)
	if p.id == "" {
		return 0, nil
	}
	start := time.Now()
	if r := dev.crictl(90*time.Second, "stopp", p.id); r.code != 0 {
		return 0, fmt.Errorf("stopp: %v", r)
	}
	if r := dev.crictl(90*time.Second, "rmp", "-f", p.id); r.code != 0 {
		return 0, fmt.Errorf("rmp: %v", r)
	}
	p.released = true
	return time.Since(start), nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func percentile(s []time.Duration, q float64) time.Duration {
	c := append([]time.Duration(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(math.Ceil(q*float64(len(c)))) - 1
	if i < 0 {
		i = 0
	}
	return c[i]
}

// TestBenchmarkCRI measures pods the way Kubernetes starts them: through
// the CRI, RunPodSandbox to the container running, then StopPodSandbox and
// RemovePodSandbox, for agentbox under baseline, agentbox under an
// allowlist role (resolver and nftables), and runc, in interleaved rounds;
// then 20 pods started 4 at a time per runtime. AGENTBOX_BENCH=1 only
// (hack/bench.sh). It asserts no timing, only that every pod ran.
func TestBenchmarkCRI(t *testing.T) {
	requireBench(t)
	rounds := benchRounds("AGENTBOX_BENCH_CRI_ROUNDS", 15)
	up, down := map[string][]time.Duration{}, map[string][]time.Duration{}
	for i := -1; i < rounds; i++ { // round -1 warms up
		order := criVariants
		if i%2 == 1 {
			order = []criVariant{criVariants[2], criVariants[1], criVariants[0]}
		}
		for _, v := range order {
			p, d, err := criPod(v, fmt.Sprintf("bench-%d", i), sleeper)
			rm, rerr := removePod(p)
			if err != nil || rerr != nil {
				t.Fatalf("%s: %v %v", v.name, err, rerr)
			}
			if i >= 0 {
				up[v.name], down[v.name] = append(up[v.name], d), append(down[v.name], rm)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CRI pod start (RunPodSandbox .. container running) and teardown (StopPodSandbox, RemovePodSandbox), %d interleaved rounds\n", rounds)
	fmt.Fprintf(&b, "%-20s %9s %9s %9s   %9s %9s\n", "runtime", "p50", "p90", "p99", "down p50", "down p90")
	for _, v := range criVariants {
		fmt.Fprintf(&b, "%-20s %9s %9s %9s   %9s %9s\n", v.name, ms(percentile(up[v.name], .5)), ms(percentile(up[v.name], .9)),
			ms(percentile(up[v.name], .99)), ms(percentile(down[v.name], .5)), ms(percentile(down[v.name], .9)))
	}
	p50 := func(n string) float64 { return float64(percentile(up[n], .5)) }
	fmt.Fprintf(&b, "ratio agentbox-baseline/runc (p50 start): %.2fx; agentbox-allowlist/agentbox-baseline: %.2fx\n",
		p50("agentbox-baseline")/p50("runc"), p50("agentbox-allowlist")/p50("agentbox-baseline"))

	// Concurrency: 20 pods, 4 at a time.
	for _, v := range []criVariant{criVariants[0], criVariants[2]} {
		const n, workers = 20, 4
		var mu sync.Mutex
		var pods []*pod
		var failed []string
		jobs := make(chan int)
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					p, _, err := criPod(v, fmt.Sprintf("conc-%d", i), sleeper)
					mu.Lock()
					pods = append(pods, p)
					if err != nil {
						failed = append(failed, err.Error())
					}
					mu.Unlock()
				}
			}()
		}
		for i := 0; i < n; i++ {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		elapsed := time.Since(start)
		for _, p := range pods {
			if _, err := removePod(p); err != nil {
				failed = append(failed, err.Error())
			}
		}
		fmt.Fprintf(&b, "%-20s %d pods, %d at a time: %s, %.2f pods/s, %d failed\n", v.name, n, workers, ms(elapsed), float64(n)/elapsed.Seconds(), len(failed))
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d pods failed: %s", v.name, len(failed), n, failed[0])
		}
	}

	t.Log("\n" + b.String())
	benchOut(t, b.String())
}

// TestBenchmarkPodMemory reports what an idle pod costs: 20 agentbox pods
// under baseline, one sleeping container each, their memory and the
// machine's CPU while they idle; and the CPU of 20 idle runc pods.
// AGENTBOX_BENCH=1 only.
func TestBenchmarkPodMemory(t *testing.T) {
	requireBench(t)
	none := idleCPU(t)
	report := fmt.Sprintf("machine CPU with no pods: %.0f ms/s\n", ms1(none))
	report += podMemory(t, 20, criVariants[0], none)
	runc, _, err := idlePods(20, criVariants[2])
	if err == nil {
		report += fmt.Sprintf("20 idle runc pods: machine CPU %.0f ms/s above no pods\n", ms1(idleCPU(t)-none))
	} else {
		report += fmt.Sprintf("20 idle runc pods: not measured (%v)\n", err)
	}
	removePods(runc)
	t.Log("\n" + report)
	benchOut(t, report)
}

// idleCPU is the machine's CPU time per second over 10 s.
func idleCPU(t *testing.T) time.Duration {
	const over = 10 * time.Second
	time.Sleep(2 * time.Second) // let pods just started settle into idle
	c0 := machineCPU(t)
	time.Sleep(over)
	return (machineCPU(t) - c0) / (over / time.Second)
}

// ms1 is d in milliseconds.
func ms1(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// idlePods starts n pods of v, one sleeping container each, one after
// another.
func idlePods(n int, v criVariant) ([]*pod, time.Duration, error) {
	var pods []*pod
	start := time.Now()
	for i := 0; i < n; i++ {
		p, _, err := criPod(v, fmt.Sprintf("idle-%d", i), sleeper)
		pods = append(pods, p)
		if err != nil {
			return pods, 0, fmt.Errorf("pod %d: %w", i, err)
		}
	}
	return pods, time.Since(start), nil
}

func removePods(pods []*pod) {
	for _, p := range pods {
		removePod(p)
	}
}

// podMemory starts n idle agentbox pods (baseline, one sleeping container
// each) one after another and reports the proportional set size (PSS) of
// each pod's shim, runsc sandbox and gofer, averaged per pod, and the
// machine's CPU while they idle (above none, with no pods).
func podMemory(t *testing.T, n int, v criVariant, none time.Duration) string {
	t.Helper()
	pods, elapsed, err := idlePods(n, v)
	defer removePods(pods)
	if err != nil {
		t.Fatal(err)
	}
	cpu := idleCPU(t) - none
	var shim, sandbox, gofer, wait, shimRSS, shimAnon uint64
	counted := map[string]int{}
	for _, p := range pods {
		// The shim and the sandbox name the pod's id; each container has a
		// gofer naming its own.
		for _, pid := range pidsNaming(append([]string{p.id}, p.containers...)...) {
			cmd := cmdline(pid)
			kb := smapsRollup(pid, "Pss:")
			switch {
			case strings.Contains(cmd, "containerd-shim-agentbox-v1"):
				shim += kb
				shimRSS += smapsRollup(pid, "Rss:")
				shimAnon += smapsRollup(pid, "Anonymous:")
				counted["shim"]++
			case strings.Contains(cmd, " boot "):
				sandbox += kb
				counted["sandbox"]++
			case strings.Contains(cmd, " gofer "):
				gofer += kb
				counted["gofer"]++
			case strings.Contains(cmd, " wait "):
				// gVisor's task service waits for each container with
				// a `runsc wait` that lives as long as the container.
				wait += kb
				counted["runsc wait"]++
			}
		}
	}
	per := func(kb uint64) float64 { return float64(kb) / 1024 / float64(n) }
	return fmt.Sprintf("%d idle %s pods, started one after another in %s; per pod, PSS: shim %.1f MiB (RSS %.1f, anonymous %.1f), sandbox %.1f MiB, gofer %.1f MiB, whole pod %.1f MiB (goals: shim <= 10, pod <= 30); gVisor's runsc wait processes %.1f MiB more; processes found %v\n"+
		"%d idle %s pods: machine CPU %.0f ms/s above no pods\n",
		n, v.name, ms(elapsed), per(shim), per(shimRSS), per(shimAnon), per(sandbox), per(gofer), per(shim+sandbox+gofer), per(wait), counted, n, v.name, ms1(cpu))
}

// pidsNaming lists the processes whose command line names one of ids.
func pidsNaming(ids ...string) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, id := range ids {
			if strings.Contains(string(b), id) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// smapsRollup returns a field of /proc/PID/smaps_rollup in KiB.
func smapsRollup(pid int, field string) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 && fs[0] == field {
			v, _ := strconv.ParseUint(fs[1], 10, 64)
			return v
		}
	}
	return 0
}
