//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	// specs are the sandbox's spec and the container's; flags runsc's
	// global flags (--root aside).
	specs [2]map[string]any
	flags []string
	mu    sync.Mutex
	ids   []string
}

func newRunscAlone(t *testing.T) *runscAlone { return newRunscOn(t, false) }

// newRunscOn is runscAlone on a writable mount of the image when rw (its
// spec may still say read-only: gVisor enforces that): runsc's gofer makes
// a bind mount's missing mount point in the rootfs, as a CRI pod's
// snapshot lets it.
func newRunscOn(t *testing.T, rw bool) *runscAlone {
	t.Helper()
	dir := t.TempDir()
	r := &runscAlone{t: t, bin: filepath.Join(cacheDir(), "bin", "runsc"), root: filepath.Join(dir, "root"), rootfs: filepath.Join(dir, "rootfs"),
		flags: []string{"--network=none"}}
	if err := os.MkdirAll(r.rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	mount := []string{"images", "mount", agentImage, r.rootfs}
	if rw {
		mount = []string{"images", "mount", "--rw", agentImage, r.rootfs}
	}
	if res := dev.ctr(2*time.Minute, mount...); res.code != 0 {
		t.Fatalf("mounting the agent image's rootfs: %v", res)
	}
	t.Cleanup(func() {
		r.remove()
		dev.ctr(time.Minute, "images", "unmount", "--rm", r.rootfs)
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
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	spec["root"] = map[string]any{"readonly": true}
	r.specs = [2]map[string]any{spec, spec}
	return r
}

// bundle writes a bundle for a sandbox (container == "") or a container
// in it, as containerd's CRI annotates them.
func (r *runscAlone) bundle(dir, sandbox, container string) error {
	from, id := r.specs[0], sandbox
	if container != "" {
		from, id = r.specs[1], container
	}
	spec := map[string]any{}
	for k, v := range from {
		spec[k] = v
	}
	ann := map[string]any{}
	if a, ok := from["annotations"].(map[string]any); ok {
		maps.Copy(ann, a)
	}
	ann["io.kubernetes.cri.container-type"], ann["io.kubernetes.cri.sandbox-id"] = "sandbox", sandbox
	if container != "" {
		ann["io.kubernetes.cri.container-type"] = "container"
	}
	spec["annotations"] = ann
	root := maps.Clone(from["root"].(map[string]any))
	root["path"] = r.rootfs
	spec["root"] = root
	if l, ok := from["linux"].(map[string]any); ok {
		// Each its own cgroup, beside the pod's.
		if p, ok := l["cgroupsPath"].(string); ok && p != "" {
			l = maps.Clone(l)
			l["cgroupsPath"] = filepath.Join(filepath.Dir(p), id)
			spec["linux"] = l
		}
	}
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
	cmd := exec.CommandContext(ctx, r.bin, slices.Concat([]string{"--root", r.root}, r.flags, args)...)
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
		if out, err := exec.Command(r.bin, slices.Concat([]string{"--root", r.root}, r.flags, []string{"delete", "--force", id})...).CombinedOutput(); err != nil {
			r.t.Errorf("runsc delete --force %s: %v: %s", id, err, clip(string(out)))
		}
	}
}
