//go:build e2e

// Package e2e runs agentbox end to end: a private containerd daemon (own
// root, state and socket), the real shim binary, real runsc, ctr and crictl.
// It needs root and the toolchain from hack/setup.sh; run it with
// hack/test.sh. Without root or the binaries every test skips with the
// reason.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/cli"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/shim"
)

const (
	agentImage  = "docker.io/agentbox/agent:latest"
	probeImage  = "docker.io/agentbox/probe:latest"
	runtimeType = "io.containerd.agentbox.v1"
	handler     = "agentbox"
)

var (
	repoRoot string
	// skipReason is set when the environment cannot run the suite.
	skipReason string
	// dev is the private containerd all tests share.
	dev *daemon
)

// daemon is one private containerd started by hack/containerd.sh.
type daemon struct {
	dir  string
	sock string
}

func (d *daemon) runscRoot() string { return config.InstanceRunscRoot(d.sock) }

func (d *daemon) env() []string {
	return append(os.Environ(),
		"AGENTBOX_DEV="+d.dir,
		"CONTAINER_RUNTIME_ENDPOINT=unix://"+d.sock,
		"IMAGE_SERVICE_ENDPOINT=unix://"+d.sock,
	)
}

func startDaemon(dir string) (*daemon, error) {
	d := &daemon{dir: dir, sock: filepath.Join(dir, "containerd.sock")}
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "containerd.sh"), "start")
	cmd.Env = d.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("hack/containerd.sh start: %v\n%s", err, out)
	}
	return d, nil
}

func (d *daemon) stop() error {
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "containerd.sh"), "stop")
	cmd.Env = d.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("hack/containerd.sh stop: %v\n%s", err, out)
	}
	return os.RemoveAll(d.dir)
}

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	os.Setenv("PATH", filepath.Join(repoRoot, "_output", "bin")+":"+cacheDir()+"/bin:"+os.Getenv("PATH"))
	skipReason = environmentProblem()
	if skipReason != "" {
		fmt.Fprintf(os.Stderr, "e2e: skipping: %s\n", skipReason)
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "abx-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if os.Getenv("AGENTBOX_BENCH") == "1" {
		// The shims trace the phases of each Create and Start
		// (TestBenchmarkStartToExit prints them).
		os.Setenv(shim.PhaseTraceEnv, filepath.Join(dir, "phases.jsonl"))
	}
	dev, err = startDaemon(dir)
	if err == nil {
		err = startEgressServers(dev)
	}
	if err == nil {
		err = writeTestPolicies(dev)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		stopWebHost()
		if dev != nil {
			dev.stop()
		}
		os.Exit(1)
	}
	code := m.Run()
	if os.Getenv("AGENTBOX_BENCH") != "1" {
		if c := validateTrails(dir); c != 0 {
			code = c
		}
	}
	stopWebHost()
	if err := kubeDown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if err := dev.stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// secretValue is what the e2e-secret role injects from a node file.
const secretValue = "e2e-injected-secret-value"

// writeTestPolicies adds the roles the escape suite uses to the daemon's
// policy directory, next to the shipped ones (hack/containerd.sh copies
// policies/ there). The shim rereads the directory when it changes.
func writeTestPolicies(d *daemon) error {
	secret := filepath.Join(d.dir, "secret-token")
	if err := os.WriteFile(secret, []byte(secretValue+"\n"), 0o600); err != nil {
		return err
	}
	shared := filepath.Join(d.dir, "shared")
	if err := os.MkdirAll(shared, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(shared, "model.txt"), []byte("weights\n"), 0o644); err != nil {
		return err
	}
	rw := filepath.Join(d.dir, "rw")
	if err := os.MkdirAll(filepath.Join(rw, "sub"), 0o777); err != nil {
		return err
	}
	os.Chmod(rw, 0o777)
	if err := os.WriteFile(filepath.Join(rw, "sub", "data.txt"), []byte("rw-data\n"), 0o644); err != nil {
		return err
	}
	roles := fmt.Sprintf(`# Roles for the e2e suite (internal/e2e).
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-ns}
spec:
  inherits: baseline
  process: {allowSyscalls: [namespaces, mount, memfd]}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-rwvol}
spec:
  inherits: baseline
  filesystem: {hostMounts: [{path: %s, readOnly: false}]}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-boundary}
spec:
  role: e2e-ns
  subjects: [{containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-rwvol}
spec:
  role: e2e-rwvol
  subjects: [{containerdNamespace: default}, {namespace: "*"}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-narrow}
spec:
  inherits: baseline
  process:
    allowUsers: ["1000-1999"]
    allowGroups: ["1000-2999"]
    capabilities: [NET_BIND_SERVICE]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-narrow}
spec:
  role: e2e-narrow
  subjects: [{namespace: e2e-narrow}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-tight}
spec:
  inherits: baseline
  process: {maxProcesses: 16}
  limits: {memory: 256Mi, cpuTime: 2s, wallClock: 6s}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-bomb}
spec:
  # e2e-tight's process bound, with time for the bomb to grow under load.
  inherits: baseline
  process: {maxProcesses: 16}
  limits: {memory: 256Mi, cpuTime: 20s, wallClock: 30s}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-secret}
spec:
  inherits: baseline
  credentials:
    env: {allow: [PATH, "AGENT_*"]}
    secrets: [{env: API_TOKEN, file: %s}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-open}
spec:
  inherits: baseline
  network: {egress: open}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-volumes}
spec:
  inherits: baseline
  filesystem: {hostMounts: [{path: %s}]}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-unbound}
spec: {inherits: baseline}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-audit-off}
spec:
  inherits: baseline
  audit: {process: false, file: false, network: false}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-audit-off}
spec:
  role: e2e-audit-off
  subjects: [{containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-allow}
spec:
  inherits: baseline
  network:
    egress: allowlist
    allow: [{cidr: %s/32, ports: [%d, %d]}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-allow}
spec:
  role: e2e-allow
  subjects: [{namespace: e2e-allow}, {containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-dns}
spec:
  inherits: baseline
  network:
    egress: allowlist
    allow:
      # The test servers sit on the node's bridge: these rules opt in.
      - {host: %s, ports: [%d, %d], allowPrivate: true}
      - {host: "*.wild.e2e.test", ports: [%d], allowPrivate: true}
      - {host: %s, ports: [80]}
      - {host: %s, ports: [%d]}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-dns}
spec:
  role: e2e-dns
  subjects: [{namespace: e2e-dns}, {containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-gw}
spec:
  inherits: baseline
  credentials:
    env: {allow: [PATH, "AGENT_*"]}
  network:
    egress: allowlist
    allow:
      # The web host serves these and other.gw.e2e.test on one address.
      - {host: a.gw.e2e.test, ports: [80, 443]}
      - {host: b.gw.e2e.test, ports: [80, 443]}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-gw}
spec:
  role: e2e-gw
  subjects: [{namespace: e2e-gw}, {containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-gw-cidr}
spec:
  inherits: baseline
  credentials:
    env: {allow: [PATH, "AGENT_*"]}
  network:
    egress: allowlist
    # The web host by address: the benchmark's reference for the gateway.
    allow: [{cidr: 198.51.100.10/32, ports: [80, 443]}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-gw-cidr}
spec:
  role: e2e-gw-cidr
  subjects: [{namespace: e2e-gw-cidr}]
---
# Checkpoint and restore: e2e-cp-loose opens what e2e-cp does not (a
# restore under it of a checkpoint taken under e2e-cp is refused).
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-cp}
spec:
  inherits: baseline
  network:
    egress: allowlist
    allow: [{cidr: 198.51.100.10/32, ports: [80]}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-cp-loose}
spec:
  inherits: baseline
  network:
    egress: allowlist
    allow: [{cidr: 198.51.100.10/32, ports: [80, 443]}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-cp}
spec:
  role: e2e-cp
  subjects: [{namespace: e2e-cp}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-cp-loose}
spec:
  role: e2e-cp-loose
  subjects: [{namespace: e2e-cp}]
---
# A Python agent, and the same role starting from a template checkpoint
# of it (TestCheckpointTemplate makes e2e-py-warm under e2e-py).
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-py}
spec:
  inherits: baseline
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-py-warm}
spec:
  inherits: e2e-py
  template: e2e-py-warm
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-py}
spec:
  role: e2e-py
  subjects: [{namespace: e2e-py}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-py-warm}
spec:
  role: e2e-py-warm
  subjects: [{namespace: e2e-py-warm}]
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: e2e-masked}
spec:
  inherits: baseline
  filesystem: {maskedPaths: [/etc/passwd, /usr/local/bin]}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-masked}
spec:
  role: e2e-masked
  subjects: [{containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-ctr}
spec:
  role: e2e-tight
  subjects: [{containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-bomb}
spec:
  role: e2e-bomb
  subjects: [{containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-secret}
spec:
  role: e2e-secret
  subjects: [{containerdNamespace: default}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-open}
spec:
  role: e2e-open
  subjects: [{namespace: e2e-net}]
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: e2e-volumes}
spec:
  role: e2e-volumes
  subjects: [{namespace: "*"}]
`, rw, secret, shared, egress.gateway, egress.allowed.port, egress.sink.port, dnsAllowed, egress.allowed.port, egress.sink.port, egress.allowed.port, dnsRebind, dnsPrivate, egress.denied.port)
	if err := os.WriteFile(filepath.Join(d.dir, "agentbox", "policies", "zz-e2e.yaml"), []byte(roles), 0o644); err != nil {
		return err
	}
	echoSecretFile := filepath.Join(d.dir, "echo-secret-token")
	if err := os.WriteFile(echoSecretFile, []byte(echoSecret+"\n"), 0o600); err != nil {
		return err
	}
	// The Chromium policy a browsing agent's pod may mount: ECH off.
	if err := os.MkdirAll(filepath.Join(d.dir, "chromium-policy"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d.dir, "chromium-policy", "ech.json"), []byte(`{"EncryptedClientHelloEnabled": false}`+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d.dir, "agentbox", "policies", "zz-e2e-gw.yaml"),
		[]byte(fmt.Sprintf(inspectRoles, secret)+"---\n"+realClientRoles+"---\n"+fmt.Sprintf(edgesRoles, echoSecretFile, filepath.Join(d.dir, "chromium-policy"))+"---\n"+fmt.Sprintf(gatewayBenchRoles, echoSecretFile)), 0o644)
}

func cacheDir() string {
	if d := os.Getenv("AGENTBOX_CACHE"); d != "" {
		return d
	}
	return "/var/cache/agentbox"
}

func environmentProblem() string {
	if os.Geteuid() != 0 {
		return "needs root (containerd, runsc, mounts, network namespaces)"
	}
	for _, b := range []string{"containerd", "ctr", "crictl", "runsc", "containerd-shim-agentbox-v1", "containerd-shim-runc-v2"} {
		if _, err := exec.LookPath(b); err != nil {
			return b + " not found: run hack/setup.sh"
		}
	}
	if _, err := os.Stat(filepath.Join(cacheDir(), "images", "agent.tar")); err != nil {
		return "images not built: run hack/setup.sh"
	}
	return ""
}

func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// result is what a command produced.
type result struct {
	stdout, stderr string
	code           int
	timedOut       bool
}

func (r result) String() string {
	return fmt.Sprintf("exit %d (timed out: %v)\nstdout: %s\nstderr: %s", r.code, r.timedOut, clip(r.stdout), clip(r.stderr))
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

// run runs a command against d with a deadline.
func (d *daemon) run(timeout time.Duration, name string, args ...string) result {
	return runCommand(timeout, d.env(), nil, name, args...)
}

// runCommand runs a command with env and stdin (nil: none) and a deadline.
func runCommand(timeout time.Duration, env []string, stdin []byte, name string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.WaitDelay = 5 * time.Second
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.timedOut, r.code = true, -1
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		r.code, r.stderr = -1, r.stderr+err.Error()
	}
	return r
}

// ctr runs ctr against d in containerd namespace "default".
func (d *daemon) ctr(timeout time.Duration, args ...string) result {
	return d.run(timeout, "ctr", append([]string{"--address", d.sock}, args...)...)
}

// crictl runs crictl against d.
func (d *daemon) crictl(timeout time.Duration, args ...string) result {
	return d.run(timeout, "crictl", append([]string{"--timeout", "60s"}, args...)...)
}

// runAgent is `ctr run --rm` of the agent image under agentbox.
func (d *daemon) runAgent(t *testing.T, id string, extra []string, argv ...string) result {
	t.Helper()
	args := append([]string{"run", "--rm", "--runtime", runtimeType}, extra...)
	args = append(args, agentImage, id)
	return d.ctr(90*time.Second, append(args, argv...)...)
}

// removeContainer forcibly removes a ctr container and its task.
func (d *daemon) removeContainer(id string) {
	d.ctr(30*time.Second, "tasks", "kill", "-s", "KILL", id)
	d.ctr(30*time.Second, "tasks", "delete", "-f", id)
	d.ctr(30*time.Second, "containers", "delete", id)
}

var idSeq int

// uniqueID returns a container id unique within the run.
func uniqueID(prefix string) string {
	idSeq++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), idSeq)
}

// leaks lists what of d is still alive: shim and runsc processes, mounts
// under its directories, runsc container state, and network namespaces and
// container cgroups that were not there before.
func (d *daemon) leaks(netnsBefore, cgroupsBefore, socketsBefore map[string]bool) []string {
	var out []string
	for _, cmd := range cmdlines() {
		isShim := strings.Contains(cmd, "containerd-shim") && strings.Contains(cmd, d.sock)
		isRunsc := strings.HasPrefix(cmd, "runsc") && strings.Contains(cmd, d.runscRoot())
		if isShim || isRunsc {
			out = append(out, "process: "+clipLine(cmd))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		mp := f[1]
		inState := strings.HasPrefix(mp, filepath.Join(d.dir, "state")+"/")
		inRunsc := strings.HasPrefix(mp, d.runscRoot()+"/") && filepath.Base(mp) != "null-netns"
		if inState || inRunsc {
			out = append(out, "mount: "+mp)
		}
	}
	// runsc keeps one state file (and lock) per container under ROOT/NS.
	// null-netns is runsc's shared placeholder for containers without a
	// network namespace, not per-container state.
	state, _ := filepath.Glob(filepath.Join(d.runscRoot(), "*", "*"))
	for _, s := range state {
		if filepath.Base(s) != "null-netns" {
			out = append(out, "runsc state: "+s)
		}
	}
	for ns := range netnsSet() {
		if !netnsBefore[ns] {
			out = append(out, "netns: "+ns)
		}
	}
	for s := range socketSet() {
		if !socketsBefore[s] {
			out = append(out, "audit socket: "+s)
		}
	}
	for cg := range cgroupSet() {
		if !cgroupsBefore[cg] {
			out = append(out, "cgroup: "+cg)
		}
	}
	return out
}

// socketSet lists the audit and control sockets (shared by all daemons on
// the node).
func socketSet() map[string]bool {
	m := map[string]bool{}
	socks, _ := filepath.Glob("/run/agentbox/audit/*.sock")
	ctl, _ := filepath.Glob("/run/agentbox/control/*.sock")
	socks = append(socks, ctl...)
	for _, s := range socks {
		m[s] = true
	}
	return m
}

// cgroupSet lists the containerd-namespace cgroups of containers (the
// memory hierarchy stands for all of them).
func cgroupSet() map[string]bool {
	m := map[string]bool{}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/*/*/")
	for _, d := range dirs {
		if st, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil && !st.IsDir() {
			m[d] = true
		}
	}
	return m
}

// cmdlines returns the command lines of the processes running now, their
// arguments joined by spaces.
func cmdlines() []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func clipLine(s string) string {
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}

func netnsSet() map[string]bool {
	m := map[string]bool{}
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		m[e.Name()] = true
	}
	return m
}

// expectNoLeaks registers a cleanup, run after the test's own cleanups,
// that fails the test when anything of d outlives it.
func expectNoLeaks(t *testing.T, d *daemon) {
	t.Helper()
	before, cgBefore, sockBefore := netnsSet(), cgroupSet(), socketSet()
	t.Cleanup(func() {
		var left []string
		// Teardown is asynchronous in places (shim exit after delete).
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if left = d.leaks(before, cgBefore, sockBefore); len(left) == 0 {
				return
			}
		}
		t.Errorf("left behind after the test:\n  %s", strings.Join(left, "\n  "))
	})
}

// removeWithMounts removes dir and the mounts below it (runsc leaves its
// null-netns placeholder in its root), failing the test if anything stays.
func removeWithMounts(t *testing.T, dir string) {
	t.Helper()
	if err := mountguard.RemoveAll(dir); err != nil {
		t.Errorf("remove %s: %v", dir, err)
	}
}

// validateTrails checks every record of every trail the suite produced
// (each directory named audit under the suite's own) against the OCSF
// schema, and prints the count: the conformance figure of the run.
func validateTrails(dir string) int {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "audit" {
			dirs = append(dirs, p)
		}
		return nil
	})
	if kd := kubeAuditDir(); kd != "" {
		dirs = append(dirs, kd)
	}
	var res cli.ValidateResult
	if len(dirs) > 0 {
		var err error
		if res, err = cli.ValidateTrails(dirs...); err != nil && !strings.Contains(err.Error(), "no *.jsonl trail") {
			fmt.Fprintln(os.Stderr, "e2e: OCSF conformance:", err)
			return 1
		}
	}
	for _, p := range res.Problems {
		fmt.Fprintln(os.Stderr, "e2e: OCSF:", p)
	}
	ocsfMu.Lock()
	records, trails := res.Records+ocsfRecords, res.Trails+ocsfTrails
	ocsfMu.Unlock()
	fmt.Fprintf(os.Stderr, "e2e: OCSF conformance: %d of %d records in %d trails conform to OCSF %s (the suite's daemon and node, and the tests' own audit directories)\n",
		records-res.Bad, records, trails, audit.SchemaVersion)
	if res.Bad > 0 {
		return 1
	}
	return 0
}

var (
	ocsfMu                  sync.Mutex
	ocsfRecords, ocsfTrails int
)

// checkOCSF validates the trails of a test's own audit directory (gone
// when the test ends) and adds them to the suite's count.
func checkOCSF(t *testing.T, dirs ...string) {
	t.Helper()
	res, err := cli.ValidateTrails(dirs...)
	if err != nil {
		t.Fatalf("OCSF conformance of %v: %v", dirs, err)
	}
	for _, p := range res.Problems {
		t.Errorf("OCSF: %s", p)
	}
	ocsfMu.Lock()
	ocsfRecords += res.Records
	ocsfTrails += res.Trails
	ocsfMu.Unlock()
}
