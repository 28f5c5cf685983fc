// Package install puts agentbox on a node the way runtimes are installed
// there (kata-deploy, gVisor's containerd installer): the shim and a static
// runsc on containerd's PATH, agentbox's config and the shipped policies
// where absent, and the runtime handler as a containerd drop-in that the
// main config imports. It is idempotent, says what it changed, can dry-run,
// and Uninstall reverses exactly what Install did (a manifest records it).
package install

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/policies"
	runscconfig "agentbox.dev/agentbox/runsc-config"
)

// Options say where and what to install.
type Options struct {
	// Root prefixes every path written ("/" on a node; a directory in
	// tests and image builds).
	Root string
	// HostRoot says Root is where the node's root filesystem is mounted
	// (an installer pod's hostPath /): the configs written name the files
	// as the node sees them, without Root. Otherwise they name them below
	// Root.
	HostRoot bool
	// ContainerdConfig is containerd's main config, below Root.
	ContainerdConfig string
	// Shim and Runsc are the binaries to install; CLI, when set, the
	// agentbox CLI (doctor, policy, audit and uninstall on the node).
	Shim, Runsc, CLI string
	// Handler is the CRI runtime handler (the RuntimeClass's handler).
	Handler string
	DryRun  bool
	// layout is the node's distribution (DetectLayout), when ContainerdConfig
	// was not named.
	layout Layout
}

// Layout is where a Kubernetes distribution keeps containerd's config,
// root and state and the kubelet's root.
type Layout struct {
	// Name is "containerd" (the paths containerd and the kubelet default
	// to), "k3s" or "rke2".
	Name string
	// ContainerdConfig is the file the handler is registered in: for k3s
	// and RKE2 the template they generate containerd's config.toml from
	// at every start (an edit to config.toml itself would be lost).
	ContainerdConfig string
	// Template: ContainerdConfig is such a template, extending their
	// base template ({{ template "base" . }}).
	Template bool
	// Version is the containerd config version it produces (2: containerd
	// 1.7, 3: containerd 2.x).
	Version                                      int
	ContainerdRoot, ContainerdState, KubeletRoot string
}

// DetectLayout says which distribution's layout the node under root has:
// k3s or RKE2 by their agent directories, else containerd's defaults.
func DetectLayout(root string) Layout {
	for _, d := range []struct{ name, agent string }{
		{"k3s", "/var/lib/rancher/k3s/agent"},
		{"rke2", "/var/lib/rancher/rke2/agent"},
	} {
		etc := d.agent + "/etc/containerd"
		if st, err := os.Stat(filepath.Join(root, etc)); err != nil || !st.IsDir() {
			continue
		}
		// Their containerd 2.x (k3s v1.31.6+, February 2025) reads
		// config-v3.toml.tmpl; 1.7 reads config.toml.tmpl. An existing
		// template decides, else the config they generated.
		version := 2
		switch {
		case exists(filepath.Join(root, etc, "config-v3.toml.tmpl")):
			version = 3
		case exists(filepath.Join(root, etc, "config.toml.tmpl")):
		default:
			if b, err := os.ReadFile(filepath.Join(root, etc, "config.toml")); err == nil {
				var head struct {
					Version int `toml:"version"`
				}
				if toml.Unmarshal(b, &head) == nil && head.Version == 3 {
					version = 3
				}
			}
		}
		tmpl := etc + "/config.toml.tmpl"
		if version == 3 {
			tmpl = etc + "/config-v3.toml.tmpl"
		}
		return Layout{Name: d.name, ContainerdConfig: tmpl, Template: true, Version: version,
			ContainerdRoot: d.agent + "/containerd", ContainerdState: "/run/k3s/containerd", KubeletRoot: "/var/lib/kubelet"}
	}
	return Layout{Name: "containerd", ContainerdConfig: "/etc/containerd/config.toml", ContainerdRoot: "/var/lib/containerd", KubeletRoot: "/var/lib/kubelet"}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Action is one thing Install or Uninstall did (or would do).
type Action struct {
	Path string
	What string // created, updated, unchanged, kept, removed, ...
}

func (a Action) String() string { return fmt.Sprintf("%-10s %s", a.What, a.Path) }

// manifest records what Install created, for Uninstall.
type manifest struct {
	Files []string `json:"files"`
	// Import is the drop-in path added to the containerd config's
	// imports; ImportsLine says Install wrote the whole imports line,
	// ConfigCreated that it wrote the config itself.
	Import        string `json:"import"`
	ImportsLine   bool   `json:"importsLine"`
	ConfigCreated bool   `json:"configCreated"`
	// Block is the text appended to a version 2 (containerd 1.7) config,
	// which cannot take a drop-in (see registerHandler), or to a k3s or
	// RKE2 template.
	Block string `json:"block,omitempty"`
	// ContainerdConfig is the file the handler was registered in, when
	// the layout chose it (k3s, RKE2).
	ContainerdConfig string `json:"containerdConfig,omitempty"`
	// Layout names the node's layout.
	Layout string `json:"layout,omitempty"`
}

const (
	binDir         = "/usr/local/bin"
	etcDir         = "/etc/agentbox"
	shimName       = "containerd-shim-agentbox-v1"
	defaultHandler = "agentbox"
)

// Each handler has its own shim config (the config names the handler it
// serves, and role bindings match on it) and its own manifest; the
// binaries and policies are shared by all handlers on the node.
func configFile(handler string) string {
	if handler == defaultHandler {
		return etcDir + "/config.toml"
	}
	return etcDir + "/config-" + handler + ".toml"
}

func manifestFile(handler string) string {
	if handler == defaultHandler {
		return etcDir + "/install.json"
	}
	return etcDir + "/install-" + handler + ".json"
}

// ConfigFile is the shim config Install writes for o's handler, as the
// node sees it.
func ConfigFile(o Options) string {
	o = withDefaults(o)
	return nodePath(o, configFile(o.Handler))
}

// handlerName is a CRI runtime handler name, as the shim config accepts it.
var handlerName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// installer carries one run.
type installer struct {
	o       Options
	actions []Action
	m       manifest
}

func (in *installer) path(p string) string { return filepath.Join(in.o.Root, p) }

// nodePath is how containerd and the shim will see p.
func (in *installer) nodePath(p string) string { return nodePath(in.o, p) }

func nodePath(o Options, p string) string {
	if o.HostRoot {
		return filepath.Clean(p)
	}
	return filepath.Join(o.Root, p)
}

// dryVerbs say what a dry run would do.
var dryVerbs = map[string]string{"created": "would create", "updated": "would update", "removed": "would remove"}

func (in *installer) note(path, what string) {
	if v, ok := dryVerbs[what]; ok && in.o.DryRun {
		what = v
	}
	in.actions = append(in.actions, Action{Path: path, What: what})
}

// put writes content to path: created when absent, updated when different
// (only if replace), unchanged when equal, kept otherwise.
func (in *installer) put(path string, content []byte, mode os.FileMode, replace bool) error {
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, content):
		in.note(path, "unchanged")
		return nil
	case err == nil && !replace:
		in.note(path, "kept")
		return nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	}
	what := "created"
	if err == nil {
		what = "updated"
	} else {
		in.m.Files = append(in.m.Files, path)
	}
	in.note(path, what)
	if in.o.DryRun {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".agentbox-new"
	if err := os.WriteFile(tmp, content, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Install installs agentbox under o.Root.
func Install(o Options) ([]Action, error) {
	o = withDefaults(o)
	if !handlerName.MatchString(o.Handler) {
		return nil, fmt.Errorf("handler %q is not a runtime handler name (lower-case letters, digits, '.', '_', '-')", o.Handler)
	}
	in := &installer{o: o}
	if prev, err := readManifest(in.path(manifestFile(o.Handler))); err == nil {
		in.m = prev
	}
	shim, err := os.ReadFile(o.Shim)
	if err != nil {
		return nil, fmt.Errorf("shim binary: %w", err)
	}
	if err := RequireStatic(o.Runsc); err != nil {
		return nil, fmt.Errorf("runsc: %w", err)
	}
	runsc, err := os.ReadFile(o.Runsc)
	if err != nil {
		return nil, fmt.Errorf("runsc binary: %w", err)
	}
	if err := in.put(in.path(binDir+"/"+shimName), shim, 0o755, true); err != nil {
		return in.actions, err
	}
	if err := in.put(in.path(binDir+"/runsc"), runsc, 0o755, true); err != nil {
		return in.actions, err
	}
	if o.CLI != "" {
		cli, err := os.ReadFile(o.CLI)
		if err != nil {
			return in.actions, fmt.Errorf("agentbox binary: %w", err)
		}
		if err := in.put(in.path(binDir+"/agentbox"), cli, 0o755, true); err != nil {
			return in.actions, err
		}
	}
	cfg, err := nodeConfig(o)
	if err != nil {
		return in.actions, err
	}
	if err := in.put(in.path(configFile(o.Handler)), cfg, 0o644, false); err != nil {
		return in.actions, err
	}
	names, _ := fs.Glob(policies.Files, "*.yaml")
	sort.Strings(names)
	for _, n := range names {
		b, _ := policies.Files.ReadFile(n)
		if err := in.put(in.path(etcDir+"/policies/"+n), b, 0o644, false); err != nil {
			return in.actions, err
		}
	}
	if err := in.registerHandler(); err != nil {
		return in.actions, err
	}
	if !o.DryRun {
		if err := writeManifest(in.path(manifestFile(o.Handler)), in.m); err != nil {
			return in.actions, err
		}
	}
	return in.actions, nil
}

func withDefaults(o Options) Options {
	if o.Root == "" {
		o.Root = "/"
	}
	o.layout = DetectLayout(o.Root)
	if o.ContainerdConfig == "" {
		o.ContainerdConfig = o.layout.ContainerdConfig
	} else if o.ContainerdConfig != o.layout.ContainerdConfig {
		// A config the admin named is not a distribution's template.
		o.layout.Template = false
	}
	if o.Handler == "" {
		o.Handler = defaultHandler
	}
	return o
}

// nodeConfig is the shipped shim config with its files under Root (the
// runsc binary, policies, audit trails; sockets stay in /run: their paths
// are short by necessity) and the handler named, checked to load before it
// is written.
func nodeConfig(o Options) ([]byte, error) {
	s := string(runscconfig.ConfigTOML)
	for _, r := range []struct{ old, new string }{
		{`binary = "/usr/local/bin/runsc"`, fmt.Sprintf("binary = %q", nodePath(o, binDir+"/runsc"))},
		{`dir = "/etc/agentbox/policies"`, fmt.Sprintf("dir = %q", nodePath(o, etcDir+"/policies"))},
		{`handler = "agentbox"`, fmt.Sprintf("handler = %q", o.Handler)},
		{`dir = "/var/log/agentbox/audit"`, fmt.Sprintf("dir = %q", nodePath(o, "/var/log/agentbox/audit"))},
		// Where this node's containerd and kubelet make a pod's files.
		{`containerd_root = "/var/lib/containerd"`, fmt.Sprintf("containerd_root = %q", o.layout.ContainerdRoot)},
		{`containerd_state = ""`, fmt.Sprintf("containerd_state = %q", o.layout.ContainerdState)},
	} {
		if !strings.Contains(s, r.old) {
			return nil, fmt.Errorf("the shipped config lacks %s", r.old)
		}
		s = strings.Replace(s, r.old, r.new, 1)
	}
	if _, err := config.Parse([]byte(s)); err != nil {
		return nil, fmt.Errorf("the config for this node does not load: %w", err)
	}
	return []byte(s), nil
}

var (
	importsLine = regexp.MustCompile(`(?m)^imports\s*=\s*\[(.*)\]\s*$`)
	versionLine = regexp.MustCompile(`(?m)^version\s*=\s*\d+\s*$`)
)

const (
	blockBegin = "# BEGIN agentbox: written by agentbox install; agentbox uninstall removes it\n"
	blockEnd   = "# END agentbox\n"
)

func writeKeepingMode(path string, b []byte) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".agentbox-new"
	if err := os.WriteFile(tmp, b, st.Mode().Perm()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// RequireStatic refuses a dynamically linked binary: runsc re-executes
// itself inside a chroot that has no dynamic loader, and its sandboxes die
// at boot.
func RequireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: not an ELF binary: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; sandboxes die at boot. Rebuild with CGO_ENABLED=0 (hack/setup.sh)", path)
		}
	}
	return nil
}
