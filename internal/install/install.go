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
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
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
	// Shim and Runsc are the binaries to install.
	Shim, Runsc string
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

// handlerTables are the containerd config tables that register the
// handler in plugin (the CRI plugin's id in that config version).
func handlerTables(plugin, handler, agentboxConfig string) string {
	return fmt.Sprintf(`[plugins.%[1]q.containerd.runtimes.%[2]q]
  runtime_type = "io.containerd.agentbox.v1"
  pod_annotations = ["agentbox.dev/*"]
  container_annotations = ["agentbox.dev/*"]
  [plugins.%[1]q.containerd.runtimes.%[2]q.options]
    ConfigPath = %[3]q
`, plugin, handler, agentboxConfig)
}

// dropIn is the containerd 2.x (config version 3) file that registers the
// handler.
func dropIn(handler, agentboxConfig string) []byte {
	return []byte(fmt.Sprintf(`# Written by agentbox install: the %q runtime handler runs containers
# under agentbox (gVisor, least-privilege roles, an audit trail).
version = 3

`, handler) + handlerTables("io.containerd.cri.v1.runtime", handler, agentboxConfig))
}

// dropInFile is the handler's drop-in, below the node's root: named after
// the handler, and after agentbox too.
func (in *installer) dropInFile() string {
	name := in.o.Handler + ".toml"
	if !strings.HasPrefix(in.o.Handler, defaultHandler) {
		name = "agentbox-" + name
	}
	return "/etc/containerd/conf.d/" + name
}

func (in *installer) dropInPath() string { return in.path(in.dropInFile()) }

var (
	importsLine = regexp.MustCompile(`(?m)^imports\s*=\s*\[(.*)\]\s*$`)
	versionLine = regexp.MustCompile(`(?m)^version\s*=\s*\d+\s*$`)
)

// registerHandler writes the drop-in and makes the main config import it
// (or, on k3s and RKE2, extends their template).
func (in *installer) registerHandler() error {
	mainPath := in.path(in.o.ContainerdConfig)
	in.m.Layout = in.o.layout.Name
	if in.o.layout.Template {
		in.m.ContainerdConfig = in.o.ContainerdConfig
		return in.extendTemplate(mainPath)
	}
	main, err := os.ReadFile(mainPath)
	version := 3
	created := false
	switch {
	case errors.Is(err, fs.ErrNotExist):
		created = true
	case err != nil:
		return err
	default:
		var head struct {
			Version int `toml:"version"`
		}
		if err := toml.Unmarshal(main, &head); err != nil {
			return fmt.Errorf("containerd config %s: %w", mainPath, err)
		}
		if head.Version != 2 && head.Version != 3 {
			return fmt.Errorf("containerd config %s: version %d: agentbox registers itself in config version 2 (containerd 1.7) or 3 (containerd 2.x); migrate it with `containerd config migrate`", mainPath, head.Version)
		}
		version = head.Version
	}
	if version == 2 {
		return in.appendBlock(mainPath, main)
	}
	drop := in.dropInPath()
	if err := in.put(drop, dropIn(in.o.Handler, in.nodePath(configFile(in.o.Handler))), 0o644, true); err != nil {
		return err
	}
	// containerd reads the import as the node sees it.
	imp := in.nodePath(in.dropInFile())
	if created {
		in.m.ConfigCreated, in.m.Import = true, imp
		return in.put(mainPath, []byte(fmt.Sprintf("version = 3\nimports = [%q]\n", imp)), 0o644, false)
	}
	updated, line, err := addImport(main, imp)
	if err != nil {
		return fmt.Errorf("containerd config %s: %w", mainPath, err)
	}
	if bytes.Equal(updated, main) {
		in.note(mainPath, "unchanged")
		return nil
	}
	in.m.Import, in.m.ImportsLine = imp, line
	in.note(mainPath, "updated")
	if in.o.DryRun {
		return nil
	}
	return writeKeepingMode(mainPath, updated)
}

// appendBlock registers the handler in a version 2 (containerd 1.7)
// config by appending its tables to the main file between markers.
// containerd 1.7 replaces a plugin's whole section with an imported one's,
// so a drop-in for the CRI plugin would wipe the node's CRI settings (its
// runc runtime among them: the CRI plugin then does not load).
func (in *installer) appendBlock(mainPath string, main []byte) error {
	block := blockBegin + handlerTables("io.containerd.grpc.v1.cri", in.o.Handler, in.nodePath(configFile(in.o.Handler))) + blockEnd
	if bytes.Contains(main, []byte(block)) {
		in.note(mainPath, "unchanged")
		return nil
	}
	if bytes.Contains(main, []byte(blockBegin)) {
		return fmt.Errorf("containerd config %s holds an agentbox block that differs from this install's: run agentbox uninstall first", mainPath)
	}
	var tree map[string]any
	toml.Unmarshal(main, &tree)
	if runtimes, ok := dig(tree, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"); ok {
		if _, taken := runtimes[in.o.Handler]; taken {
			return fmt.Errorf("containerd config %s already has a runtime %q: remove it, or install under another --handler", mainPath, in.o.Handler)
		}
	}
	sep := "\n"
	if len(main) > 0 && main[len(main)-1] != '\n' {
		sep = "\n\n"
	}
	block = sep + block
	updated := append(append([]byte(nil), main...), block...)
	if err := toml.Unmarshal(updated, &tree); err != nil {
		return fmt.Errorf("containerd config %s would not parse with the handler appended (%v): add it by hand (examples/containerd-config-1.7.toml)", mainPath, err)
	}
	in.m.Block = block
	in.note(mainPath, "updated")
	if in.o.DryRun {
		return nil
	}
	return writeKeepingMode(mainPath, updated)
}

// extendTemplate registers the handler in a k3s or RKE2 containerd
// template: a new one extends their base template, an existing one gets
// the handler's tables appended between markers (uninstall removes them).
// k3s and RKE2 regenerate containerd's config from it at their next start.
func (in *installer) extendTemplate(path string) error {
	plugin := "io.containerd.cri.v1.runtime"
	if in.o.layout.Version == 2 {
		plugin = "io.containerd.grpc.v1.cri"
	}
	tables := handlerTables(plugin, in.o.Handler, in.nodePath(configFile(in.o.Handler)))
	var probe map[string]any
	if err := toml.Unmarshal([]byte(tables), &probe); err != nil {
		return fmt.Errorf("the handler's tables do not parse: %w", err)
	}
	block := blockBegin + tables + blockEnd
	main, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		in.m.ConfigCreated = true
		return in.put(path, []byte("{{ template \"base\" . }}\n\n"+block), 0o644, false)
	case err != nil:
		return err
	case bytes.Contains(main, []byte(block)):
		in.note(path, "unchanged")
		return nil
	case bytes.Contains(main, []byte(blockBegin)):
		return fmt.Errorf("containerd template %s holds an agentbox block that differs from this install's: run agentbox uninstall first", path)
	case !bytes.Contains(main, []byte(`template "base"`)):
		return fmt.Errorf("containerd template %s does not extend %s's base template ({{ template \"base\" . }}): add the handler by hand (the tables: agentbox install --dry-run on a fresh node shows them)", path, in.o.layout.Name)
	}
	sep := "\n"
	if len(main) > 0 && main[len(main)-1] != '\n' {
		sep = "\n\n"
	}
	in.m.Block = sep + block
	in.note(path, "updated")
	if in.o.DryRun {
		return nil
	}
	return writeKeepingMode(path, append(append([]byte(nil), main...), in.m.Block...))
}

const (
	blockBegin = "# BEGIN agentbox: written by agentbox install; agentbox uninstall removes it\n"
	blockEnd   = "# END agentbox\n"
)

// dig follows keys through nested tables.
func dig(t map[string]any, keys ...string) (map[string]any, bool) {
	for _, k := range keys {
		next, ok := t[k].(map[string]any)
		if !ok {
			return nil, false
		}
		t = next
	}
	return t, true
}

// addImport adds path to the config's imports unless an entry (a glob, as
// containerd reads them) names it already, inserting an imports line after
// version when there is none (line is then true).
func addImport(main []byte, path string) ([]byte, bool, error) {
	if m := importsLine.FindSubmatchIndex(main); m != nil {
		entries, err := parseList(string(main[m[2]:m[3]]))
		if err != nil {
			return nil, false, err
		}
		for _, e := range entries {
			// containerd expands each entry as a glob.
			if ok, _ := filepath.Match(e, path); ok || e == path {
				return main, false, nil
			}
		}
		entries = append(entries, path)
		return replaceImports(main, m, entries), false, nil
	}
	if bytes.Contains(main, []byte("\nimports")) || bytes.HasPrefix(main, []byte("imports")) {
		return nil, false, errors.New("its imports span several lines: add the drop-in to them by hand")
	}
	v := versionLine.FindIndex(main)
	if v == nil {
		return nil, false, errors.New("no version line")
	}
	line := []byte(fmt.Sprintf("\nimports = [%q]", path))
	return append(append(append([]byte(nil), main[:v[1]]...), line...), main[v[1]:]...), true, nil
}

// removeImport reverses addImport.
func removeImport(main []byte, path string, line bool) ([]byte, error) {
	m := importsLine.FindSubmatchIndex(main)
	if m == nil {
		return main, nil
	}
	entries, err := parseList(string(main[m[2]:m[3]]))
	if err != nil {
		return nil, err
	}
	var kept []string
	for _, e := range entries {
		if e != path {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 && line {
		end := m[1]
		start := m[0]
		if start > 0 && main[start-1] == '\n' {
			start--
		}
		return append(append([]byte(nil), main[:start]...), main[end:]...), nil
	}
	return replaceImports(main, m, kept), nil
}

func replaceImports(main []byte, m []int, entries []string) []byte {
	q := make([]string, len(entries))
	for i, e := range entries {
		q[i] = strconv.Quote(e)
	}
	out := append([]byte(nil), main[:m[2]]...)
	out = append(out, strings.Join(q, ", ")...)
	return append(out, main[m[3]:]...)
}

// parseList parses the inside of a one-line TOML array of strings.
func parseList(s string) ([]string, error) {
	var v struct {
		L []string `toml:"l"`
	}
	if err := toml.Unmarshal([]byte("l = ["+s+"]"), &v); err != nil {
		return nil, fmt.Errorf("imports: %w", err)
	}
	return v.L, nil
}

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

func writeManifest(path string, m manifest) error {
	b, _ := json.MarshalIndent(m, "", "  ")
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func readManifest(path string) (manifest, error) {
	var m manifest
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// Uninstall removes what Install created for o's handler and its import,
// as the manifest records them. Files that existed before Install are left
// alone, and so are the shared ones (binaries, policies) while another
// handler is still installed: that handler's manifest takes them over.
func Uninstall(o Options) ([]Action, error) {
	o = withDefaults(o)
	if !handlerName.MatchString(o.Handler) {
		return nil, fmt.Errorf("handler %q is not a runtime handler name", o.Handler)
	}
	in := &installer{o: o}
	mpath := in.path(manifestFile(o.Handler))
	m, err := readManifest(mpath)
	if err != nil {
		return nil, fmt.Errorf("no install manifest at %s: nothing agentbox installed for handler %q is known: %w", mpath, o.Handler, err)
	}
	if err := in.handOver(&m); err != nil {
		return nil, err
	}
	if m.ContainerdConfig != "" {
		o.ContainerdConfig = m.ContainerdConfig
	}
	mainPath := in.path(o.ContainerdConfig)
	if m.Block != "" {
		main, err := os.ReadFile(mainPath)
		if err != nil {
			return nil, err
		}
		if updated := bytes.Replace(main, []byte(m.Block), nil, 1); !bytes.Equal(updated, main) {
			in.note(mainPath, "updated")
			if !o.DryRun {
				if err := writeKeepingMode(mainPath, updated); err != nil {
					return in.actions, err
				}
			}
		}
	}
	// The import goes unless the config itself goes (created by Install
	// and not handed over to another handler).
	if m.Import != "" && !slices.Contains(m.Files, mainPath) {
		main, err := os.ReadFile(mainPath)
		if err != nil {
			return nil, err
		}
		updated, err := removeImport(main, m.Import, m.ImportsLine)
		if err != nil {
			return nil, fmt.Errorf("containerd config %s: %w", mainPath, err)
		}
		if !bytes.Equal(updated, main) {
			in.note(mainPath, "updated")
			if !o.DryRun {
				if err := writeKeepingMode(mainPath, updated); err != nil {
					return in.actions, err
				}
			}
		}
	}
	files := append([]string(nil), m.Files...)
	sort.Sort(sort.Reverse(sort.StringSlice(files)))
	for _, f := range files {
		in.note(f, "removed")
		if !o.DryRun {
			if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return in.actions, err
			}
		}
	}
	in.note(mpath, "removed")
	if !o.DryRun {
		if err := os.Remove(mpath); err != nil {
			return in.actions, err
		}
	}
	return in.actions, nil
}

// handOver moves the shared files m created (anything but this handler's
// config and drop-in) to another installed handler's manifest, which
// still needs them.
func (in *installer) handOver(m *manifest) error {
	others, _ := filepath.Glob(in.path(etcDir + "/install*.json"))
	self := in.path(manifestFile(in.o.Handler))
	var heir string
	for _, p := range others {
		if p != self {
			heir = p
			break
		}
	}
	if heir == "" {
		return nil
	}
	hm, err := readManifest(heir)
	if err != nil {
		return fmt.Errorf("install manifest %s: %w", heir, err)
	}
	own := map[string]bool{in.path(configFile(in.o.Handler)): true, in.dropInPath(): true}
	var keep []string
	for _, f := range m.Files {
		if own[f] {
			keep = append(keep, f)
			continue
		}
		hm.Files = append(hm.Files, f)
		in.note(f, "kept")
	}
	if len(keep) == len(m.Files) {
		return nil
	}
	m.Files = keep
	if in.o.DryRun {
		return nil
	}
	return writeManifest(heir, hm)
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
