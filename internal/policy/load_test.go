package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const roleHead = "apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: r}\n"

func TestParseProblems(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []string // each must appear in the error
	}{
		{"unknown field with line", roleHead + "spec:\n  limits:\n    memroy: 1Gi\n", []string{"p.yaml:6: spec.limits.memroy: unknown field"}},
		{"unknown top-level", roleHead + "spec: {}\nstatus: {}\n", []string{"p.yaml:5: status: unknown field"}},
		{"duplicate field", roleHead + "spec:\n  limits: {}\n  limits: {}\n", []string{"p.yaml:6: spec.limits: duplicate field"}},
		{"wrong kind", "apiVersion: agentbox.dev/v1\nkind: Rol\nmetadata: {name: r}\n", []string{"p.yaml:2: kind: \"Rol\" is not Role or RoleBinding (or the cluster's AgentRole, AgentRoleBinding)"}},
		{"missing kind", "apiVersion: agentbox.dev/v1\nmetadata: {name: r}\n", []string{"kind: missing"}},
		{"wrong api version", "apiVersion: v1\nkind: Role\nmetadata: {name: r}\nspec: {}\n", []string{"p.yaml:1: apiVersion: \"v1\" is not \"agentbox.dev/v1\""}},
		{"bad name", "apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: Bad_Name}\nspec: {}\n", []string{"metadata.name: \"Bad_Name\" is not a valid name"}},
		{"type error", roleHead + "spec:\n  process: {maxProcesses: many}\n", []string{"p.yaml:5", "cannot unmarshal"}},
		{"syntax error", roleHead + "spec: [\n", []string{"p.yaml"}},
		{"not a mapping", "- a\n- b\n", []string{"p.yaml:1: a policy object must be a mapping"}},
		{"bad values all at once", roleHead + `spec:
  filesystem: {rootfs: writable, writable: [tmp, /a/../b]}
  network: {egress: sideways}
  process: {maxProcesses: 0, capabilities: [CAP_FLY]}
  credentials: {env: {allow: ["BAD-NAME"]}, secrets: [{env: "1X", file: rel}]}
  limits: {cpu: lots, memory: 12Q, cpuTime: "-1s", openFiles: 1, wallClock: soon}
`, []string{
			`spec.filesystem.rootfs: "writable" is not read-only or overlay`,
			`spec.filesystem.writable[0]: "tmp" is not an absolute path`,
			`spec.filesystem.writable[1]: "/a/../b" is not clean`,
			`spec.network.egress: "sideways"`,
			`spec.process.maxProcesses: 0 is not between`,
			`spec.process.capabilities[0]: "CAP_FLY" is not a Linux capability`,
			`spec.credentials.env.allow[0]`,
			`spec.credentials.secrets[0].env`,
			`spec.credentials.secrets[0].file`,
			`spec.limits.cpu: "lots"`,
			`spec.limits.memory: "12Q"`,
			`spec.limits.cpuTime: "-1s"`,
			`spec.limits.openFiles: 1`,
			`spec.limits.wallClock: "soon"`,
		}},
		{"contradiction: none with allow", roleHead + "spec:\n  network:\n    egress: none\n    allow: [{host: a.example}]\n", []string{"p.yaml:7: spec.network.allow: egress none takes no allow list"}},
		{"contradiction: allowlist without rules", roleHead + "spec:\n  network: {egress: allowlist}\n", []string{"spec.network.allow: egress allowlist needs at least one rule"}},
		{"port-forward port out of range", roleHead + "spec:\n  network: {portForward: [0, 8080, 70000]}\n", []string{"spec.network.portForward: port 0 is not between 1 and 65535", "spec.network.portForward: port 70000 is not between"}},
		{"port-forward port twice", roleHead + "spec:\n  network: {portForward: [9090, 8080, 9090]}\n", []string{"spec.network.portForward: port 9090 is listed twice"}},
		{"port-forward not a list of ports", roleHead + "spec:\n  network: {portForward: [http]}\n", []string{"p.yaml:5", "cannot unmarshal"}},
		{"contradiction: capability defeats maxProcesses", roleHead + "spec:\n  process: {capabilities: [SYS_ADMIN]}\n", []string{"CAP_SYS_ADMIN lets the agent exceed maxProcesses"}},
		{"egress rule errors", roleHead + "spec:\n  network:\n    egress: allowlist\n    allow: [{host: 10.0.0.1}, {cidr: 10.0.0.0/33}, {host: a.example, cidr: 10.0.0.0/8}, {ports: [0, 70000]}]\n", []string{
			`allow[0].host: "10.0.0.1" is an address`, `allow[1].cidr: "10.0.0.0/33" is not a CIDR`, `allow[2]: sets both host and cidr`, `allow[3]: sets neither`, `allow[3].ports[0]: 0 is not a port`, `allow[3].ports[1]: 70000`}},
		{"model budget errors", roleHead + "spec:\n  network:\n    egress: allowlist\n    allow:\n    - {host: api.example, ports: [443]}\n  limits:\n    model: {tokens: 0, perMinute: {requests: -1}}\n  audit: {model: all}\n", []string{
			`audit.model: "all" is not calls, digests or content`, `limits.model.tokens: 0 is not a bound`, `limits.model.perMinute.requests: -1 is not a bound`, `limits.model: bounds nothing`,
			`limits.model: no host rule names a model API (api:)`}},
		{"model cap errors", roleHead + "spec:\n  network:\n    egress: allowlist\n    allow:\n    - {host: api.example, ports: [443], api: openai}\n  limits:\n    model: {requests: 5, maxOutputTokens: 100}\n", []string{
			`limits.model.maxOutputTokens: caps calls under a token budget only: set limits.model.tokens too`}},
		{"model cap over budget", roleHead + "spec:\n  network:\n    egress: allowlist\n    allow:\n    - {host: api.example, ports: [443], api: openai}\n  limits:\n    model: {tokens: 50, maxOutputTokens: 100}\n", []string{
			`limits.model.maxOutputTokens: 100 is more than limits.model.tokens (50): a call naming no cap could never be made`}},
		{"model api errors", roleHead + "spec:\n  network:\n    egress: allowlist\n    allow:\n    - {host: api.example, ports: [443], api: claude}\n    - {cidr: 10.0.0.0/8, api: openai}\n", []string{
			`allow[0].api: "claude" is not a model API this gateway reads ([anthropic openai gemini])`, `allow[1].api: only a host rule takes it`}},
		{"http rule errors", roleHead + "spec:\n  network:\n    egress: allowlist\n    allow:\n    - {host: a.example, ports: [443], http: {methods: [get, CONNECT], paths: [api, \"/a/*/b\", /a/../b, \"/x?y\"]}}\n    - {host: b.example, ports: [443], http: {}}\n    - {cidr: 10.0.0.0/8, http: {methods: [GET]}, websocket: true}\n", []string{
			`allow[0].http.methods[0]: "get" is not an HTTP method in upper case`, `allow[0].http.methods[1]: CONNECT is never served`,
			`allow[0].http.paths[0]: "api" does not start with /`, `allow[0].http.paths[1]: "/a/*/b" has '*' inside it`,
			`allow[0].http.paths[2]: "/a/../b" is not a clean path`, `allow[0].http.paths[3]: "/x?y" holds '?'`,
			`allow[1].http: restricts nothing`, `allow[2].http: only a host rule takes it`, `allow[2].websocket: only a host rule takes it`}},
		{"inject errors", roleHead + `spec:
  network: {egress: allowlist, allow: [{host: "*.example", ports: [443]}]}
  credentials:
    secrets:
    - {file: /s}
    - {file: /s, inject: {host: "*.example", header: "Bad Header"}}
    - {env: T, file: /s, inject: {host: api.other, header: Host, format: "Bearer"}}
    - {file: /s, inject: {host: a.example, header: X-Key, format: "{secret}{secret}"}}
    - {file: /s, inject: {host: a.example, header: x-key}}
`, []string{
			`secrets[0]: names neither env`, `secrets[1].inject.host: "*.example" is a pattern`, `secrets[1].inject.header: "Bad Header" is not an HTTP header name`,
			`secrets[2].inject.header: Host is the HTTP framing's`, `secrets[2].inject.format: "Bearer" must hold {secret} once`,
			`secrets[2].inject.host: "api.other" is not allowed by any host rule`, `secrets[3].inject.format`, `secrets[4].inject: header x-key of a.example is injected twice`}},
		{"suspend error", roleHead + "spec:\n  suspend: always\n", []string{`spec.suspend: "always" is not memory or none`}},
		{"secretRef errors", roleHead + `spec:
  network: {egress: allowlist, allow: [{host: a.example, ports: [443]}, {host: b.example, ports: [443]}]}
  credentials:
    secrets:
    - {env: T, secretRef: {namespace: keys, name: vendor, key: token}}
    - {file: /s, secretRef: {namespace: keys, name: vendor, key: token}, inject: {host: a.example, header: X-Key}}
    - {secretRef: {namespace: Keys, name: "a/b", key: ".."}, inject: {host: b.example, header: X-Key}}
    - {inject: {host: b.example, header: X-Other}}
`, []string{
			`secrets[0].secretRef: only a secret the gateway injects may come from a Kubernetes Secret`,
			`secrets[1]: names both file and secretRef`,
			`secrets[2].secretRef.namespace: "Keys" is not a namespace's name`, `secrets[2].secretRef.name: "a/b" is not a Secret's name`, `secrets[2].secretRef.key: ".." is not a Secret's key`,
			`secrets[3].file`}},
		{"mcp rule errors", roleHead + `spec:
  network:
    egress: allowlist
    allow:
    - {host: a.example, ports: [443], api: mcp}
    - {host: b.example, ports: [443], api: mcp, tools: {allow: ["get issue", "a*b", ""], deny: ["x**"]}}
    - {host: c.example, ports: [443], tools: {allow: [x]}}
    - {host: d.example, ports: [443], api: mcp, tools: {allow: [x]}, http: {paths: [/mcp]}}
    - {cidr: 10.0.0.0/8, tools: {allow: [x]}}
    - {host: e.example, ports: [443], api: mcpx}
`, []string{
			`allow[0].tools.allow: an api: mcp rule lists the tools it allows`,
			`allow[1].tools.allow[0]: "get issue" is not a tool's name`, `allow[1].tools.allow[1]: "a*b"`, `allow[1].tools.allow[2]: ""`, `allow[1].tools.deny[0]: "x**"`,
			`allow[2].tools: only an api: mcp rule takes it`, `allow[3]: an api: mcp rule takes no http`, `allow[4].tools: only a host rule with api: mcp takes it`,
			`allow[5].api: "mcpx" is not a model API this gateway reads`}},
		{"mcp budget errors", roleHead + `spec:
  network:
    egress: allowlist
    allow: [{host: a.example, ports: [443], api: mcp, tools: {allow: ["*"]}}]
  limits:
    mcp: {calls: 0, tools: {"get*": 2, ok: 0}}
`, []string{`limits.mcp.calls: 0 is not a bound`, `limits.mcp.tools.get*: "get*" is not a tool's name`, `limits.mcp.tools.ok: 0 is not a bound`}},
		{"mcp budget without a server", roleHead + "spec:\n  limits:\n    mcp: {}\n", []string{`limits.mcp: bounds nothing`, `limits.mcp: no host rule names an MCP server`}},
		{"fromClaim errors", roleHead + `spec:
  network: {egress: allowlist, allow: [{host: a.example, ports: [443]}, {host: b.example, ports: [443]}]}
  credentials:
    secrets:
    - {env: T, fromClaim: vendor}
    - {file: /s, fromClaim: vendor, inject: {host: a.example, header: X-Key}}
    - {fromClaim: Vendor_Key, inject: {host: b.example, header: X-Key}}
    - {fromClaim: twice, inject: {host: a.example, header: X-A}}
    - {fromClaim: twice, inject: {host: b.example, header: X-B}}
`, []string{
			`secrets[0].fromClaim: only a secret the gateway injects may come from a claim`,
			`secrets[1]: names fromClaim and a file or secretRef`,
			`secrets[2].fromClaim: "Vendor_Key" is not a claim key's name`,
			`secrets[4].fromClaim: "twice" is named twice`}},
		{"binding to missing role", "apiVersion: agentbox.dev/v1\nkind: RoleBinding\nmetadata: {name: b}\nspec:\n  role: ghost\n  subjects: [{namespace: x}]\n", []string{"p.yaml:5: spec.role: role \"ghost\" is not defined"}},
		{"binding without subjects", roleHead + "spec: {}\n---\napiVersion: agentbox.dev/v1\nkind: RoleBinding\nmetadata: {name: b}\nspec: {role: r}\n", []string{"spec.subjects: missing"}},
		{"empty subject", roleHead + "spec: {}\n---\napiVersion: agentbox.dev/v1\nkind: RoleBinding\nmetadata: {name: b}\nspec: {role: r, subjects: [{}]}\n", []string{"spec.subjects[0]: sets none of"}},
		{"missing parent", roleHead + "spec: {inherits: ghost}\n", []string{"spec.inherits: parent role \"ghost\" is not defined"}},
		{"cycle", "apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: a}\nspec: {inherits: b}\n---\napiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: b}\nspec: {inherits: a}\n", []string{"inheritance cycle"}},
		{"self inheritance", roleHead + "spec: {inherits: r}\n", []string{"cannot inherit from itself"}},
		{"duplicate role", roleHead + "spec: {}\n---\n" + roleHead + "spec: {}\n", []string{"p.yaml:8: metadata.name: role \"r\" is already defined at p.yaml:1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.in))
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestLoadPathsReportsEveryFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(roleHead+"spec: {limits: {memory: x}}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "b.yml"), []byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: s}\nspec: {bogus: 1}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("ignored"), 0o644)
	_, err := LoadPaths(dir)
	if err == nil || !strings.Contains(err.Error(), "a.yaml:4: spec.limits.memory") || !strings.Contains(err.Error(), "b.yml:4: spec.bogus: unknown field") {
		t.Fatalf("want problems from both files, got %v", err)
	}
	if _, err := LoadPaths(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing dir: %v", err)
	}
	empty := t.TempDir()
	if _, err := LoadPaths(empty); err == nil || !strings.Contains(err.Error(), "holds no *.yaml") {
		t.Fatalf("empty dir: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	os.WriteFile(big, make([]byte, MaxFileSize+1), 0o644)
	if _, err := LoadPaths(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized file: %v", err)
	}
}

func mustParse(t *testing.T, y string) *Set {
	t.Helper()
	s, err := Parse("t.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const family = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: base}
spec:
  filesystem: {writable: [/tmp], maskedPaths: [/proc/kallsyms]}
  process: {maxProcesses: 32, runAsUser: 1000}
  limits: {memory: 256Mi, wallClock: 10m}
  network: {portForward: [9090, 8080]}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: child}
spec:
  inherits: base
  filesystem: {writable: [/workspace]}
  limits: {memory: 1Gi}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: grandchild}
spec:
  inherits: child
  process: {capabilities: [NET_BIND_SERVICE]}
  network: {egress: open}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: b}
spec:
  role: child
  subjects:
    - {namespace: agents}
    - {containerdNamespace: default, runtimeHandler: agentbox-coder}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: any}
spec:
  role: base
  subjects: [{namespace: "*"}]
`

func TestInheritance(t *testing.T) {
	s := mustParse(t, family)
	p, err := s.Profile("grandchild")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(p.Chain, ","); got != "grandchild,child,base" {
		t.Errorf("chain %s", got)
	}
	// Lists replace, scalars override, unset fields inherit.
	if len(p.Filesystem.Writable) != 1 || p.Filesystem.Writable[0] != "/workspace" {
		t.Errorf("writable %v: the child's list replaces the parent's", p.Filesystem.Writable)
	}
	if len(p.Filesystem.MaskedPaths) != 1 {
		t.Errorf("masked %v: inherited", p.Filesystem.MaskedPaths)
	}
	if p.Limits.MemoryBytes != 1<<30 || p.Limits.WallClock.Minutes() != 10 || p.Process.MaxProcesses != 32 || p.Process.RunAsUser != 1000 || p.Process.RunAsGroup != 1000 {
		t.Errorf("limits %+v process %+v", p.Limits, p.Process)
	}
	if !slices.Equal(p.Network.PortForward, []int{8080, 9090}) {
		t.Errorf("portForward %v: inherited, ascending", p.Network.PortForward)
	}
	if p.Network.Egress != EgressOpen || len(p.Process.Capabilities) != 1 || p.Process.Capabilities[0] != "CAP_NET_BIND_SERVICE" {
		t.Errorf("network %+v caps %v", p.Network, p.Process.Capabilities)
	}
	b, _ := s.Profile("base")
	if b.Network.Egress != EgressNone || b.Filesystem.Rootfs != RootfsReadOnly || !b.Filesystem.NoExecWritable || b.Credentials.ServiceAccountToken {
		t.Errorf("least-privilege defaults: %+v", b)
	}
	if b.Digest == p.Digest || b.Digest == "" {
		t.Error("digests must differ between roles")
	}
	b2, _ := s.Profile("base")
	if b2.Digest != b.Digest {
		t.Error("digest must be stable")
	}
}

func TestSelect(t *testing.T) {
	s := mustParse(t, family)
	cases := []struct {
		name    string
		req     Request
		role    string
		wantErr string
	}{
		{"default role", Request{PodNamespace: "x", ContainerdNamespace: "k8s.io", DefaultRole: "base"}, "base", ""},
		{"no role at all", Request{PodNamespace: "x"}, "", "no agentbox.dev/role annotation and no default role"},
		{"claimed and bound by namespace", Request{Annotations: map[string]string{RoleAnnotation: "child"}, PodNamespace: "agents"}, "child", ""},
		{"bound by containerd namespace and handler together", Request{Annotations: map[string]string{RoleAnnotation: "child"}, ContainerdNamespace: "default", Handler: "agentbox-coder"}, "child", ""},
		{"handler alone is not enough", Request{Annotations: map[string]string{RoleAnnotation: "child"}, ContainerdNamespace: "other", Handler: "agentbox-coder"}, "", `role "child" is not bound to containerd namespace "other", runtime handler "agentbox-coder"`},
		{"wrong namespace", Request{Annotations: map[string]string{RoleAnnotation: "child"}, PodNamespace: "default"}, "", `role "child" is not bound to pod namespace "default"`},
		{"star needs a pod namespace", Request{Annotations: map[string]string{RoleAnnotation: "base"}, ContainerdNamespace: "default"}, "", "not bound"},
		{"unbound role", Request{Annotations: map[string]string{RoleAnnotation: "grandchild"}, PodNamespace: "agents"}, "", `role "grandchild" is not bound`},
		{"undefined role", Request{Annotations: map[string]string{RoleAnnotation: "root"}, PodNamespace: "agents"}, "", `role "root" is not defined in the policy (3 roles: base, child, grandchild)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := s.Select(tc.req)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Role != tc.role {
				t.Fatalf("role %s, want %s", p.Role, tc.role)
			}
		})
	}
}

func TestTightenOnly(t *testing.T) {
	s := mustParse(t, family)
	req := func(ann map[string]string) Request {
		ann[RoleAnnotation] = "child"
		return Request{Annotations: ann, PodNamespace: "agents"}
	}
	p, err := s.Select(req(map[string]string{WallClockAnnotation: "1m", MemoryAnnotation: "128Mi", MaxProcessesAnnotation: "8", CPUAnnotation: "500m", EgressAnnotation: "none"}))
	if err != nil {
		t.Fatal(err)
	}
	if p.Limits.WallClock.Minutes() != 1 || p.Limits.MemoryBytes != 128<<20 || p.Process.MaxProcesses != 8 || p.Limits.CPUMillis != 500 || len(p.Tightened) != 5 {
		t.Fatalf("not tightened: %+v %+v %v", p.Limits, p.Process, p.Tightened)
	}
	plain, _ := s.Select(req(map[string]string{}))
	if plain.Digest == p.Digest {
		t.Error("a tightened profile must have its own digest")
	}
	for k, v := range map[string]string{
		WallClockAnnotation:    "11m",
		MemoryAnnotation:       "2Gi",
		MaxProcessesAnnotation: "33",
		CPUAnnotation:          "4",
		"agentbox.dev/rootfs":  "writable",
		MemoryAnnotation + "x": "1",
	} {
		if _, err := s.Select(req(map[string]string{k: v})); err == nil {
			t.Errorf("%s=%s: a pod must not loosen its role (or use unknown keys)", k, v)
		}
	}
	open := mustParse(t, strings.Replace(family, "role: child", "role: grandchild", 1))
	if _, err := open.Select(Request{Annotations: map[string]string{RoleAnnotation: "grandchild", EgressAnnotation: "allowlist"}, PodNamespace: "agents"}); err == nil {
		t.Error("egress may only narrow to none")
	}
}

// TestExamplesValidate: the examples' roles, written for kubectl as
// AgentRole and AgentRoleBinding, load with the shipped roles they
// inherit, as `agentbox policy validate policies/ FILE` loads them.
func TestExamplesValidate(t *testing.T) {
	for _, f := range []string{"agents/role.yaml", "agents/browser-role.yaml", "agents/python-role.yaml", "agent-sandbox/role.yaml"} {
		s, err := LoadPaths("../../policies", filepath.Join("../../examples", f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(s.Roles) < 4 {
			t.Errorf("%s: %d roles", f, len(s.Roles))
		}
	}
}
