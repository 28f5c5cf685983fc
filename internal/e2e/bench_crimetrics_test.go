//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// containerdMetrics is the URL of the suite containerd's Prometheus
// metrics when a benchmark run serves them (AGENTBOX_BENCH=1), or "".
var containerdMetrics string

// freeLoopbackAddr is a loopback address with a port free just now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// criTimers are the sums of containerd's CRI timers (seconds, as
// durations) by series: the metric's name and labels as Prometheus prints
// them.
type criTimers map[string]time.Duration

// The series a pod's start attribution reads; runtime is the CRI runtime
// type (io.containerd.agentbox.v1, io.containerd.runc.v2).
const (
	// RunPodSandbox from its runtime's options on (all of it but the
	// request's checks and the sandbox's id and metadata).
	timerSandboxRuntime = `containerd_cri_sandbox_runtime_create_seconds_sum{runtime="%s"}`
	// Its network namespace and the CNI plugins' ADD.
	timerSandboxNetwork = `containerd_cri_sandbox_create_network_seconds_sum`
	// The CNI plugins' ADD alone.
	timerCNIAdd = `containerd_cri_network_plugin_operations_duration_seconds_seconds_sum{operation_type="set_up_pod"}`
	// CreateContainer and StartContainer, whole.
	timerContainerCreate = `containerd_cri_container_create_seconds_sum{runtime="%s"}`
	timerContainerStart  = `containerd_cri_container_start_seconds_sum{runtime="%s"}`
)

// readCRITimers reads containerd's CRI timers, or nil when the run serves
// no metrics (not a benchmark run) or they cannot be read: the
// attribution then says so rather than guess.
func readCRITimers(t *testing.T) criTimers {
	t.Helper()
	if containerdMetrics == "" {
		return nil
	}
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(containerdMetrics)
	if err != nil {
		t.Logf("containerd's metrics: %v", err)
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Logf("containerd's metrics: %s", resp.Status)
		return nil
	}
	timers := criTimers{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "containerd_cri_") || !strings.Contains(line, "_sum") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			continue
		}
		timers[line[:i]] = time.Duration(v * float64(time.Second))
	}
	if err := sc.Err(); err != nil {
		t.Logf("containerd's metrics: %v", err)
		return nil
	}
	return timers
}

// since is each series' growth from before to t; nil if either is.
func (t criTimers) since(before criTimers) criTimers {
	if t == nil || before == nil {
		return nil
	}
	d := criTimers{}
	for k, v := range t {
		d[k] = v - before[k]
	}
	return d
}

// get is a series' value, with the runtime type put in its labels.
func (t criTimers) get(series, runtime string) (time.Duration, bool) {
	if strings.Contains(series, "%s") {
		series = fmt.Sprintf(series, runtime)
	}
	v, ok := t[series]
	return v, ok
}

// outsidePart is a share of a CRI call outside the shim's trace.
type outsidePart struct {
	label string
	ms    float64
}

// outsideShim splits a CRI call's time outside the shim's trace (callMS
// less tracedMS) by containerd's CRI timers: what containerd timed of the
// call beyond the shim's trace (the network for RunPodSandbox), and the
// rest (the request's way through gRPC, crictl's own). Without timers it
// is one part.
func outsideShim(call string, callMS, tracedMS float64, timers criTimers, runtime string) []outsidePart {
	whole := []outsidePart{{"outside the shim's trace", callMS - tracedMS}}
	if timers == nil {
		return whole
	}
	switch call {
	case "RunPodSandbox":
		rt, ok1 := timers.get(timerSandboxRuntime, runtime)
		net, ok2 := timers.get(timerSandboxNetwork, runtime)
		cni, ok3 := timers.get(timerCNIAdd, runtime)
		if !ok1 || !ok2 || !ok3 {
			return whole
		}
		return []outsidePart{
			{"containerd: the network but the CNI plugins (its namespace)", ms1(net - cni)},
			{"containerd: the CNI plugins' ADD", ms1(cni)},
			{"containerd: the rest of the sandbox's start", ms1(rt-net) - tracedMS},
			{"before containerd's timer, gRPC, crictl", callMS - ms1(rt)},
		}
	case "CreateContainer", "StartContainer":
		series := timerContainerCreate
		if call == "StartContainer" {
			series = timerContainerStart
		}
		d, ok := timers.get(series, runtime)
		if !ok {
			return whole
		}
		return []outsidePart{
			{"containerd: the rest of the call", ms1(d) - tracedMS},
			{"outside containerd's timer, gRPC, crictl", callMS - ms1(d)},
		}
	}
	return whole
}

// containerdTimers prints containerd's own CRI timers by runtime (medians
// per pod): the same spans for runc and agentbox, so that what the shim
// and runsc add within containerd's calls shows beside what runc's do.
func containerdTimers(variants []criVariant, one, four map[string][]criSample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-44s %9s %9s %9s %9s %9s\n", "containerd's CRI timers, by runtime", "netns", "CNI ADD", "sandbox", "create", "start")
	read := false
	for _, v := range variants {
		rt, ok := runtimeTypes[v.handler]
		if !ok {
			continue
		}
		for _, c := range []struct {
			label string
			s     []criSample
		}{{"1 at a time", one[v.name]}, {"4 at a time", four[v.name]}} {
			var netns, cni, sandbox, create, start []time.Duration
			for _, s := range c.s {
				if s.timers == nil {
					continue
				}
				n, ok1 := s.timers.get(timerSandboxNetwork, rt)
				a, ok2 := s.timers.get(timerCNIAdd, rt)
				r, ok3 := s.timers.get(timerSandboxRuntime, rt)
				cc, ok4 := s.timers.get(timerContainerCreate, rt)
				cs, ok5 := s.timers.get(timerContainerStart, rt)
				if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
					// A series containerd did not print: no figure, not 0.
					continue
				}
				netns, cni, sandbox = append(netns, n-a), append(cni, a), append(sandbox, r-n)
				create, start = append(create, cc), append(start, cs)
			}
			if len(netns) == 0 {
				continue
			}
			read = true
			fmt.Fprintf(&b, "%-44s %9s %9s %9s %9s %9s\n", v.name+", "+c.label,
				ms(stats(netns).median), ms(stats(cni).median), ms(stats(sandbox).median), ms(stats(create).median), ms(stats(start).median))
		}
	}
	if !read {
		return "containerd's CRI timers: not read (no metrics address)\n"
	}
	b.WriteString("(sandbox: RunPodSandbox's runtime part less the network: the shim's start and its Create and Start of the pause container, or runc's)\n")
	return b.String()
}
