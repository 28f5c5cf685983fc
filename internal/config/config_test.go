package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	type parseCase struct {
		name    string
		in      string
		wantErr []string
		check   func(t *testing.T, c *Config)
	}
	cases := []parseCase{
		{
			name: "full",
			in: `version = 1
[runsc]
binary = "/usr/local/bin/runsc"
root = "/run/abx"
[runsc.flags]
platform = "systrap"
overlay2 = "root:self"
[shim]
log_level = "debug"
`,
			check: func(t *testing.T, c *Config) {
				if c.Runsc.Binary != "/usr/local/bin/runsc" || c.Runsc.Root != "/run/abx" || c.Runsc.Flags["platform"] != "systrap" || c.Shim.LogLevel != "debug" {
					t.Fatalf("decoded %+v", c)
				}
			},
		},
		{
			name: "defaults fill what is absent",
			in:   "version = 1\n",
			check: func(t *testing.T, c *Config) {
				if c.Runsc.Binary != "runsc" || c.Shim.LogLevel != "info" || c.Runsc.Flags == nil {
					t.Fatalf("defaults: %+v", c)
				}
			},
		},
		{
			name: "audit send buffer",
			in:   "version = 1\n[audit]\nsentry_send_buffer = 0\n",
			check: func(t *testing.T, c *Config) {
				if c.Audit.SentrySendBuffer != 0 {
					t.Fatalf("0 (the kernel's default) must stay 0, got %d", c.Audit.SentrySendBuffer)
				}
			},
		},
		{
			name:    "bad audit send buffer",
			in:      "version = 1\n[audit]\nsentry_send_buffer = 134217728\n",
			wantErr: []string{"audit.sentry_send_buffer: 134217728 is not between 0 (the kernel's default) and 67108864 bytes"},
		},
		{
			name:    "negative audit send buffer",
			in:      "version = 1\n[audit]\nsentry_send_buffer = -1\n",
			wantErr: []string{"audit.sentry_send_buffer: -1 is not between"},
		},
		{
			name:    "webhook format",
			in:      "version = 1\n[audit.webhook]\nurl = \"http://127.0.0.1:4318/v1/logs\"\nformat = \"otel\"\n",
			wantErr: []string{`audit.webhook.format: "otel" is neither "ndjson" nor "otlp"`},
		},
		{
			name: "network",
			in:   "version = 1\n[network]\nresolver_address = \"10.254.0.53\"\nupstreams = [\"127.0.0.1:5353\", \"192.0.2.1\", \"[2001:db8::1]:53\"]\nmin_ttl_seconds = 5\nmax_ttl_seconds = 60\n",
			check: func(t *testing.T, c *Config) {
				r, p, err := c.Network.ResolverAddrs()
				if err != nil || r.String() != "10.254.0.53" || p.String() != "10.254.0.54" {
					t.Fatalf("resolver %v %v %v", r, p, err)
				}
				ups, err := c.Network.UpstreamAddrs("/nonexistent")
				if err != nil || fmt.Sprint(ups) != "[127.0.0.1:5353 192.0.2.1:53 [2001:db8::1]:53]" {
					t.Fatalf("upstreams %v %v", ups, err)
				}
			},
		},
		{
			name: "bad network",
			in:   "version = 1\n[network]\nresolver_address = \"10.0.0.255\"\nupstreams = [\"dns.google\"]\nmin_ttl_seconds = 0\n",
			wantErr: []string{
				"network.resolver_address: 10.0.0.255 leaves no usable next address",
				`network.upstreams[0]: "dns.google" is not an address`,
				"network.min_ttl_seconds 0 and max_ttl_seconds 3600",
			},
		},
		{name: "version required", in: "[runsc]\nbinary = \"runsc\"\n", wantErr: []string{"version: must be 1, got 0"}},
		{name: "unknown key with position", in: "version = 1\n[runsc]\nbinaryy = \"x\"\n", wantErr: []string{"line 3", `unknown key "runsc.binaryy"`}},
		{
			name: "weakening runsc flags",
			in:   "version = 1\n[runsc.flags]\nignore-cgroups = \"true\"\nnet-raw = \"true\"\nhost-uds = \"all\"\nnetwork = \"host\"\nTESTONLY-unsafe = \"1\"\noci-seccomp = \"false\"\n",
			wantErr: []string{
				"runsc.flags.ignore-cgroups: would weaken what a role enforces: the sandbox would ignore its cgroup",
				"runsc.flags.net-raw: would weaken what a role enforces",
				"runsc.flags.host-uds: would weaken",
				"runsc.flags.network: would weaken",
				"runsc.flags.oci-seccomp: would weaken",
				"runsc.flags.TESTONLY-unsafe: not a runsc flag name",
			},
		},
		{
			name:    "unknown runsc flag",
			in:      "version = 1\n[runsc.flags]\nfancy-new-flag = \"1\"\n",
			wantErr: []string{"runsc.flags.fancy-new-flag: not one of the tuning flags agentbox accepts (cpu-num-from-quota, dcache, debug,"},
		},
		{name: "unknown table", in: "version = 1\n[polcy]\ndir = \"x\"\n", wantErr: []string{"line 2", `unknown key "polcy"`}},
		{name: "syntax error", in: "version = \n", wantErr: []string{"line 1"}},
		{name: "wrong type", in: "version = \"one\"\n", wantErr: []string{"line 1"}},
		{
			name: "all problems at once",
			in: `version = 2
[runsc]
binary = "bin/runsc"
root = "relative"
[runsc.flags]
"-debug" = "true"
root = "/x"
[shim]
log_level = "loud"
`,
			wantErr: []string{
				"version: must be 1, got 2",
				`runsc.binary: "bin/runsc" must be an absolute path`,
				`runsc.root: "relative" must be an absolute path`,
				"runsc.flags.-debug: not a runsc flag name",
				"runsc.flags.root: owned by the shim",
				`shim.log_level: "loud"`,
			},
		},
	}
	for _, tc := range []struct{ name, in, want string }{
		{"a shared store with both keys", "version = 1\n[checkpoint]\nshared_dir = \"/s\"\nshared_key_file = \"/k\"\nshared_public_key = \"/p.pem\"\n", "set exactly one of checkpoint.shared_public_key"},
		{"a shared store with no key", "version = 1\n[checkpoint]\nshared_dir = \"/s\"\n", "set exactly one of checkpoint.shared_public_key"},
		{"a key with no shared store", "version = 1\n[checkpoint]\nshared_public_key = \"/p.pem\"\n", "only with checkpoint.shared_dir"},
		{"a relative keys directory", "version = 1\n[checkpoint]\nkeys_dir = \"keys\"\n", "checkpoint.keys_dir"},
	} {
		cases = append(cases, parseCase{name: tc.name, in: tc.in, wantErr: []string{tc.want}})
	}
	cases = append(cases, parseCase{name: "a shared store with the broker's key", in: "version = 1\n[checkpoint]\nshared_dir = \"/s\"\nshared_public_key = \"/p.pem\"\n", check: func(t *testing.T, c *Config) {
		if c.Checkpoint.SharedPublicKey != "/p.pem" || c.Checkpoint.KeysDir != DefaultKeysDir {
			t.Fatalf("decoded %+v", c.Checkpoint)
		}
	}})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.in))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("want error, got %+v", c)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.toml")
	if _, err := Load(missing, true); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("named missing file: want an error naming it, got %v", err)
	}
	c, err := Load(missing, false)
	if err != nil || c.Source != "" || c.Runsc.Binary != "runsc" {
		t.Fatalf("unnamed missing default: want built-in defaults, got %+v, %v", c, err)
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("version = 1\nnope = 1\n"), 0o644)
	for _, named := range []bool{true, false} {
		if _, err := Load(bad, named); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "line 2") {
			t.Fatalf("malformed (named=%v): want error with path and line, got %v", named, err)
		}
	}
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("version = 1\n"), 0o644)
	if c, err := Load(good, true); err != nil || c.Source != good {
		t.Fatalf("good: %+v %v", c, err)
	}
}

func TestRunscRoot(t *testing.T) {
	c := Default()
	a := c.RunscRoot("/run/containerd/containerd.sock")
	b := c.RunscRoot("/tmp/x/containerd.sock")
	if a == b {
		t.Fatalf("two containerd instances share runsc root %s", a)
	}
	if a != c.RunscRoot("/run/containerd/../containerd/containerd.sock") {
		t.Fatal("the same socket must give the same root")
	}
	if !strings.HasPrefix(a, DefaultRunscRootBase+"/") || len(a) > 40 {
		t.Fatalf("root %q: want a short path under %s", a, DefaultRunscRootBase)
	}
	c.Runsc.Root = "/explicit"
	if c.RunscRoot("/any") != "/explicit" {
		t.Fatal("explicit runsc.root must win")
	}
}

// TestShippedConfig: the documented config file parses as shipped.
func TestShippedConfig(t *testing.T) {
	c, err := Load("../../runsc-config/config.toml", true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Network.ResolverAddress != DefaultResolverAddress || c.Network.MinTTLSeconds != 300 || c.Network.MaxTTLSeconds != 3600 {
		t.Fatalf("network section %+v", c.Network)
	}
	if c.Policy.Dir != DefaultPolicyDir || c.Policy.DefaultRole != "baseline" || c.Policy.Handler != "agentbox" {
		t.Fatalf("policy section %+v", c.Policy)
	}
}

func TestUpstreamsFromResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(p, []byte("# comment\nsearch example.com\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\noptions edns0\n"), 0o644)
	ups, err := Default().Network.UpstreamAddrs(p)
	if err != nil || fmt.Sprint(ups) != "[127.0.0.53:53 [fe80::1]:53]" {
		t.Fatalf("upstreams %v %v", ups, err)
	}
	if _, err := Default().Network.UpstreamAddrs(filepath.Join(t.TempDir(), "none")); err == nil || !strings.Contains(err.Error(), "network.upstreams is empty") {
		t.Fatalf("a missing resolv.conf: %v", err)
	}
}
