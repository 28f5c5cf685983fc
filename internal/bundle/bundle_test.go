package bundle

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/ocispec"
)

func TestReadSmallFile(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "resolv.conf")
	os.WriteFile(ok, []byte("search a\n"), 0o644)
	if b, err := ReadSmallFile(ok, 64); err != nil || string(b) != "search a\n" {
		t.Fatalf("%q %v", b, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSmallFile(fifo, 64); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO must be refused at once: %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 100), 0o644)
	if _, err := ReadSmallFile(big, 64); err == nil {
		t.Error("a file over the limit must be refused")
	}
	link := filepath.Join(dir, "link")
	os.Symlink(ok, link)
	if _, err := ReadSmallFile(link, 64); err == nil {
		t.Error("a symlink must not be followed")
	}
}

func noLayers() (mountguard.Layers, error) { return nil, errors.New("no image layers in this test") }

func mountAt(spec *specs.Spec, dst string) *specs.Mount {
	for i := range spec.Mounts {
		if spec.Mounts[i].Destination == dst {
			return &spec.Mounts[i]
		}
	}
	return nil
}

// The pod's resolv.conf keeps its search and options, names the pod's
// resolver, and replaces the pod's mount read-only.
func TestResolvConf(t *testing.T) {
	dir := t.TempDir()
	pod := filepath.Join(dir, "pod-resolv.conf")
	os.WriteFile(pod, []byte("search ns.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"), 0o644)
	spec := &specs.Spec{Mounts: []specs.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: pod}}}
	if _, err := ocispec.Apply(spec, ResolvConf(dir, netip.MustParseAddr("169.254.53.53"))); err != nil {
		t.Fatal(err)
	}
	m := mountAt(spec, "/etc/resolv.conf")
	if m == nil || m.Source != filepath.Join(dir, resolvConfFile) || !slices.Contains(m.Options, "ro") {
		t.Fatalf("mount %+v", m)
	}
	b, _ := os.ReadFile(m.Source)
	if got := string(b); !strings.Contains(got, "nameserver 169.254.53.53\n") || strings.Contains(got, "10.96.0.10") ||
		!strings.Contains(got, "search ns.svc.cluster.local") || !strings.Contains(got, "options ndots:5") {
		t.Fatalf("resolv.conf:\n%s", got)
	}
	// A pod's resolv.conf that is a FIFO is refused, not read.
	fifo := filepath.Join(dir, "fifo")
	unix.Mkfifo(fifo, 0o644)
	spec = &specs.Spec{Mounts: []specs.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: fifo}}}
	if _, err := ocispec.Apply(spec, ResolvConf(dir, netip.MustParseAddr("169.254.53.53"))); err == nil {
		t.Fatal("a FIFO resolv.conf was read")
	}
}

// The hosts file is the pod's, with the host rules' names at the gateway;
// without one (and no image), localhost only.
func TestHosts(t *testing.T) {
	dir := t.TempDir()
	pod := filepath.Join(dir, "pod-hosts")
	os.WriteFile(pod, []byte("127.0.0.1\tlocalhost\n10.0.0.7\tcoder-1\n"), 0o644)
	spec := &specs.Spec{Mounts: []specs.Mount{{Destination: "/etc/hosts", Type: "bind", Source: pod}}}
	gw := netip.MustParseAddr("169.254.53.53")
	msg, err := ocispec.Apply(spec, Hosts(dir, gw, []string{"api.test"}, noLayers))
	if err != nil {
		t.Fatal(err)
	}
	m := mountAt(spec, "/etc/hosts")
	b, _ := os.ReadFile(m.Source)
	if got := string(b); !strings.Contains(got, "10.0.0.7\tcoder-1") || !strings.Contains(got, "169.254.53.53\tapi.test") {
		t.Fatalf("hosts:\n%s", got)
	}
	if !strings.Contains(strings.Join(msg, " "), pod) {
		t.Fatalf("the change does not say where the hosts file came from: %q", msg)
	}
	spec = &specs.Spec{}
	msg, err = ocispec.Apply(spec, Hosts(dir, gw, []string{"api.test"}, noLayers))
	if err != nil || !strings.Contains(strings.Join(msg, " "), "localhost only") || mountAt(spec, "/etc/hosts") == nil {
		t.Fatalf("without a hosts file: %q %v", msg, err)
	}
}

// The CA is mounted alone and as a bundle, and the trust variables replace
// the container's own.
func TestTrust(t *testing.T) {
	dir := t.TempDir()
	ca := []byte("-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n")
	spec := &specs.Spec{Process: &specs.Process{Env: []string{"PATH=/bin", "SSL_CERT_FILE=/mine.pem"}}}
	if _, err := ocispec.Apply(spec, Trust(dir, ca, noLayers)); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{CAFile, CABundleFile} {
		m := mountAt(spec, dst)
		if m == nil {
			t.Fatalf("nothing mounted at %s", dst)
		}
		if b, _ := os.ReadFile(m.Source); !strings.Contains(string(b), "CA\n") {
			t.Fatalf("%s: %q", dst, b)
		}
	}
	env := strings.Join(spec.Process.Env, " ")
	if strings.Contains(env, "/mine.pem") || !strings.Contains(env, "SSL_CERT_FILE="+CABundleFile) ||
		!strings.Contains(env, "NODE_EXTRA_CA_CERTS="+CAFile) || !strings.Contains(env, "PATH=/bin") {
		t.Fatalf("env: %s", env)
	}
	if got := WithTrustEnv(WithTrustEnv(nil)); len(got) != len(trustEnv) {
		t.Fatalf("twice: %q", got)
	}
}
