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
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/config"
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
	if os.Getenv("AGENTBOX_E2E_KEEP") == "1" {
		// Its logs, to read after the run (the daemon's directory goes).
		kept := d.dir + "-logs"
		if out, err := exec.Command("cp", "-a", filepath.Join(d.dir, "logs"), kept).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: keeping the logs: %v: %s\n", err, out)
		} else {
			fmt.Fprintf(os.Stderr, "e2e: logs kept in %s (AGENTBOX_E2E_KEEP=1)\n", kept)
		}
	}
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
		// containerd's CRI timers (TestBenchmarkCRIPhases reads them).
		if addr, err := freeLoopbackAddr(); err == nil {
			os.Setenv("AGENTBOX_METRICS_ADDRESS", addr)
			containerdMetrics = "http://" + addr + "/v1/metrics"
		}
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
	roles, err := renderRoles(roleFields{RW: rw, Secret: secret, Shared: shared, Gateway: egress.gateway,
		AllowedPort: egress.allowed.port, SinkPort: egress.sink.port, DeniedPort: egress.denied.port,
		DNSAllowed: dnsAllowed, DNSRebind: dnsRebind, DNSPrivate: dnsPrivate,
		EchoSecretFile: filepath.Join(d.dir, "echo-secret-token"), ChromiumPolicy: filepath.Join(d.dir, "chromium-policy")})
	if err != nil {
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
	for name, b := range roles {
		// zz-e2e.yaml, zz-e2e-inspect.yaml...: after the shipped roles.
		file := "zz-e2e-" + name
		if name == "e2e.yaml" {
			file = "zz-e2e.yaml"
		}
		if err := os.WriteFile(filepath.Join(d.dir, "agentbox", "policies", file), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// The e2e suite's roles are templates (testdata/roles/*.yaml): text/template
// over roleFields, the daemon's paths and the test servers.
//
//go:embed testdata/roles/*.yaml
var roleTemplates embed.FS

// roleFields are what the role templates name ({{.Field}}).
type roleFields struct {
	// RW, Shared: host directories pods mount; Secret, EchoSecretFile:
	// node files of injected secrets; ChromiumPolicy: a directory a
	// browsing pod may mount.
	RW, Shared, Secret, EchoSecretFile, ChromiumPolicy string
	// Gateway is the test web host's address; the ports its servers'.
	Gateway                           string
	AllowedPort, SinkPort, DeniedPort int
	// The test resolver's names: allowed, rebinding to the metadata
	// address, and private.
	DNSAllowed, DNSRebind, DNSPrivate string
}

// renderRoles fills every role template; a field a template names that
// roleFields lacks is an error, not an empty string.
func renderRoles(f roleFields) (map[string][]byte, error) {
	files, err := fs.Glob(roleTemplates, "testdata/roles/*.yaml")
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("role templates: %v (%d)", err, len(files))
	}
	out := map[string][]byte{}
	for _, file := range files {
		tmpl, err := template.New(path.Base(file)).Option("missingkey=error").ParseFS(roleTemplates, file)
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := tmpl.Execute(&b, f); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		out[path.Base(file)] = b.Bytes()
	}
	return out, nil
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

var (
	ocsfMu                  sync.Mutex
	ocsfRecords, ocsfTrails int
)

// eventually calls cond every 200ms until it returns true or timeout has
// passed, and says whether it did; the caller says what did not happen.
// (A poll, not a timing: nothing asserts how soon.)
func eventually(t testing.TB, timeout time.Duration, cond func() bool) bool {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
