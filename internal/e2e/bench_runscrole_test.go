//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/BurntSushi/toml"
)

// runscAsAgentbox names runsc alone running what agentbox asks of it for a
// baseline pod (newRunscAsAgentbox) among the CRI variants.
var runscAsAgentbox = criVariant{name: "runsc alone, agentbox's specs"}

// newRunscAsAgentbox is runscAlone running what agentbox asks of runsc for
// a baseline pod: the sandbox's and the container's specs as the shim wrote
// them for a real CRI pod, and the runsc flags it chose. What bound them to
// that pod is replaced: the rootfs (the agent image's, as runscAlone's, but
// writable beneath gVisor as a pod's snapshot is), the network namespace
// (none: runsc makes an empty one), the cgroups (one each beside the pod's)
// and the ids; the files CRI bound in (hosts, hostname, resolv.conf) are
// copied and its shm directory is an empty one.
// The audit session is left out (--pod-init-config names the shim's
// receiver; docs/benchmarks-history.md measured it at no cost to runsc).
// Beside runscAlone it is what the role costs runsc itself; beside a CRI
// pod's runsc phases, what containerd and the shim around it cost.
func newRunscAsAgentbox(t *testing.T) *runscAlone {
	t.Helper()
	r := newRunscOn(t, true)
	p, _, err := criPod(criVariants[0], "runsc-specs", sleeper)
	defer func() {
		if _, err := removePod(p); err != nil {
			t.Errorf("removing the pod whose specs were taken: %v", err)
		}
	}()
	if err != nil {
		t.Fatalf("a baseline pod for its specs: %v", err)
	}
	state := filepath.Join(dev.dir, "state", "io.containerd.runtime.v2.task", "k8s.io")
	for i, id := range []string{p.id, p.containers[0]} {
		b, err := os.ReadFile(filepath.Join(state, id, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var spec map[string]any
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		if err := detachSpec(spec, filepath.Join(filepath.Dir(r.root), "pod-files", strconv.Itoa(i))); err != nil {
			t.Fatalf("%s's spec: %v", id, err)
		}
		r.specs[i] = spec
	}
	var opts struct {
		RunscConfig map[string]string `toml:"runsc_config"`
	}
	if _, err := toml.DecodeFile(filepath.Join(state, p.id, "agentbox-runsc.toml"), &opts); err != nil {
		t.Fatalf("the shim's runsc options: %v", err)
	}
	if opts.RunscConfig["pod-init-config"] == "" {
		t.Fatalf("the shim's runsc options have no audit session: not the flags a sandbox runs with: %v", opts.RunscConfig)
	}
	delete(opts.RunscConfig, "pod-init-config")
	// No network namespace of the pod's: the shim's own choice for one
	// without (shim/create.go).
	opts.RunscConfig["network"] = "none"
	r.flags = nil
	for k, v := range opts.RunscConfig {
		r.flags = append(r.flags, "--"+k+"="+v)
	}
	slices.Sort(r.flags)
	t.Logf("runsc alone with agentbox's specs: flags %v", r.flags)
	return r
}

// detachSpec replaces what binds spec to its pod's files and network
// namespace: each bind mount's source is a copy in dir (a file) or an
// empty directory there. A source the shim staged (internal/mountguard)
// is gone once its container started: it is made empty, a directory for
// /dev/shm and a file otherwise (CRI binds files at /etc/hosts,
// /etc/hostname and /etc/resolv.conf).
func detachSpec(spec map[string]any, dir string) error {
	if l, ok := spec["linux"].(map[string]any); ok {
		if nss, ok := l["namespaces"].([]any); ok {
			for _, ns := range nss {
				if m, ok := ns.(map[string]any); ok && m["type"] == "network" {
					delete(m, "path")
				}
			}
		}
	}
	mounts, _ := spec["mounts"].([]any)
	for i, x := range mounts {
		m, ok := x.(map[string]any)
		if !ok || !isBind(m) {
			continue
		}
		src, _ := m["source"].(string)
		var content []byte
		isDir := m["destination"] == "/dev/shm"
		st, err := os.Stat(src)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("mount %v: %w", m["destination"], err)
		case st.IsDir():
			isDir = true
		default:
			isDir = false
			if content, err = os.ReadFile(src); err != nil {
				return err
			}
		}
		dst := filepath.Join(dir, strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if isDir {
			err = os.Mkdir(dst, 0o755)
		} else {
			err = os.WriteFile(dst, content, 0o644)
		}
		if err != nil {
			return err
		}
		m["source"] = dst
	}
	return nil
}

func isBind(m map[string]any) bool {
	if m["type"] == "bind" {
		return true
	}
	opts, _ := m["options"].([]any)
	return slices.Contains(opts, any("bind")) || slices.Contains(opts, any("rbind"))
}
