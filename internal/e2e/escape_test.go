//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The escape suite: one test per attempt. Each shows the attempt blocked,
// with the expected error, AND the legitimate action beside it still
// working: a profile that breaks the agent's real work is broken too.

func runAs(t *testing.T, role string, extra []string, script string) result {
	t.Helper()
	args := append([]string{"--annotation", "agentbox.dev/role=" + role}, extra...)
	if role == "" {
		args = extra
	}
	return dev.runAgent(t, uniqueID("esc"), args, "sh", "-c", script)
}

func expectCode(t *testing.T, r result, code int, stdout ...string) {
	t.Helper()
	if r.timedOut || r.code != code {
		t.Fatalf("want exit %d, got %v", code, r)
	}
	for _, s := range stdout {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("stdout lacks %q: %v", s, r)
		}
	}
}

func TestEscapeWriteOutsideScratch(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := runAs(t, "", nil, `
		echo legit > /tmp/ok && cat /tmp/ok
		for f in /etc/evil /usr/bin/evil /evil /workspace/evil; do
			if echo x > $f 2>/dev/null; then echo "WROTE $f"; else echo "blocked $f"; fi
		done`)
	expectCode(t, r, 0, "legit", "blocked /etc/evil", "blocked /usr/bin/evil", "blocked /evil", "blocked /workspace/evil")
	if strings.Contains(r.stdout, "WROTE") {
		t.Fatalf("write outside scratch succeeded: %v", r)
	}
	// coder's /workspace is writable (bound to namespace agents: via CRI).
	p := newPodIn(t, "coder-ws", "agents", map[string]string{"agentbox.dev/role": "coder"})
	id := p.container(t, "c", "sh", "-c", "echo work > /workspace/f && cat /workspace/f && sleep 600")
	waitState(t, id, "CONTAINER_RUNNING")
	if r := waitLogs(t, id, "work"); !strings.Contains(r.stdout, "work") {
		t.Fatalf("coder cannot write its workspace: %v", r)
	}
}

func TestEscapeExecFromScratch(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := runAs(t, "", nil, `
		printf '#!/bin/sh\necho payload ran\n' > /tmp/payload; chmod +x /tmp/payload
		/tmp/payload; echo "direct exec status $?"
		sh /tmp/payload; echo "interpreted status $?"
		cp /bin/busybox /tmp/bb 2>/dev/null; /tmp/bb echo copied-binary-ran; echo "binary exec status $?"`)
	expectCode(t, r, 0, "direct exec status 126", "binary exec status 126", "interpreted status 0", "payload ran")
	if strings.Contains(r.stdout, "copied-binary-ran") {
		t.Fatalf("a binary written to scratch executed: %v", r)
	}
}

func TestEscapeSecretEnv(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	env := []string{"--env", "AWS_SECRET_ACCESS_KEY=leaked-key", "--env", "API_TOKEN=image-token", "--env", "AGENT_MODE=fast", "--env", "LANG=C.UTF-8"}
	r := runAs(t, "", env, `env`)
	expectCode(t, r, 0, "LANG=C.UTF-8", "PATH=")
	for _, leak := range []string{"leaked-key", "image-token", "AGENT_MODE"} {
		if strings.Contains(r.stdout, leak) {
			t.Fatalf("baseline passed %s through: %v", leak, r)
		}
	}
	// e2e-secret injects API_TOKEN from a node file and passes AGENT_*.
	r = runAs(t, "e2e-secret", env, `env`)
	expectCode(t, r, 0, "API_TOKEN="+secretValue, "AGENT_MODE=fast")
	if strings.Contains(r.stdout, "leaked-key") || strings.Contains(r.stdout, "image-token") || strings.Contains(r.stdout, "LANG=") {
		t.Fatalf("e2e-secret env: %v", r)
	}
}

func TestEscapeServiceAccountToken(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	tokenDir := t.TempDir()
	os.WriteFile(filepath.Join(tokenDir, "token"), []byte("sa-token-value"), 0o644)
	shared := filepath.Join(dev.dir, "shared")
	p := newPodIn(t, "sa", "team", map[string]string{"agentbox.dev/role": "e2e-volumes"})
	id := p.containerWith(t, "c", map[string]any{
		"command": []string{"sh", "-c", "ls /var/run/secrets/kubernetes.io/serviceaccount/token 2>&1; cat /models/model.txt; echo x > /models/new 2>&1 || echo model-dir-read-only; sleep 600"},
		"mounts": []map[string]any{
			{"container_path": "/var/run/secrets/kubernetes.io/serviceaccount", "host_path": tokenDir, "readonly": true},
			{"container_path": "/models", "host_path": shared},
		},
	})
	waitState(t, id, "CONTAINER_RUNNING")
	logs := waitLogs(t, id, "model-dir-read-only")
	out := logs.stdout + logs.stderr
	if !strings.Contains(out, "No such file") || strings.Contains(out, "sa-token-value") {
		t.Fatalf("service-account token visible: %v", logs)
	}
	if !strings.Contains(out, "weights") || !strings.Contains(out, "model-dir-read-only") {
		t.Fatalf("allowed host mount must be readable and read-only: %v", logs)
	}
	// A host mount outside the role's allowlist refuses the container (the
	// CRI creates the task, and so asks the shim, at start).
	bad := p.tryContainer(t, "bad", map[string]any{
		"command": []string{"true"},
		"mounts":  []map[string]any{{"container_path": "/host", "host_path": "/etc"}},
	})
	if bad.code != 0 {
		t.Fatalf("create: %v", bad)
	}
	r := dev.crictl(60*time.Second, "start", strings.TrimSpace(bad.stdout))
	if r.code == 0 || !strings.Contains(unescape(r.stderr), `mounts not allowed by role "e2e-volumes": /etc -> /host`) {
		t.Fatalf("want the /etc mount refused: %v", r)
	}
}

func TestEscapeForkBomb(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	// While the bomb holds every process slot, a fork of this shell's own
	// fails (and busybox sh exits on it): count and stop the bomb with
	// builtins only (glob, set, kill), then fork.
	r := runAs(t, "e2e-bomb", nil, `
		read t0 _ </proc/uptime; t0=${t0%.*}
		bomb() { bomb | bomb & }; bomb 2>/dev/null
		i=0; max=0
		# 400 looks at least; more, up to 20000 or 10 seconds, until the
		# bomb has grown (its forks are audited, so how fast it grows varies
		# with the load).
		while [ $i -lt 400 ] || { [ $max -lt 12 ] && [ $i -lt 20000 ] && read t _ </proc/uptime && [ $((${t%.*} - t0)) -lt 10 ]; }; do set -- /proc/[0-9]*; [ $# -gt $max ] && max=$#; i=$((i+1)); done
		echo "processes at most $max"
		[ "$max" -le 16 ] && echo "within limit"
		kill -9 -1 2>/dev/null
		i=0; while [ $i -lt 100000 ]; do set -- /proc/[0-9]*; [ $# -le 1 ] && break; i=$((i+1)); done
		echo "still responsive: $(echo ok)"`)
	expectCode(t, r, 0, "within limit", "still responsive: ok")
	var max int
	fmt.Sscanf(r.stdout[strings.Index(r.stdout, "processes at most"):], "processes at most %d", &max)
	if max < 8 {
		t.Fatalf("the bomb never filled the sandbox (%d processes): the test proves nothing: %v", max, r)
	}
}

func TestEscapeMemoryBomb(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	// abx-probe allocates and touches memory fast (a shell string of the
	// same size spends seconds of CPU, past e2e-tight's 2s cpuTime).
	alloc := func(mib string) result {
		return dev.ctr(90*time.Second, "run", "--rm", "--runtime", runtimeType, "--annotation", "agentbox.dev/role=e2e-tight", probeImage, uniqueID("mem"), "abx-probe", "alloc", mib)
	}
	// 64 MiB is fine under a 256Mi role (the Sentry counts too)...
	expectCode(t, alloc("64"), 0, "held 64 MiB")
	// ...600 MiB is not: the sandbox kills it.
	if r := alloc("600"); r.code != 137 || strings.Contains(r.stdout, "held") {
		t.Fatalf("memory bomb: want a kill (137), got %v", r)
	}
}

func TestEscapeCPUSpin(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := runAs(t, "e2e-tight", nil, `i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo "counted $i"`)
	expectCode(t, r, 0, "counted 20000")
	start := time.Now()
	r = runAs(t, "e2e-tight", nil, `while :; do :; done`)
	if r.code != 137 || r.timedOut {
		t.Fatalf("CPU spin past 2s of CPU time: want a kill (137), got %v", r)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("CPU spin ran %v; the 2s limit did not stop it", d)
	}
}

func TestEscapeWallClock(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	r := runAs(t, "e2e-tight", nil, `sleep 1; echo done`)
	expectCode(t, r, 0, "done")
	r = runAs(t, "e2e-tight", nil, `echo started; sleep 60; echo overslept`)
	if r.code != 124 || strings.Contains(r.stdout, "overslept") || !strings.Contains(r.stdout, "started") {
		t.Fatalf("sleep past the 6s wall clock: want exit 124, got %v", r)
	}
	// A pod may shorten its wall clock, never lengthen it.
	r = runAs(t, "e2e-tight", []string{"--annotation", "agentbox.dev/wall-clock=2s"}, `sleep 60`)
	if r.code != 124 {
		t.Fatalf("wall-clock annotation 2s: want 124, got %v", r)
	}
	r = runAs(t, "e2e-tight", []string{"--annotation", "agentbox.dev/wall-clock=1h"}, `true`)
	if r.code == 0 || !strings.Contains(r.stderr, "would raise wall-clock") {
		t.Fatalf("wall-clock annotation 1h must be refused: %v", r)
	}
}

func TestEscapeNetworkNone(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	port := testServer(t, "HTTP/1.0 200 OK\r\n\r\nreached-test-server")
	// busybox's wget segfaults under gVisor (its static glibc resolver);
	// nc speaks HTTP well enough.
	script := fmt.Sprintf("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 %s %d; s=$?; echo; echo wget-status=$s; sleep 600",
		egress.gateway, port)

	// baseline (egress none) in a CNI pod: no route anywhere.
	p := newPodIn(t, "net-none", "agents", nil)
	id := p.container(t, "c", "sh", "-c", script)
	logs := waitLogs(t, id, "wget-status")
	if strings.Contains(logs.stdout, "reached-test-server") || strings.Contains(logs.stdout, "wget-status=0") {
		t.Fatalf("egress none reached the test server: %v", logs)
	}
	// e2e-open (egress open) in the same network reaches it.
	p = newPodIn(t, "net-open", "e2e-net", map[string]string{"agentbox.dev/role": "e2e-open"})
	id = p.container(t, "c", "sh", "-c", script)
	logs = waitLogs(t, id, "wget-status")
	if !strings.Contains(logs.stdout, "reached-test-server") {
		t.Fatalf("egress open did not reach the test server on the bridge: %v", logs)
	}
}

// testServer answers each connection with reply (see serve) until the test
// ends, and returns its port. Pods reach it at the bridge's gateway.
func testServer(t *testing.T, reply string) int {
	t.Helper()
	s, err := serve("0.0.0.0:0", reply)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ln.Close() })
	return s.port
}

func TestEscapeUnboundRole(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	cases := []struct{ role, want string }{
		{"coder", `role "coder" is not bound to containerd namespace "default", runtime handler "agentbox"`},
		{"e2e-unbound", `role "e2e-unbound" is not bound`},
		{"root", `role "root" is not defined in the policy`},
	}
	for _, tc := range cases {
		r := runAs(t, tc.role, nil, "echo should-not-run")
		if r.code == 0 || strings.Contains(r.stdout, "should-not-run") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("role %s: want refusal %q, got %v", tc.role, tc.want, r)
		}
	}
	// Through the CRI the refusal reaches crictl, and the pod leaves nothing.
	_, r := tryPod(t, "unbound", "default", map[string]string{"agentbox.dev/role": "coder"})
	// The refusal's kind reaches the kubelet as a gRPC code, not Unknown.
	if r.code == 0 || !strings.Contains(unescape(r.stderr), `role "coder" is not bound to pod namespace "default"`) || !strings.Contains(r.stderr, "code = PermissionDenied") {
		t.Fatalf("crictl runp with an unbound role: %v", r)
	}
	// The legitimate claim: coder in namespace agents.
	p := newPodIn(t, "bound", "agents", map[string]string{"agentbox.dev/role": "coder"})
	id := p.container(t, "c", "sh", "-c", "echo coder-runs; sleep 600")
	if logs := waitLogs(t, id, "coder-runs"); !strings.Contains(logs.stdout, "coder-runs") {
		t.Fatalf("bound role did not run: %v", logs)
	}
	// A container cannot claim a role other than its pod's.
	rc := p.tryContainer(t, "other", map[string]any{"command": []string{"true"}, "annotations": map[string]string{"agentbox.dev/role": "researcher"}})
	if rc.code != 0 {
		t.Fatalf("create: %v", rc)
	}
	rs := dev.crictl(60*time.Second, "start", strings.TrimSpace(rc.stdout))
	if rs.code == 0 || !strings.Contains(rs.stderr, "a container runs under its pod's role") {
		t.Fatalf("container claiming another role: %v", rs)
	}
}

func TestEscapeHostileGVisorAnnotation(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("hostile")
	r := dev.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType,
		"--annotation", "dev.gvisor.flag.strace=true",
		"--annotation", "dev.gvisor.flag.network=host",
		"--annotation", "dev.gvisor.spec.mount.evil.share=shared",
		agentImage, id, "sleep", "600")
	if r.code != 0 {
		t.Fatalf("run: %v", r)
	}
	defer dev.removeContainer(id)
	if err := waitRunning(id, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	e := dev.ctr(60*time.Second, "tasks", "exec", "--exec-id", "probe", id, "sh", "-c", "cat /proc/net/dev; echo legit-exec")
	if e.code != 0 || !strings.Contains(e.stdout, "legit-exec") {
		t.Fatalf("the container must still run: %v", e)
	}
	// network=host would show the host's interfaces (eth0, the bridge).
	for _, l := range strings.Split(e.stdout, "\n") {
		if name, _, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && name != "lo" && !strings.Contains(name, "|") && !strings.Contains(name, "Inter") {
			t.Fatalf("sandbox sees interface %q: network override applied: %v", name, e)
		}
	}
	for _, cmd := range sandboxCmdlines(id) {
		if strings.Contains(cmd, "--strace") || strings.Contains(cmd, "--network=host") {
			t.Fatalf("pod annotation reached runsc: %s", cmd)
		}
	}
}

// sandboxCmdlines returns the command lines of runsc processes for a
// container.
func sandboxCmdlines(id string) []string {
	var out []string
	for _, cmd := range cmdlines() {
		if strings.HasPrefix(cmd, "runsc") && strings.Contains(cmd, id) {
			out = append(out, cmd)
		}
	}
	return out
}

func TestEscapeMalformedPolicy(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policies")
	os.MkdirAll(pol, 0o755)
	os.WriteFile(filepath.Join(pol, "broken.yaml"), []byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: baseline}\nspec:\n  network: {egress: everywhere}\n"), 0o644)
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("version = 1\n[runsc]\nbinary = %q\n[policy]\ndir = %q\n", filepath.Join(cacheDir(), "bin", "runsc"), pol)), 0o644)
	r := dev.runAgent(t, uniqueID("badpol"), []string{"--runtime-config-path", cfg}, "echo", "should-not-run")
	if r.code == 0 || !strings.Contains(r.stderr, "broken.yaml:5: spec.network.egress: \"everywhere\"") {
		t.Fatalf("want the container refused naming file, line and field: %v", r)
	}
	// Fixed, the same config runs (baseline needs a binding).
	os.WriteFile(filepath.Join(pol, "broken.yaml"), []byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: baseline}\nspec: {}\n---\napiVersion: agentbox.dev/v1\nkind: RoleBinding\nmetadata: {name: all}\nspec: {role: baseline, subjects: [{containerdNamespace: \"*\"}]}\n"), 0o644)
	r = dev.runAgent(t, uniqueID("goodpol"), []string{"--runtime-config-path", cfg}, "echo", "runs")
	expectCode(t, r, 0, "runs")
}

func TestExecGetsTheProfile(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("execprof")
	if r := dev.ctr(60*time.Second, "run", "-d", "--runtime", runtimeType, "--env", "SECRET_TOKEN=hunter2", agentImage, id, "sleep", "600"); r.code != 0 {
		t.Fatalf("run: %v", r)
	}
	defer dev.removeContainer(id)
	if err := waitRunning(id, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// ctr task exec --user 0 asks for root; the role says 65532.
	e := dev.ctr(60*time.Second, "tasks", "exec", "--user", "0", "--exec-id", "x1", id, "sh", "-c",
		"id -u; grep CapEff /proc/self/status; env; echo x > /etc/evil 2>/dev/null || echo etc-read-only; echo ok > /tmp/ok && echo tmp-ok")
	if e.code != 0 || !strings.Contains(e.stdout, "65532") || !strings.Contains(e.stdout, "CapEff:\t0000000000000000") ||
		strings.Contains(e.stdout, "hunter2") || !strings.Contains(e.stdout, "etc-read-only") || !strings.Contains(e.stdout, "tmp-ok") {
		t.Fatalf("exec must run under the container's profile: %v", e)
	}
	// Its twin: a non-root user the role allows is kept (the role is a
	// ceiling, not a costume), still without capabilities.
	e = dev.ctr(60*time.Second, "tasks", "exec", "--user", "1234", "--exec-id", "x2", id, "sh", "-c", "id -u; grep CapEff /proc/self/status")
	if e.code != 0 || !strings.Contains(e.stdout, "1234\n") || !strings.Contains(e.stdout, "CapEff:\t0000000000000000") {
		t.Fatalf("exec --user 1234 under baseline: %v", e)
	}
	// The exec request is in the container's audit trail.
	b, err := os.ReadFile(filepath.Join(dev.dir, "audit", id+".jsonl"))
	if err != nil || !strings.Contains(string(b), `"event_code":"agentbox/exec"`) || !strings.Contains(string(b), `"exec_id":"x1"`) {
		t.Fatalf("exec request not audited: %v", err)
	}
}

// unescape undoes crictl's quoting of the runtime's error message.
func unescape(s string) string { return strings.ReplaceAll(s, `\"`, `"`) }

// newPodIn runs a pod in a Kubernetes namespace.
func newPodIn(t *testing.T, name, namespace string, annotations map[string]string) *pod {
	t.Helper()
	p, r := tryPod(t, name, namespace, annotations)
	if r.code != 0 {
		t.Fatalf("crictl runp: %v", r)
	}
	return p
}

// waitLogs waits until a container's logs contain want (or 60s pass).
func waitLogs(t *testing.T, id, want string) result {
	t.Helper()
	return waitLogsWithin(t, id, want, 60*time.Second)
}

// waitLogsWithin is waitLogs with its own deadline (long scripts).
func waitLogsWithin(t *testing.T, id, want string, within time.Duration) result {
	t.Helper()
	var r result
	eventually(t, within, func() bool {
		r = dev.crictl(30*time.Second, "logs", id)
		return strings.Contains(r.stdout+r.stderr, want)
	})
	return r
}

// TestEscapeMemoryBombInAPod: a pod's container that runs its sandbox out
// of memory ends as Kubernetes expects (137, reason OOMKilled), and the
// limit is in the pod's trail.
func TestEscapeMemoryBombInAPod(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "oom", "e2e-dns", map[string]string{"agentbox.dev/role": "e2e-dns", "agentbox.dev/memory": "256Mi"})
	id := p.containerWith(t, "c", map[string]any{"image": map[string]any{"image": probeImage}, "command": []string{"abx-probe", "alloc", "600"}})
	waitState(t, id, "CONTAINER_EXITED")
	if _, code, reason := containerStatus(t, id); code != 137 || reason != "OOMKilled" {
		t.Fatalf("want 137 and OOMKilled, got %d %q", code, reason)
	}
	p.remove()
	for _, rec := range readTrail(t, p.id) {
		if rec.Event == "agentbox/limit" && rec.Detail["limit"] == "memory" {
			return
		}
	}
	t.Fatal("no memory limit record in the pod's trail")
}
