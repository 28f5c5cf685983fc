//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// TestBenchmarkWarmCPU: a claim from a warm pool to the agent answering an
// exec, beside two other warm pods that keep both CPUs busy while they
// wait (two busy loops each: an agent warming its caches), on the
// hack/kube.sh cluster. Interleaved rounds of four kinds, on the same
// pods: the busy pods frozen (the cgroup freezer: no load, the
// reference); busy as agentbox leaves a ready warm pod (the idle CPU
// class and a 50m cap); in the idle class only (the benchmark gives the
// cap back for the round); with neither (as before agentbox did either).
// AGENTBOX_BENCH=1 only.
func TestBenchmarkWarmCPU(t *testing.T) {
	requireBench(t)
	k := kubeCluster(t)
	k.agentSandbox(t)
	ns := k.namespace(t, "bench-warmcpu")
	busyNS := k.namespace(t, "bench-warmcpu-busy")
	benchRole(t, k, "bench-warmcpu", ns, busyNS)
	k.apply(t, sandboxTemplate(ns, "agent", "agentbox", "bench-warmcpu", "sh", "-c", "exec sleep infinity"), warmPool(ns, "agents", "agent", 1),
		sandboxTemplate(busyNS, "busy", "agentbox", "bench-warmcpu", "sh", "-c", "for i in 1 2; do (while :; do :; done) & done; wait"),
		warmPool(busyNS, "busy", "busy", 2))
	k.waitPoolReady(t, busyNS, "busy", "2")
	k.waitPoolReady(t, ns, "agents", "1")
	k.waitWarm(t, busyNS)
	k.warmWaitsIdle(t, busyNS)
	busy := strings.Fields(k.mustKubectl(t, "-n", busyNS, "get", "pods", "-o", "jsonpath={.items[*].metadata.uid}"))
	rc := k.restConfig(t)
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// set puts the busy pods' cgroups in a state: frozen, or cpu.idle v.
	set := func(file, v string) {
		for _, uid := range busy {
			files, _ := filepath.Glob("/sys/fs/cgroup/" + file[:strings.Index(file, ".")] + "/agentbox-kube/kubepods/*/pod" + uid + "/" + file)
			if len(files) != 1 {
				t.Fatalf("busy pod %s: %s files %v", uid, file, files)
			}
			if err := os.WriteFile(files[0], []byte(v), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	settled := func() bool {
		r := k.kubectl("-n", ns, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.phase}{"\n"}{end}`)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		return len(lines) == 1 && len(strings.Fields(lines[0])) == 2 && strings.Fields(lines[0])[1] == "Running" &&
			strings.TrimSpace(k.kubectl("-n", ns, "get", "sandboxwarmpool", "agents", "-o", "jsonpath={.status.readyReplicas}").stdout) == "1"
	}
	// The busy pods as the shim left them: idle class, capped at 50m
	// (quota 5000 of 100000). Without the cap they have their role's 1 CPU
	// (quota 100000), as before the shim capped warm pods.
	modes := []struct {
		name        string
		before, off func()
	}{
		{"busy pods frozen (no load)", func() { set("freezer.state", "FROZEN") }, func() { set("freezer.state", "THAWED") }},
		{"busy, idle + 50m cap (agentbox)", func() {}, func() {}},
		{"busy, idle class only", func() { set("cpu.cfs_quota_us", "100000") }, func() { set("cpu.cfs_quota_us", "5000") }},
		{"busy, neither", func() { set("cpu.idle", "0"); set("cpu.cfs_quota_us", "100000") }, func() { set("cpu.idle", "1"); set("cpu.cfs_quota_us", "5000") }},
	}
	rounds := benchRounds("AGENTBOX_BENCH_CLAIM_ROUNDS", 7)
	answered := map[string][]time.Duration{}
	for i := 0; i < rounds; i++ {
		for j, m := range modes {
			if !eventually(t, 3*time.Minute, settled) {
				t.Fatalf("the warm pool did not refill or a claim's pod stayed:\n%s", clip(k.kubectl("-n", ns, "get", "sandboxwarmpool,sandbox,pods").stdout))
			}
			claim := fmt.Sprintf("task-%d-%d", i, j)
			m.before()
			time.Sleep(200 * time.Millisecond) // the load (or its absence) settles
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			start := time.Now()
			_, err := client.Resource(claimsGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: obj{
				"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
				"metadata": obj{"name": claim, "namespace": ns}, "spec": obj{"warmPoolRef": obj{"name": "agents"}}}}, metav1.CreateOptions{})
			var sb, out string
			if err == nil {
				sb, err = claimReady(ctx, client, ns, claim)
			}
			if err == nil {
				out, err = apiExec(ctx, rc, ns, sb, "echo", "answered")
			}
			d := time.Since(start)
			cancel()
			m.off()
			if err != nil || out != "answered\n" {
				t.Fatalf("%s: claim %s, exec in %q: %q, %v", m.name, claim, sb, out, err)
			}
			answered[m.name] = append(answered[m.name], d)
			k.kubectl("-n", ns, "delete", "sandboxclaim", claim, "--wait=false")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "warm claim to an exec answered beside 2 busy warm pods (2 busy loops each; hack/kube.sh cluster, %d rounds each, interleaved; median, p90):\n", rounds)
	ref := stats(answered[modes[0].name]).median
	for _, m := range modes {
		a := stats(answered[m.name])
		fmt.Fprintf(&b, "  %-32s exec answered %s (p90 %s); %.2fx no load\n", m.name, ms(a.median), ms(a.p90), float64(a.median)/float64(ref))
	}
	t.Log(b.String())
	benchOut(t, b.String())
}
