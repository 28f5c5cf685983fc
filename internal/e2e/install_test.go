//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/config"
)

// TestInstallOnANode installs agentbox the way a node gets it
// (`agentbox install` into a root with a containerd config of its own),
// starts containerd from that config, runs a container under the installed
// handler, checks it with doctor, and uninstalls, leaving the containerd
// config as it was: with the pinned containerd 2.4 and an older 2.2
// (config version 3), and 1.7 (version 2, whose CRI plugin also needs its
// runc entry).
func TestInstallOnANode(t *testing.T) {
	requireEnv(t)
	t.Run("containerd-2.4", func(t *testing.T) { installAndRun(t, "containerd", 3) })
	for _, v := range []struct {
		name, glob string
		version    int
	}{{"containerd-2.2", "containerd-v2.2.*", 3}, {"containerd-1.7", "containerd-v1.7.*", 2}} {
		t.Run(v.name, func(t *testing.T) {
			bins, _ := filepath.Glob(filepath.Join(cacheDir(), "bin", v.glob))
			if len(bins) == 0 {
				t.Skipf("%s not built: run hack/setup.sh", v.name)
			}
			installAndRun(t, bins[0], v.version)
		})
	}
}

func installAndRun(t *testing.T, containerd string, version int) {
	root, err := os.MkdirTemp("", "abx-inst-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeWithMounts(t, root) })
	sock := filepath.Join(root, "c.sock")
	mainCfg := filepath.Join(root, "etc/containerd/config.toml")
	// Its own NRI socket: the default one is the machine's (the private
	// e2e containerd's is its own too).
	original := fmt.Sprintf("version = %d\nroot = %q\nstate = %q\n\n[grpc]\n  address = %q\n\n[ttrpc]\n  address = %q\n\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = %q\n",
		version, filepath.Join(root, "var/lib/containerd"), filepath.Join(root, "run/containerd"), sock, sock+".ttrpc", filepath.Join(root, "nri.sock"))
	if version == 2 {
		original += "\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	}
	os.MkdirAll(filepath.Dir(mainCfg), 0o755)
	if err := os.WriteFile(mainCfg, []byte(original), 0o644); err != nil {
		t.Fatal(err)
	}
	agentbox := filepath.Join(repoRoot, "_output", "bin", "agentbox")
	args := []string{"install", "--root", root, "--shim", filepath.Join(repoRoot, "_output", "bin", "containerd-shim-agentbox-v1"), "--runsc", filepath.Join(cacheDir(), "bin", "runsc")}
	in := dev.run(60*time.Second, agentbox, args...)
	// containerd 2.x takes a drop-in; 1.7 gets the handler in its main
	// file (it would replace its whole CRI section with a drop-in's).
	dropIn := strings.Contains(in.stdout, "created    "+filepath.Join(root, "etc/containerd/conf.d/agentbox.toml"))
	if in.code != 0 || dropIn != (version == 3) || !strings.Contains(in.stdout, "updated    "+mainCfg) {
		t.Fatalf("install: %v", in)
	}
	if again := dev.run(60*time.Second, agentbox, args...); again.code != 0 || strings.Contains(again.stdout, "created") || strings.Contains(again.stdout, "updated") {
		t.Fatalf("a second install must change nothing: %v", again)
	}

	// containerd from the installed config, with the installed binaries
	// first on its PATH.
	env := append(os.Environ(), "PATH="+filepath.Join(root, "usr/local/bin")+":"+os.Getenv("PATH"))
	cd := exec.Command(containerd, "--config", mainCfg)
	cd.Env = env
	logf, _ := os.Create(filepath.Join(root, "containerd.log"))
	cd.Stdout, cd.Stderr = logf, logf
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cd.Process.Kill()
		cd.Wait()
		logf.Close()
		removeWithMounts(t, config.InstanceRunscRoot(sock))
	})
	ctr := func(timeout time.Duration, a ...string) result {
		return dev.run(timeout, "ctr", append([]string{"--address", sock}, a...)...)
	}
	for i := 0; i < 100 && ctr(5*time.Second, "version").code != 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if r := ctr(60*time.Second, "images", "import", "--index-name", agentImage, filepath.Join(cacheDir(), "images", "agent.tar")); r.code != 0 {
		t.Fatalf("import: %v", r)
	}
	id := uniqueID("installed")
	// ctr names the installed config itself (the CRI handler's drop-in
	// names it for pods; doctor checks that handler below).
	r := ctr(90*time.Second, "run", "--rm", "--runtime", runtimeType, "--runtime-config-path", filepath.Join(root, "etc/agentbox/config.toml"),
		agentImage, id, "sh", "-c", "dmesg | head -1; echo installed-runs")
	if r.code != 0 || !strings.Contains(r.stdout, "installed-runs") || !strings.Contains(r.stdout, "gVisor") {
		b, _ := os.ReadFile(filepath.Join(root, "containerd.log"))
		t.Fatalf("a container under the installed handler: %v\n%s", r, clip(string(b)))
	}
	if _, err := os.Stat(filepath.Join(root, "var/log/agentbox/audit", id+".jsonl")); err != nil {
		t.Errorf("the installed config's audit trail: %v", err)
	}
	doc := exec.Command(agentbox, "doctor", "--address", sock, "--config", filepath.Join(root, "etc/agentbox/config.toml"))
	doc.Env = env
	out, _ := doc.CombinedOutput()
	for _, want := range []string{"PASS  runsc", "PASS  seccomp", "PASS  shim", `runtime handler "agentbox" registered`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}

	un := dev.run(60*time.Second, agentbox, "uninstall", "--root", root)
	if un.code != 0 {
		t.Fatalf("uninstall: %v", un)
	}
	if b, _ := os.ReadFile(mainCfg); string(b) != original {
		t.Fatalf("uninstall must restore containerd's config:\n%s", b)
	}
	for _, p := range []string{"usr/local/bin/runsc", "usr/local/bin/containerd-shim-agentbox-v1", "etc/containerd/conf.d/agentbox.toml", "etc/agentbox/config.toml"} {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall", p)
		}
	}
}
