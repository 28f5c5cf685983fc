//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// releaseVersions are the two releases TestKubeRelease builds: an install,
// then an upgrade.
var releaseVersions = [2]string{"0.0.1-e2e", "0.0.2-e2e"}

// buildRelease runs make release's script for version into a directory of
// its own, and returns it.
func buildRelease(t *testing.T, version string) string {
	t.Helper()
	dir := filepath.Join(repoRoot, "_output", "release-e2e", version)
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "release.sh"), version)
	cmd.Env = append(os.Environ(), "RELEASE_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh %s: %v\n%s", version, err, clip(string(out)))
	}
	return dir
}

// installerPods are the installer DaemonSet's pods.
func (k *kubeNode) installerPods(t *testing.T) []string {
	t.Helper()
	out := k.mustKubectl(t, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=agentbox-installer", "-o", "name")
	return strings.Fields(out)
}

// uninstallNode runs docs/install.md's uninstall on every node: agentbox
// uninstall for each handler, in the installer's pods.
func (k *kubeNode) uninstallNode(t *testing.T) {
	t.Helper()
	for _, p := range k.installerPods(t) {
		for _, h := range []string{"agentbox", "agentbox-coder"} {
			k.mustKubectl(t, "-n", "kube-system", "exec", p, "-c", "sync", "--", "agentbox", "uninstall", "--host-root", "/host", "--handler", h)
		}
	}
}

// runscNullNetns is the one mount runsc keeps in its root once it has run
// a sandbox: its placeholder network namespace. It outlives agentbox's
// uninstall (the installer's pod cannot unmount in the node's namespace);
// docs/install.md says so.
const runscNullNetns = "/null-netns"

// nodeFiles is what agentbox's install touches on the node: every file
// under /usr/local/bin, /etc/agentbox and /etc/containerd, with its
// SHA-256, and the node's mounts (runsc's placeholder namespace aside),
// once no pod is left on it.
func nodeFiles(t *testing.T, k *kubeNode) []string {
	t.Helper()
	if !eventually(t, 120*time.Second, func() bool {
		r := k.run(10*time.Second, nil, "crictl", "pods", "-q")
		return r.code == 0 && strings.TrimSpace(r.stdout) == ""
	}) {
		t.Fatalf("pods left on the node: %s", k.run(10*time.Second, nil, "crictl", "pods"))
	}
	out, err := exec.Command(filepath.Join(repoRoot, "hack", "kube.sh"), "node", "sh", "-c",
		"find /usr/local/bin /etc/agentbox /etc/containerd -type f 2>/dev/null | sort | xargs -r sha256sum; findmnt -rn -o TARGET | grep -v '^/proc' | sort").CombinedOutput()
	if err != nil {
		t.Fatalf("the node's files: %v\n%s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(l, "/run/agentbox/runsc/") && strings.HasSuffix(l, runscNullNetns) {
			continue
		}
		lines = append(lines, l)
	}
	sort.Strings(lines)
	return lines
}

// restartContainerd restarts node 1's containerd and waits for its
// handlers: with agentbox's when want is true, without when false.
func (k *kubeNode) restartContainerd(t *testing.T, want bool) {
	t.Helper()
	if err := kubeScript(filepath.Join(repoRoot, "_output", "kube-release.log"), "restart-containerd"); err != nil {
		t.Fatalf("restarting containerd: %v", err)
	}
	if !eventually(t, 60*time.Second, func() bool {
		r := k.run(10*time.Second, nil, "crictl", "info")
		return r.code == 0 && strings.Contains(r.stdout, "agentbox-coder") == want
	}) {
		t.Fatalf("containerd's handlers after the restart: agentbox's present %v, want %v", !want, want)
	}
}

// applyRelease applies a release's manifest and imports its installer
// image, as hack/kube.sh release-apply does for this cluster, and waits
// for the DaemonSet.
func (k *kubeNode) applyRelease(t *testing.T, dir, version string) {
	t.Helper()
	img := "docker.io/agentbox/installer:" + version
	if err := kubeScript(filepath.Join(repoRoot, "_output", "kube-release.log"), "release-apply",
		filepath.Join(dir, "agentbox.yaml"), filepath.Join(dir, "agentbox-installer-"+version+".oci.tar"), img); err != nil {
		t.Fatalf("applying release %s: %v (log _output/kube-release.log)", version, err)
	}
	if r := k.kubectl("-n", "kube-system", "rollout", "status", "daemonset/agentbox-installer", "--timeout=180s"); r.code != 0 {
		t.Fatalf("release %s's installer did not roll out: %v", version, r)
	}
	got := k.mustKubectl(t, "-n", "kube-system", "get", "daemonset", "agentbox-installer", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if got != img {
		t.Fatalf("the installer runs %s, want %s", got, img)
	}
}

// nodeVersion is what the agentbox CLI the installer put on the node says.
func nodeVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot, "hack", "kube.sh"), "node", "/usr/local/bin/agentbox", "version").CombinedOutput()
	if err != nil {
		t.Fatalf("agentbox version on the node: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestKubeRelease (issue 48): a release as a platform team installs it, on
// the hack/kube.sh cluster. Two releases are built by make release's
// script. The source tree's install is uninstalled first, and what the
// node holds then is the clean state. Release 1 is installed from its
// manifest and installer image alone, and an agent runs. Release 2 is
// applied while that agent runs: the agent keeps running under the shim
// it started with and answers an exec; a new agent runs under release 2's.
// Then docs/install.md's uninstall leaves the node as clean as it was, and
// the CRDs gone. It runs on its own (hack/e2e.sh runs it after the suite):
// it leaves the cluster without agentbox, and the suite takes it down.
func TestKubeRelease(t *testing.T) {
	k := kubeCluster(t)
	r1, r2 := buildRelease(t, releaseVersions[0]), buildRelease(t, releaseVersions[1])

	// The node as it is without agentbox.
	k.uninstallNode(t)
	k.mustKubectl(t, "-n", "kube-system", "delete", "daemonset", "agentbox-installer", "--wait=true", "--timeout=120s")
	k.restartContainerd(t, false)
	clean := nodeFiles(t, k)
	for _, l := range clean {
		for _, f := range []string{"/usr/local/bin/containerd-shim-agentbox-v1", "/usr/local/bin/runsc", "/usr/local/bin/agentbox", "/etc/agentbox/config.toml", "/etc/containerd/conf.d/agentbox"} {
			if strings.Contains(l, f) {
				t.Fatalf("after the source tree's uninstall, the node still holds %s", l)
			}
		}
	}

	// Release 1, from its artifacts alone.
	k.applyRelease(t, r1, releaseVersions[0])
	k.restartContainerd(t, true)
	if v := nodeVersion(t); !strings.Contains(v, releaseVersions[0]) {
		t.Fatalf("the node's agentbox says %q, want %s", v, releaseVersions[0])
	}
	ns := k.namespace(t, "abx-release")
	k.apply(t, podSpec(ns, "agent-1", "agentbox", "baseline", "sh", "-c", "echo agent-1 up; sleep 3600"))
	k.waitPod(t, ns, "agent-1", 3*time.Minute, "Running", running)
	k.waitLogs(t, ns, "agent-1", "agent-1 up", 30*time.Second)

	// Release 2 while agent-1 runs.
	k.applyRelease(t, r2, releaseVersions[1])
	if v := nodeVersion(t); !strings.Contains(v, releaseVersions[1]) {
		t.Fatalf("after the upgrade, the node's agentbox says %q, want %s", v, releaseVersions[1])
	}
	if p := k.pod(t, ns, "agent-1"); !running(p) {
		t.Fatalf("the agent running through the upgrade is %s", p.Status.Phase)
	}
	if ex := k.kubectl("-n", ns, "exec", "agent-1", "--", "sh", "-c", "echo still-here"); ex.code != 0 || ex.stdout != "still-here\n" {
		t.Fatalf("exec in the agent running through the upgrade: %v", ex)
	}
	k.apply(t, podSpec(ns, "agent-2", "agentbox", "baseline", "sh", "-c", "echo agent-2 up; sleep 3600"))
	k.waitPod(t, ns, "agent-2", 3*time.Minute, "Running", running)
	k.waitLogs(t, ns, "agent-2", "agent-2 up", 30*time.Second)
	// Each sandbox's shim is the binary it was started from: agent-1's the
	// release 1 file the upgrade replaced, agent-2's release 2's.
	shims, err := exec.Command(filepath.Join(repoRoot, "hack", "kube.sh"), "node", "sh", "-c",
		`for p in $(pgrep -f containerd-shim-agentbox-v1); do readlink /proc/$p/exe; done`).CombinedOutput()
	if err != nil || !strings.Contains(string(shims), "(deleted)") || strings.Count(string(shims), "containerd-shim-agentbox-v1") < 2 {
		t.Errorf("the shims' binaries: %q (%v), want release 1's replaced file and release 2's", shims, err)
	}
	k.mustKubectl(t, "-n", ns, "delete", "pod", "agent-1", "agent-2", "--wait=true", "--timeout=120s")

	// docs/install.md's uninstall: nothing left.
	k.uninstallNode(t)
	k.mustKubectl(t, "delete", "-f", filepath.Join(r2, "agentbox.yaml"), "--wait=true", "--timeout=180s", "--ignore-not-found")
	k.restartContainerd(t, false)
	after := nodeFiles(t, k)
	if strings.Join(after, "\n") != strings.Join(clean, "\n") {
		t.Errorf("the node after the release's uninstall differs from before its install:\nbefore:\n%s\nafter:\n%s", strings.Join(clean, "\n"), strings.Join(after, "\n"))
	}
	for _, crd := range []string{"agentroles.agentbox.dev", "agentrolebindings.agentbox.dev", "agentnodepolicies.agentbox.dev", "agentquarantines.agentbox.dev"} {
		if r := k.kubectl("get", "crd", crd); r.code == 0 {
			t.Errorf("CRD %s left after the uninstall", crd)
		}
	}
	if r := k.kubectl("get", "runtimeclass", "agentbox"); r.code == 0 {
		t.Error("the agentbox RuntimeClass left after the uninstall")
	}
}
