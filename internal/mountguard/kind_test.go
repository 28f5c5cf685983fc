package mountguard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/policy"
)

// TestLayersKind builds an overlay's layers on disk and asks what paths
// are in the merged view.
func TestLayersKind(t *testing.T) {
	upper, mid, low := t.TempDir(), t.TempDir(), t.TempDir()
	mk := func(root, p string, dir bool) {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if dir {
			os.MkdirAll(full, 0o755)
		} else {
			os.WriteFile(full, []byte("x"), 0o644)
		}
	}
	mk(low, "etc/passwd", false)
	mk(low, "etc/shadow", false)
	mk(low, "usr/local/bin/tool", false)
	mk(low, "opt/old/file", false)
	mk(low, "srv", true)
	os.Symlink("/etc/passwd", filepath.Join(low, "etc/link"))
	os.Symlink("/usr", filepath.Join(low, "linkdir"))
	mk(mid, "etc/passwd", true) // a directory above the lower file
	mk(mid, "opt/old", true)
	mk(upper, "new.txt", false)
	cases := map[string]policy.PathKind{
		"etc/passwd":         policy.PathDir,
		"etc/shadow":         policy.PathFile,
		"usr/local/bin":      policy.PathDir,
		"usr/local/bin/tool": policy.PathFile,
		"new.txt":            policy.PathFile,
		"nothing":            policy.PathAbsent,
		"etc/shadow/below":   policy.PathAbsent,
		"opt/old/file":       policy.PathFile,
		"":                   policy.PathDir,
	}
	whiteout := unix.Mknod(filepath.Join(mid, "etc/shadow"), unix.S_IFCHR, 0) == nil
	if whiteout {
		cases["etc/shadow"] = policy.PathAbsent
	}
	opaque := unix.Lsetxattr(filepath.Join(mid, "opt/old"), "trusted.overlay.opaque", []byte("y"), 0) == nil
	if opaque {
		cases["opt/old/file"] = policy.PathAbsent
	}
	l := Layers{upper, mid, low}
	// kind follows Lookup's symlinks, all inside the image here.
	kind := func(rel string) (policy.PathKind, error) {
		p := rel
		for hops := 0; hops < 40; hops++ {
			k, next, err := l.Lookup(p)
			if err != nil || next == "" {
				return k, err
			}
			p = next
		}
		return 0, errors.New("too many levels of symlinks")
	}
	for rel, want := range cases {
		got, err := kind(rel)
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", rel, got, err, want)
		}
	}
	// Symlinks resolve inside the image: absolute from its root, ".."
	// stopping there, never through the host.
	os.Symlink("../../../../etc/shadow", filepath.Join(low, "usr/local/up"))
	os.Symlink("loop2", filepath.Join(low, "loop1"))
	os.Symlink("loop1", filepath.Join(low, "loop2"))
	os.Symlink("/proc/1/root", filepath.Join(low, "hostroot")) // absent in the image
	for rel, want := range map[string]policy.PathKind{
		"etc/link":               policy.PathDir, // -> /etc/passwd, a directory in mid
		"linkdir/local":          policy.PathDir, // -> /usr/local
		"linkdir/local/bin/tool": policy.PathFile,
		"usr/local/up":           cases["etc/shadow"],
		"hostroot/etc":           policy.PathAbsent,
	} {
		if got, err := kind(rel); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", rel, got, err, want)
		}
	}
	if _, err := kind("loop1"); err == nil || !strings.Contains(err.Error(), "too many levels of symlinks") {
		t.Errorf("a symlink loop: %v", err)
	}
	// Lookup stops at the symlink and says where it leads.
	if _, next, err := l.Lookup("/linkdir/local/bin"); err != nil || next != "/usr/local/bin" {
		t.Errorf("Lookup through linkdir: %q %v", next, err)
	}
	if !whiteout || !opaque {
		t.Logf("whiteout checked: %v, opaque checked: %v (need CAP_MKNOD and CAP_SYS_ADMIN)", whiteout, opaque)
	}
}

func TestLayersOf(t *testing.T) {
	l, err := LayersOf("/b", []RootfsMount{{Type: "overlay", Source: "overlay", Options: []string{"index=off", "workdir=/s/w", "upperdir=/s/u", "lowerdir=/s/2:/s/1"}}})
	if err != nil || strings.Join(l, " ") != "/s/u /s/2 /s/1" {
		t.Errorf("overlay: %v %v", l, err)
	}
	if l, err := LayersOf("/b", nil); err != nil || l[0] != "/b/rootfs" {
		t.Errorf("no mounts: %v %v", l, err)
	}
	for _, bad := range [][]RootfsMount{
		{{Type: "overlay", Options: []string{"lowerdir=rel/1"}}},
		{{Type: "overlay", Options: []string{"upperdir=/u"}}},
		{{Type: "zfs", Source: "pool/x"}},
		{{Type: "bind", Source: "/a"}, {Type: "bind", Source: "/b"}},
	} {
		if _, err := LayersOf("/b", bad); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

func TestKindBeneath(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "d"), 0o755)
	os.WriteFile(filepath.Join(root, "d/f"), nil, 0o644)
	os.Symlink("d", filepath.Join(root, "l"))
	for rel, want := range map[string]policy.PathKind{"": policy.PathDir, "d": policy.PathDir, "d/f": policy.PathFile, "x": policy.PathAbsent, "d/f/x": policy.PathAbsent} {
		if got, err := KindBeneath(root, rel); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", rel, got, err, want)
		}
	}
	if _, err := KindBeneath(root, "l/f"); err == nil {
		t.Error("through a symlink: accepted")
	}
}

func TestLayersReadFile(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(lower, "etc/ssl/certs"), 0o755))
	must(os.WriteFile(filepath.Join(lower, "etc/ssl/certs/ca-certificates.crt"), []byte("BUNDLE"), 0o644))
	// Alpine's layout: a relative symlink, resolved in the image.
	must(os.Symlink("certs/ca-certificates.crt", filepath.Join(lower, "etc/ssl/cert.pem")))
	// A hostile image: an absolute symlink means the image's root, not the host's.
	must(os.MkdirAll(filepath.Join(upper, "etc/pki"), 0o755))
	must(os.Symlink("/etc/ssl/certs/ca-certificates.crt", filepath.Join(upper, "etc/pki/abs.pem")))
	must(os.Symlink("../../../../../../../../etc/hostname", filepath.Join(upper, "etc/pki/escape.pem")))
	must(os.WriteFile(filepath.Join(upper, "big"), make([]byte, 100), 0o644))
	l := Layers{upper, lower}
	for _, p := range []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/cert.pem", "/etc/pki/abs.pem"} {
		b, err := l.ReadFile(p, 1<<20)
		if err != nil || string(b) != "BUNDLE" {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	if b, err := l.ReadFile("/etc/pki/escape.pem", 1<<20); err == nil {
		t.Errorf("a symlink out of the image read the host's file: %q", b)
	}
	if _, err := l.ReadFile("/big", 10); err == nil || !strings.Contains(err.Error(), "over 10") {
		t.Errorf("limit: %v", err)
	}
	if _, err := l.ReadFile("/absent", 10); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent: %v", err)
	}
}
