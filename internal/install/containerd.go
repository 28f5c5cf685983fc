package install

// Registering the handler with containerd: a drop-in file where the main
// config imports drop-ins, else a block appended to it; and the imports
// list, edited without disturbing the rest of the file.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

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
