//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// runscAlone runs what a CRI pod asks of runsc with nothing around it (no
// containerd, no shim): a sandbox and one container in it, each `runsc
// create` then `runsc start`, on the agent image's rootfs. It is the floor
// a pod start through any shim stands on. Unlike a CRI pod it has no
// network namespace to read (--network=none).
type runscAlone struct {
	t      *testing.T
	bin    string
	root   string
	rootfs string
	spec   map[string]any
	mu     sync.Mutex
	ids    []string
}

func newRunscAlone(t *testing.T) *runscAlone {
	t.Helper()
	dir := t.TempDir()
	r := &runscAlone{t: t, bin: filepath.Join(cacheDir(), "bin", "runsc"), root: filepath.Join(dir, "root"), rootfs: filepath.Join(dir, "rootfs")}
	if err := os.MkdirAll(r.rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if res := dev.ctr(2*time.Minute, "images", "mount", agentImage, r.rootfs); res.code != 0 {
		t.Fatalf("mounting the agent image's rootfs: %v", res)
	}
	t.Cleanup(func() {
		r.remove()
		dev.ctr(time.Minute, "images", "unmount", r.rootfs)
		// runsc pins its placeholder network namespace in its root, a
		// bind mount that outlives the sandboxes (stacked if two runsc
		// pinned it at once).
		for unix.Unmount(filepath.Join(r.root, "null-netns"), unix.MNT_DETACH) == nil {
		}
	})
	specDir := filepath.Join(dir, "spec")
	os.MkdirAll(specDir, 0o755)
	if out, err := exec.Command(r.bin, "spec", "--bundle", specDir, "--", "sleep", "3600").CombinedOutput(); err != nil {
		t.Fatalf("runsc spec: %v %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(specDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &r.spec); err != nil {
		t.Fatal(err)
	}
	r.spec["root"] = map[string]any{"path": r.rootfs, "readonly": true}
	return r
}

// bundle writes a bundle for a sandbox (container == "") or a container
// in it, as containerd's CRI annotates them.
func (r *runscAlone) bundle(dir, sandbox, container string) error {
	ann := map[string]any{"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": sandbox}
	if container != "" {
		ann["io.kubernetes.cri.container-type"] = "container"
	}
	spec := map[string]any{}
	for k, v := range r.spec {
		spec[k] = v
	}
	spec["annotations"] = ann
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

// runsc runs one runsc command, its output to a file (a sandbox holds a
// pipe open for as long as it runs).
func (r *runscAlone) runsc(dir string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	log, err := os.Create(filepath.Join(dir, "runsc.out"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, r.bin, append([]string{"--root", r.root, "--network", "none"}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(log.Name())
		return fmt.Errorf("runsc %v: %v: %s", args, err, clip(string(out)))
	}
	return nil
}

// pod starts a sandbox and a container in it, timed as the CRI's calls
// are: the sandbox's create and start (RunPodSandbox's share), the
// container's create, its start.
func (r *runscAlone) pod(name string) ([3]time.Duration, error) {
	var calls [3]time.Duration
	// runsc takes an id that begins another as ambiguous (it matches
	// ids by prefix): neither id begins another.
	base := uniqueID("runsc-" + name)
	id, cid := base+".s", base+".c"
	dir := filepath.Join(filepath.Dir(r.root), base)
	if err := r.bundle(filepath.Join(dir, "s"), id, ""); err != nil {
		return calls, err
	}
	if err := r.bundle(filepath.Join(dir, "c"), id, cid); err != nil {
		return calls, err
	}
	r.mu.Lock()
	r.ids = append(r.ids, cid, id) // deleted in this order
	r.mu.Unlock()
	for i, steps := range [][][]string{
		{{"create", "--bundle", filepath.Join(dir, "s"), id}, {"start", id}},
		{{"create", "--bundle", filepath.Join(dir, "c"), cid}},
		{{"start", cid}},
	} {
		start := time.Now()
		for _, step := range steps {
			if err := r.runsc(dir, step...); err != nil {
				return calls, err
			}
		}
		calls[i] = time.Since(start)
	}
	return calls, nil
}

// remove deletes every pod started so far, each container before its
// sandbox; one that remains fails the test (its processes would weigh on
// every benchmark after it).
func (r *runscAlone) remove() {
	r.mu.Lock()
	ids := r.ids
	r.ids = nil
	r.mu.Unlock()
	for _, id := range ids {
		if out, err := exec.Command(r.bin, "--root", r.root, "delete", "--force", id).CombinedOutput(); err != nil {
			r.t.Errorf("runsc delete --force %s: %v: %s", id, err, clip(string(out)))
		}
	}
}
