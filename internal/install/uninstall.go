package install

// Uninstalling: what the manifest says was written, removed or handed
// back as it was.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

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
