package install

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// staticELF finds a statically linked binary to stand in for runsc.
func staticELF(t *testing.T) string {
	for _, p := range []string{"/bin/busybox", "/var/cache/agentbox/bin/runsc"} {
		if RequireStatic(p) == nil {
			return p
		}
	}
	t.Skip("no static binary to stand in for runsc (apt-get install busybox-static)")
	return ""
}

func opts(t *testing.T, root string) Options {
	dir := t.TempDir()
	shim, cli := filepath.Join(dir, "shim"), filepath.Join(dir, "agentbox")
	os.WriteFile(shim, []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(cli, []byte("#!/bin/sh\necho cli\n"), 0o755)
	return Options{Root: root, Shim: shim, Runsc: staticELF(t), CLI: cli}
}

func whats(acts []Action) map[string]string {
	m := map[string]string{}
	for _, a := range acts {
		m[a.Path] = a.What
	}
	return m
}

func TestInstallIsIdempotentAndReversible(t *testing.T) {
	for _, tc := range []struct {
		name, main, wantPlugin string
	}{
		{"no config", "", "io.containerd.cri.v1.runtime"},
		{"v3 without imports", "version = 3\nroot = \"/x\"\n\n[grpc]\n  address = \"/s\"\n", "io.containerd.cri.v1.runtime"},
		{"v3 with imports", "# mine\nversion = 3\nimports = [\"/etc/containerd/other.toml\"]\n", "io.containerd.cri.v1.runtime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			mainPath := filepath.Join(root, "etc/containerd/config.toml")
			if tc.main != "" {
				writeFile(t, mainPath, tc.main, 0o600)
			}
			o := opts(t, root)
			acts, err := Install(o)
			if err != nil {
				t.Fatal(err)
			}
			w := whats(acts)
			drop := filepath.Join(root, "etc/containerd/conf.d/agentbox.toml")
			for _, p := range []string{"usr/local/bin/containerd-shim-agentbox-v1", "usr/local/bin/runsc", "usr/local/bin/agentbox", "etc/agentbox/config.toml", "etc/agentbox/policies/baseline.yaml", "etc/containerd/conf.d/agentbox.toml"} {
				if w[filepath.Join(root, p)] != "created" {
					t.Errorf("%s: %q, want created", p, w[filepath.Join(root, p)])
				}
			}
			// The main config imports the drop-in and still parses.
			main, _ := os.ReadFile(mainPath)
			var parsed struct {
				Version int      `toml:"version"`
				Imports []string `toml:"imports"`
			}
			if err := toml.Unmarshal(main, &parsed); err != nil || !contains(parsed.Imports, drop) {
				t.Fatalf("main config %q: %v", main, err)
			}
			d, _ := os.ReadFile(drop)
			if !strings.Contains(string(d), tc.wantPlugin) || !strings.Contains(string(d), filepath.Join(root, "etc/agentbox/config.toml")) {
				t.Fatalf("drop-in:\n%s", d)
			}
			if st, _ := os.Stat(mainPath); tc.main != "" && st.Mode().Perm() != 0o600 {
				t.Errorf("the main config's mode changed to %v", st.Mode())
			}
			// Again: nothing changes.
			acts, err = Install(o)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range acts {
				if a.What != "unchanged" && a.What != "kept" {
					t.Errorf("second install: %s", a)
				}
			}
			// Uninstall restores the main config byte for byte.
			if _, err := Uninstall(o); err != nil {
				t.Fatal(err)
			}
			after, err := os.ReadFile(mainPath)
			if tc.main == "" {
				if !os.IsNotExist(err) {
					t.Errorf("the config install created must go: %q", after)
				}
			} else if string(after) != tc.main {
				t.Errorf("main config after uninstall:\n%q\nwant\n%q", after, tc.main)
			}
			for _, p := range []string{"usr/local/bin/runsc", "usr/local/bin/agentbox", "etc/agentbox/config.toml", "etc/containerd/conf.d/agentbox.toml", "etc/agentbox/install.json"} {
				if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
					t.Errorf("%s left after uninstall", p)
				}
			}
		})
	}
}

func TestInstallKeepsWhatTheAdminWrote(t *testing.T) {
	root := t.TempDir()
	cfg := filepath.Join(root, "etc/agentbox/config.toml")
	writeFile(t, cfg, "version = 1\n", 0o644)
	o := opts(t, root)
	acts, err := Install(o)
	if err != nil || whats(acts)[cfg] != "kept" {
		t.Fatalf("an existing config must be kept: %v %v", acts, err)
	}
	Uninstall(o)
	if b, _ := os.ReadFile(cfg); string(b) != "version = 1\n" {
		t.Fatal("uninstall removed the admin's config")
	}
}

func TestInstallDryRunWritesNothing(t *testing.T) {
	root := t.TempDir()
	o := opts(t, root)
	o.DryRun = true
	acts, err := Install(o)
	if err != nil || len(acts) == 0 {
		t.Fatal(err)
	}
	for _, a := range acts {
		if !strings.HasPrefix(a.What, "would ") {
			t.Errorf("dry run: %s", a)
		}
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 0 {
		t.Fatalf("a dry run wrote %v", entries)
	}
}

func TestInstallRefuses(t *testing.T) {
	root := t.TempDir()
	mainPath := filepath.Join(root, "etc/containerd/config.toml")
	writeFile(t, mainPath, "[plugins]\n", 0o644)
	if _, err := Install(opts(t, root)); err == nil || !strings.Contains(err.Error(), "version 0") {
		t.Fatalf("a version 1 config must be refused: %v", err)
	}
	o := opts(t, t.TempDir())
	o.Runsc = o.Shim
	if _, err := Install(o); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Fatalf("a runsc that is not a static binary must be refused: %v", err)
	}
	if _, err := Uninstall(opts(t, t.TempDir())); err == nil || !strings.Contains(err.Error(), "no install manifest") {
		t.Fatalf("uninstall without a manifest: %v", err)
	}
}

func contains(l []string, v string) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
}

// containerd 1.7 replaces a plugin's whole section with an imported one's:
// the handler goes into the main file, between markers, and uninstall
// takes exactly that out.
func TestInstallContainerd17AppendsToTheMainConfig(t *testing.T) {
	root := t.TempDir()
	mainPath := filepath.Join(root, "etc/containerd/config.toml")
	original := "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	writeFile(t, mainPath, original, 0o644)
	o := opts(t, root)
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	main, _ := os.ReadFile(mainPath)
	var tree map[string]any
	if err := toml.Unmarshal(main, &tree); err != nil {
		t.Fatal(err)
	}
	runtimes, _ := dig(tree, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
	if _, ok := runtimes["agentbox"]; !ok || runtimes["runc"] == nil || strings.Contains(string(main), "imports") {
		t.Fatalf("the handler must sit beside runc in the main file:\n%s", main)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/containerd/conf.d/agentbox.toml")); !os.IsNotExist(err) {
		t.Fatal("no drop-in for containerd 1.7")
	}
	if acts, _ := Install(o); whats(acts)[mainPath] != "unchanged" {
		t.Fatalf("a second install must leave the config: %v", acts)
	}
	if _, err := Uninstall(o); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(mainPath); string(b) != original {
		t.Fatalf("uninstall must restore the config:\n%q", b)
	}
	// A handler of the same name the admin wrote is not overwritten.
	os.WriteFile(mainPath, []byte(original+"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.agentbox]\n  runtime_type = \"x\"\n"), 0o644)
	if _, err := Install(opts(t, root)); err == nil || !strings.Contains(err.Error(), `already has a runtime "agentbox"`) {
		t.Fatalf("want a refusal: %v", err)
	}
}

// writeFile writes a file of the test's, with its directories.
func writeFile(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}

// Two handlers on one node: each has its own config (naming it) and
// manifest; uninstalling one leaves what the other needs.
func TestInstallTwoHandlers(t *testing.T) {
	root := t.TempDir()
	o := opts(t, root)
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	strict := o
	strict.Handler = "agentbox.strict"
	if _, err := Install(strict); err != nil {
		t.Fatal(err)
	}
	for h, cfg := range map[string]string{"agentbox": "etc/agentbox/config.toml", "agentbox.strict": "etc/agentbox/config-agentbox.strict.toml"} {
		b, err := os.ReadFile(filepath.Join(root, cfg))
		if err != nil || !strings.Contains(string(b), `handler = "`+h+`"`) {
			t.Errorf("%s: %v\n%s", cfg, err, b)
		}
	}
	// The dotted handler is one quoted key, not nested tables.
	var drop map[string]any
	d, _ := os.ReadFile(filepath.Join(root, "etc/containerd/conf.d/agentbox.strict.toml"))
	if err := toml.Unmarshal(d, &drop); err != nil {
		t.Fatal(err)
	}
	if _, ok := dig(drop, "plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "agentbox.strict"); !ok {
		t.Fatalf("drop-in does not register \"agentbox.strict\":\n%s", d)
	}
	shim := filepath.Join(root, "usr/local/bin/containerd-shim-agentbox-v1")
	if _, err := Uninstall(o); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{shim, filepath.Join(root, "usr/local/bin/runsc"), filepath.Join(root, "etc/agentbox/policies/baseline.yaml"), filepath.Join(root, "etc/agentbox/config-agentbox.strict.toml")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("agentbox.strict still needs %s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc/agentbox/config.toml")); err == nil {
		t.Error("the agentbox handler's config is left")
	}
	if main, _ := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml")); strings.Contains(string(main), "conf.d/agentbox.toml") {
		t.Errorf("the main config still imports the removed drop-in:\n%s", main)
	}
	if _, err := Uninstall(strict); err != nil {
		t.Fatal(err)
	}
	var left []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Errorf("left after both uninstalls: %v", left)
	}
	if _, err := Install(Options{Root: root, Handler: "a b]", Shim: o.Shim, Runsc: o.Runsc}); err == nil || !strings.Contains(err.Error(), "handler") {
		t.Errorf("a bad handler name: %v", err)
	}
}

// From an installer pod (the node's / at --host-root): files land below
// the mount, and the configs name them as the node sees them.
func TestInstallHostRoot(t *testing.T) {
	root := t.TempDir()
	o := opts(t, root)
	o.HostRoot = true
	writeFile(t, filepath.Join(root, "etc/containerd/config.toml"), "version = 3\n", 0o644)
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(filepath.Join(root, "etc/agentbox/config.toml"))
	drop, _ := os.ReadFile(filepath.Join(root, "etc/containerd/conf.d/agentbox.toml"))
	main, _ := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml"))
	for _, c := range []struct{ name, body, want string }{
		{"config", string(cfg), `binary = "/usr/local/bin/runsc"`},
		{"config", string(cfg), `dir = "/etc/agentbox/policies"`},
		{"drop-in", string(drop), `ConfigPath = "/etc/agentbox/config.toml"`},
		{"main config", string(main), `imports = ["/etc/containerd/conf.d/agentbox.toml"]`},
	} {
		if !strings.Contains(c.body, c.want) {
			t.Errorf("%s lacks %s:\n%s", c.name, c.want, c.body)
		}
		if strings.Contains(c.body, root) {
			t.Errorf("%s names the installer's mount %s:\n%s", c.name, root, c.body)
		}
	}
	if _, err := Uninstall(o); err != nil {
		t.Fatal(err)
	}
	if main, _ := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml")); string(main) != "version = 3\n" {
		t.Errorf("main config after uninstall: %q", main)
	}
}

// A config that imports conf.d/*.toml already takes the drop-in: it is not
// added again, and uninstall leaves the glob alone.
func TestInstallGlobImport(t *testing.T) {
	root := t.TempDir()
	o := opts(t, root)
	o.HostRoot = true
	main := "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"
	mainPath := filepath.Join(root, "etc/containerd/config.toml")
	writeFile(t, mainPath, main, 0o644)
	acts, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if w := whats(acts)[mainPath]; w != "unchanged" {
		t.Errorf("main config: %s, want unchanged", w)
	}
	if _, err := Uninstall(o); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(mainPath); string(b) != main {
		t.Errorf("main config after uninstall: %q", b)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/containerd/conf.d/agentbox.toml")); !os.IsNotExist(err) {
		t.Errorf("drop-in left: %v", err)
	}
}

// TestInstallK3sAndRKE2: on a k3s or RKE2 node the handler goes into their
// containerd template (they regenerate config.toml at each start), in the
// config version their containerd reads, and the shim config names their
// containerd root and state; uninstall leaves the node as it was.
func TestInstallK3sAndRKE2(t *testing.T) {
	const k3sEtc = "var/lib/rancher/k3s/agent/etc/containerd"
	const rke2Etc = "var/lib/rancher/rke2/agent/etc/containerd"
	for _, tc := range []struct {
		name     string
		files    map[string]string // below root, before install
		template string            // the file the handler goes in
		plugin   string
		root     string // containerd_root the shim config must name
		kept     string // the template's own text that must survive
	}{
		{"k3s with containerd 2", map[string]string{k3sEtc + "/config.toml": "version = 3\n"},
			k3sEtc + "/config-v3.toml.tmpl", "io.containerd.cri.v1.runtime", "/var/lib/rancher/k3s/agent/containerd", ""},
		{"k3s with containerd 1.7", map[string]string{k3sEtc + "/config.toml": "version = 2\n"},
			k3sEtc + "/config.toml.tmpl", "io.containerd.grpc.v1.cri", "/var/lib/rancher/k3s/agent/containerd", ""},
		{"k3s with the admin's template", map[string]string{k3sEtc + "/config.toml": "version = 3\n",
			k3sEtc + "/config-v3.toml.tmpl": "{{ template \"base\" . }}\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n"},
			k3sEtc + "/config-v3.toml.tmpl", "io.containerd.cri.v1.runtime", "/var/lib/rancher/k3s/agent/containerd", "runtimes.kata"},
		{"rke2", map[string]string{rke2Etc + "/config.toml": "version = 3\n"},
			rke2Etc + "/config-v3.toml.tmpl", "io.containerd.cri.v1.runtime", "/var/lib/rancher/rke2/agent/containerd", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, body := range tc.files {
				writeFile(t, filepath.Join(root, p), body, 0o644)
			}
			o := opts(t, root)
			if _, err := Install(o); err != nil {
				t.Fatal(err)
			}
			tmpl, err := os.ReadFile(filepath.Join(root, tc.template))
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{`{{ template "base" . }}`, `[plugins."` + tc.plugin + `".containerd.runtimes."agentbox"]`, `runtime_type = "io.containerd.agentbox.v1"`, tc.kept} {
				if !strings.Contains(string(tmpl), w) {
					t.Errorf("template lacks %q:\n%s", w, tmpl)
				}
			}
			if _, err := os.Stat(filepath.Join(root, "etc/containerd/config.toml")); err == nil {
				t.Error("wrote /etc/containerd/config.toml on a k3s/RKE2 node")
			}
			cfg, _ := os.ReadFile(filepath.Join(root, "etc/agentbox/config.toml"))
			if !strings.Contains(string(cfg), "containerd_root = \""+tc.root+"\"") || !strings.Contains(string(cfg), `containerd_state = "/run/k3s/containerd"`) {
				t.Errorf("shim config does not name the distribution's containerd:\n%s", cfg)
			}
			// Again: nothing changes.
			acts, err := Install(o)
			if err != nil {
				t.Fatal(err)
			}
			if w := whats(acts)[filepath.Join(root, tc.template)]; w != "unchanged" {
				t.Errorf("second install: template %s", w)
			}
			if _, err := Uninstall(Options{Root: root}); err != nil {
				t.Fatal(err)
			}
			after, err := os.ReadFile(filepath.Join(root, tc.template))
			if tc.kept == "" {
				if err == nil {
					t.Errorf("the template agentbox created is left: %s", after)
				}
			} else if string(after) != tc.files[tc.template] {
				t.Errorf("uninstall did not restore the admin's template:\n%s", after)
			}
		})
	}
	// A template that does not extend the base one: agentbox does not guess.
	root := t.TempDir()
	writeFile(t, filepath.Join(root, k3sEtc, "config-v3.toml.tmpl"), "version = 3\n[plugins]\n", 0o644)
	if _, err := Install(opts(t, root)); err == nil || !strings.Contains(err.Error(), "does not extend k3s's base template") {
		t.Fatalf("want a refusal naming the base template, got %v", err)
	}
}
