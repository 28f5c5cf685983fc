// Package bundle writes the files the shim adds to a container's bundle and
// mounts into it: the resolv.conf and hosts that send its names to the
// pod's resolver and gateway, and the gateway's CA with the variables
// that make common clients trust it. What it reads from the pod or the
// image (their resolv.conf, hosts, system roots) is bounded and never
// followed through a symlink.
package bundle

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/mountguard"
	"agentbox.dev/agentbox/internal/ocispec"
)

// ResolvConf returns the rewrite that writes the container's resolv.conf
// (naming the pod's resolver, keeping the pod's search and options) into
// its bundle and mounts it. It runs after the mounts were checked and
// staged, so the pod's resolv.conf it reads is the one that was checked.
func ResolvConf(bundle string, resolver netip.Addr) ocispec.Rewrite {
	return func(spec *specs.Spec) (string, error) {
		var original []byte
		if src := ocispec.ResolvConfSource(spec); src != "" {
			b, err := ReadSmallFile(src, 64<<10)
			if err != nil && !os.IsNotExist(err) {
				return "", fmt.Errorf("read the pod's resolv.conf: %w", err)
			}
			original = b
		}
		path := filepath.Join(bundle, resolvConfFile)
		if err := os.WriteFile(path, dnsproxy.ResolvConf(original, resolver), 0o644); err != nil {
			return "", fmt.Errorf("write resolv.conf: %w", err)
		}
		return ocispec.MountResolvConf(path)(spec)
	}
}

// Hosts writes the container's /etc/hosts into its bundle, the pod's
// own (the runtime's mount, else the image's) with the host rules' exact
// names mapped to the gateway, and mounts it read-only in place of any
// other.
func Hosts(bundle string, gateway netip.Addr, names []string, layers func() (mountguard.Layers, error)) ocispec.Rewrite {
	return func(spec *specs.Spec) (string, error) {
		var original []byte
		from := "localhost only"
		if src := ocispec.MountSource(spec, ocispec.HostsPath); src != "" {
			b, err := ReadSmallFile(src, maxHostsFile)
			if err != nil && !os.IsNotExist(err) {
				return "", fmt.Errorf("read the pod's hosts file: %w", err)
			}
			original, from = b, src
		} else if l, err := layers(); err == nil {
			if b, err := l.ReadFile(ocispec.HostsPath, maxHostsFile); err == nil {
				original, from = b, "the image's "+ocispec.HostsPath
			}
		}
		path := filepath.Join(bundle, hostsFile)
		if err := os.WriteFile(path, dnsproxy.Hosts(original, gateway, names), 0o644); err != nil {
			return "", fmt.Errorf("write the hosts file: %w", err)
		}
		if _, err := ocispec.MountFile(ocispec.HostsPath, path)(spec); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: %s with the host rules' names at the egress gateway %s, mounted read-only", ocispec.HostsPath, from, gateway), nil
	}
}

// hostsFile is the hosts file the shim writes into a bundle; maxHostsFile
// bounds the pod's or image's it starts from.
const (
	hostsFile    = "agentbox-hosts"
	maxHostsFile = 1 << 20
)

// ReadSmallFile reads a regular file of at most limit bytes. The path comes
// from a spec: a FIFO or device there must not hang or flood the shim.
func ReadSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s is over %d bytes", path, limit)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// resolvConfFile is the resolv.conf the shim writes into a bundle.
const resolvConfFile = "agentbox-resolv.conf"

// Where a sandbox finds its gateway's CA: the CA alone (for clients that
// add to their roots), and the image's system bundle with the CA appended
// (for clients whose variable replaces their roots).
const (
	CAFile       = "/etc/agentbox/ca.pem"
	CABundleFile = "/etc/agentbox/ca-bundle.pem"
)

// trustEnv are the variables that make common clients trust the bundle:
// OpenSSL (curl, Python's ssl, git), requests, curl, git, Node.
var trustEnv = [][2]string{
	{"SSL_CERT_FILE", CABundleFile},
	{"REQUESTS_CA_BUNDLE", CABundleFile},
	{"CURL_CA_BUNDLE", CABundleFile},
	{"GIT_SSL_CAINFO", CABundleFile},
	{"PIP_CERT", CABundleFile},
	{"NODE_EXTRA_CA_CERTS", CAFile},
}

// systemBundles are where images keep their roots (Debian and Ubuntu,
// Fedora and RHEL, Alpine, openSUSE); the first found is used.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/cert.pem",
	"/etc/ssl/ca-bundle.pem",
}

// maxBundle bounds an image's bundle the shim reads (Debian's is ~220 KiB).
const maxBundle = 4 << 20

// Trust returns the rewrite that writes the gateway CA and the image's
// bundle with it into the container's bundle, mounts both read-only and
// points the clients' variables at them (replacing the pod's: a pod that
// sets its own bundle would not reach inspected hosts).
func Trust(bundle string, ca []byte, layers func() (mountguard.Layers, error)) ocispec.Rewrite {
	return func(spec *specs.Spec) (string, error) {
		system, from := []byte(nil), "none"
		if l, err := layers(); err == nil {
			for _, p := range systemBundles {
				b, err := l.ReadFile(p, maxBundle)
				if err == nil {
					system, from = b, p
					break
				}
			}
		}
		combined := append(append([]byte(nil), system...), '\n')
		combined = append(combined, ca...)
		for name, content := range map[string][]byte{"agentbox-ca.pem": ca, "agentbox-ca-bundle.pem": combined} {
			if err := os.WriteFile(filepath.Join(bundle, name), content, 0o644); err != nil {
				return "", fmt.Errorf("write the gateway CA: %w", err)
			}
		}
		for dst, name := range map[string]string{CAFile: "agentbox-ca.pem", CABundleFile: "agentbox-ca-bundle.pem"} {
			if _, err := ocispec.MountFile(dst, filepath.Join(bundle, name))(spec); err != nil {
				return "", err
			}
		}
		if spec.Process != nil {
			spec.Process.Env = WithTrustEnv(spec.Process.Env)
		}
		return fmt.Sprintf("the gateway CA mounted at %s and, after the image's roots (%s), at %s; %s set", CAFile, from, CABundleFile, trustEnvNames()), nil
	}
}

// WithTrustEnv sets the trust variables in env, replacing earlier values.
func WithTrustEnv(env []string) []string {
	out := make([]string, 0, len(env)+len(trustEnv))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, t := range trustEnv {
			if t[0] == name {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	for _, t := range trustEnv {
		out = append(out, t[0]+"="+t[1])
	}
	return out
}

func trustEnvNames() string {
	var names []string
	for _, t := range trustEnv {
		names = append(names, t[0])
	}
	return strings.Join(names, ", ")
}
