// Package explain says what agentbox would make of a request or a Pod
// manifest, without running anything: the role it selects, the profile it
// compiles, and each container's spec as the kubelet and containerd's CRI
// would hand it to the shim (podspec.go models that), with what the shim
// changes in it or why it refuses it. `agentbox policy explain` prints it.
package explain

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/compile"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/policy"
)

// Explanation is `policy explain`'s JSON output.
type Explanation struct {
	Request    policy.Request    `json:"request"`
	Profile    *policy.Profile   `json:"profile"`
	SpecChange []string          `json:"specChanges,omitempty"`
	Spec       *specs.Spec       `json:"spec,omitempty"`
	RunscFlags map[string]string `json:"runscFlags"`
	// Pod is set with --pod: each container's request and outcome.
	Pod *PodExplanation `json:"pod,omitempty"`
	// Running are this node's running sandboxes under the role, each with
	// the digest it started under and the one it runs under now.
	Running []control.Sandbox `json:"running,omitempty"`
}

// PodExplanation is what `policy explain --pod` says of a pod.
type PodExplanation struct {
	Name       string                 `json:"name"`
	Namespace  string                 `json:"namespace"`
	Notes      []string               `json:"notes,omitempty"`
	Containers []ContainerExplanation `json:"containers"`
}

type ContainerExplanation struct {
	Name string `json:"name"`
	Asks string `json:"asks"`
	// Gets is what the container runs with; Refused why it does not start.
	Gets       string      `json:"gets,omitempty"`
	Refused    string      `json:"refused,omitempty"`
	SpecChange []string    `json:"specChanges,omitempty"`
	Spec       *specs.Spec `json:"spec,omitempty"`
}

func WithResolver(res *compile.Result) []string {
	changes := res.Changes
	if res.Egress != nil && res.Egress.Resolver {
		changes = append(changes, ocispec.ResolvConfPath+": the pod's resolver configuration, written by the shim for each container")
	}
	return changes
}

// Pod compiles each container of a Pod manifest as the shim would:
// the pod's namespace and annotations select the role.
func Pod(cfg *config.Config, set *policy.Set, req policy.Request, file string, stdin io.Reader, img ImageUser) (Explanation, error) {
	pod, err := readPod(file, stdin)
	if err != nil {
		return Explanation{}, err
	}
	req.PodNamespace = pod.Metadata.Namespace
	req.ContainerdNamespace = "k8s.io"
	for k, v := range pod.Metadata.Annotations {
		req.Annotations[k] = v
	}
	profile, err := set.Select(req)
	if err != nil {
		return Explanation{}, err
	}
	env := policy.MountEnv{SandboxRootDir: SampleSandboxDir, SandboxStateDir: SampleSandboxStateDir, PodDir: "/var/lib/kubelet/pods/" + pod.Metadata.UID}
	containers, notes, err := pod.containers(func() *specs.Spec { return SampleSpec(req) }, env, img)
	if err != nil {
		return Explanation{}, err
	}
	// The flags are the sandbox's: the same for every container (as
	// compile.Compile makes them).
	ex := Explanation{Request: req, Profile: profile, RunscFlags: cfg.RunscFlags(profile.RunscFlags()),
		Pod: &PodExplanation{Name: pod.Metadata.Name, Namespace: pod.Metadata.Namespace, Notes: notes}}
	for _, pc := range containers {
		ce := ContainerExplanation{Name: pc.Name, Asks: pc.Asks}
		if pc.Err != nil {
			ce.Refused = "before agentbox: " + pc.Err.Error()
			ex.Pod.Containers = append(ex.Pod.Containers, ce)
			continue
		}
		res, err := compile.Compile(compile.Input{Config: cfg, Profile: profile, Request: req, Mounts: env}, pc.Spec)
		if err != nil {
			ce.Refused = err.Error()
		} else {
			ce.Gets, ce.SpecChange, ce.Spec = granted(pc.Spec, profile), WithResolver(res), pc.Spec
		}
		ex.Pod.Containers = append(ex.Pod.Containers, ce)
	}
	return ex, nil
}

// granted summarizes the process a compiled spec runs.
func granted(s *specs.Spec, profile *policy.Profile) string {
	p := s.Process
	seccomp := "none"
	if sc := s.Linux.Seccomp; sc != nil {
		ours := len(profile.Syscalls().SeccompRules())
		seccomp = fmt.Sprintf("the role's %d rules, then %d of the pod's, default %s", ours, len(sc.Syscalls)-ours, sc.DefaultAction)
	}
	return fmt.Sprintf("uid %d gid %d groups %v; capabilities %v; no_new_privs %v; read-only root %v; seccomp: %s",
		p.User.UID, p.User.GID, p.User.AdditionalGids, p.Capabilities.Bounding, p.NoNewPrivileges, s.Root.Readonly, seccomp)
}

// SampleSpec is a container spec as containerd's CRI defaults make it, with
// an environment carrying a secret, so the Explanation shows what changes.
func SampleSpec(req policy.Request) *specs.Spec {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args:         []string{"/usr/local/bin/agent"},
			Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "AWS_SECRET_ACCESS_KEY=example"},
			Cwd:          "/",
			Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/dev/shm", Type: "bind", Source: SampleSandboxStateDir + "/shm", Options: []string{"rbind", "rw"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: SampleSandboxDir + "/resolv.conf", Options: []string{"rbind", "rw"}},
		},
		Annotations: sampleAnnotations(req),
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-ID"},
		}},
	}
}

// sampleAnnotations mark the sample as a CRI pod's sandbox when the request
// names a pod namespace (containerd's CRI sets these).
func sampleAnnotations(req policy.Request) map[string]string {
	if req.PodNamespace == "" {
		return nil
	}
	return map[string]string{ocispec.ContainerTypeAnnotation: ocispec.ContainerTypeSandbox, ocispec.SandboxNamespaceAnnotation: req.PodNamespace}
}

func Write(w io.Writer, ex Explanation) {
	writeProfileExplanation(w, ex)
	if len(ex.Running) == 0 {
		return
	}
	fmt.Fprintf(w, "\nrunning under role %s on this node (start digest -> live digest):\n", ex.Profile.Role)
	for _, sb := range ex.Running {
		who := sb.Pod
		if who == "" {
			who = "(" + sb.Namespace + ")"
		}
		live := policy.ShortDigest(sb.LiveDigest)
		if sb.LiveDigest == sb.StartDigest {
			live += " (as started)"
		} else {
			live += " (tightened live: see its policy_tightened record)"
		}
		fmt.Fprintf(w, "  %s %s: %s -> %s\n", policy.ShortDigest(sb.ID), who, policy.ShortDigest(sb.StartDigest), live)
	}
}

func writeProfileExplanation(w io.Writer, ex Explanation) {
	p := ex.Profile
	if pod := ex.Pod; pod != nil {
		fmt.Fprintf(w, "pod %s/%s\n", pod.Namespace, pod.Name)
		for _, ce := range pod.Containers {
			fmt.Fprintf(w, "\ncontainer %s\n  asks:    %s\n", ce.Name, ce.Asks)
			if ce.Refused != "" {
				fmt.Fprintf(w, "  REFUSED: %s\n", ce.Refused)
				continue
			}
			fmt.Fprintf(w, "  gets:    %s\n", ce.Gets)
			for _, ch := range ce.SpecChange {
				fmt.Fprintln(w, "    - "+ch)
			}
		}
		for _, n := range pod.Notes {
			fmt.Fprintln(w, "note: "+n)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "role %s (chain %s), digest %s\n", p.Role, strings.Join(p.Chain, " -> "), p.Digest)
	if len(p.Tightened) > 0 {
		fmt.Fprintf(w, "tightened by: %s\n", strings.Join(p.Tightened, ", "))
	}
	fmt.Fprintf(w, "\nfilesystem:  rootfs %s; writable %v (noexec %v); host mounts %s; masked %v\n",
		p.Filesystem.Rootfs, p.Filesystem.Writable, p.Filesystem.NoExecWritable, hostMounts(p.Filesystem.HostMounts), p.Filesystem.MaskedPaths)
	fmt.Fprintf(w, "network:     egress %s%s\n", p.Network.Egress, egressRules(p.Network.Allow))
	if pl, err := netpolicy.Compile(p); err == nil && pl.Enforced {
		fmt.Fprintf(w, "             nftables on the pod interface; metadata addresses denied: %s\n", strings.Join(pl.DeniedNames(), ", "))
		if pl.Resolver {
			answers := "no name"
			if hosts := pl.HostNames(); len(hosts) > 0 {
				answers = strings.Join(hosts, ", ")
			}
			fmt.Fprintf(w, "             DNS only through the pod's resolver, which answers %s and refuses every other name\n", answers)
		}
	}
	nnp := "no_new_privs always"
	if p.Process.AllowPrivilegeEscalation {
		nnp = "no_new_privs unless the pod allows privilege escalation"
	}
	fmt.Fprintf(w, "process:     uid %d gid %d unless the pod asks for users %s, groups %s; capabilities at most %v; at most %d processes; %s\n",
		p.Process.RunAsUser, p.Process.RunAsGroup, p.Process.AllowUsers, p.Process.AllowGroups, p.Process.Capabilities, p.Process.MaxProcesses, nnp)
	sp := p.Syscalls()
	fmt.Fprintf(w, "syscalls:    %s\n", sp)
	for _, c := range policy.BaselineSyscalls {
		state := "denied"
		for _, a := range sp.AllowedClasses {
			if a == c.Name {
				state = "ALLOWED by the role"
			}
		}
		fmt.Fprintf(w, "             %-11s %s: %s (%s)\n", c.Name, state, strings.Join(c.Syscalls, " "), c.Why)
	}
	if len(p.Process.DeniedSyscalls) > 0 {
		fmt.Fprintf(w, "             role also denies %v\n", p.Process.DeniedSyscalls)
	}
	fmt.Fprintf(w, "exec:        writable places are noexec%s; devices %v\n", orList(" except under ", p.Filesystem.AllowExec), p.Filesystem.Devices)
	var secrets []string
	for _, s := range p.Credentials.Secrets {
		if s.Inject != nil {
			format := s.Inject.Format
			if format == "" {
				format = policy.SecretToken
			}
			held := "never in the sandbox"
			if s.Env != "" {
				held = "the sandbox's " + s.Env + " holds a placeholder, refused if sent elsewhere"
			}
			secrets = append(secrets, fmt.Sprintf("%s: the gateway sets %s: %q on requests to %s over TLS (%s)", s.Source(), s.Inject.Header, format, s.Inject.Host, held))
			continue
		}
		secrets = append(secrets, fmt.Sprintf("%s <- %s (REACHES THE AGENT: it can read it and send it to any host it reaches; use inject to keep it outside)", s.Env, s.File))
	}
	if len(secrets) == 0 {
		secrets = []string{"none"}
	}
	fmt.Fprintf(w, "credentials: env allow %v; service-account token %v\n", p.Credentials.EnvAllow, p.Credentials.ServiceAccountToken)
	for _, s := range secrets {
		fmt.Fprintf(w, "  secret:    %s\n", s)
	}
	fmt.Fprintf(w, "limits:      cpu %s; memory %s; cpu time %s; open files %d; wall clock %s\n",
		orNone(p.Limits.CPUMillis > 0, fmt.Sprintf("%dm", p.Limits.CPUMillis)), orNone(p.Limits.MemoryBytes > 0, fmt.Sprintf("%d bytes", p.Limits.MemoryBytes)),
		orNone(p.Limits.CPUTimeSeconds > 0, fmt.Sprintf("%ds", p.Limits.CPUTimeSeconds)), p.Limits.OpenFiles, orNone(p.Limits.WallClock > 0, p.Limits.WallClock.String()))
	if b := p.Limits.Model; b.Any() {
		var bounds []string
		for _, x := range []struct {
			n    int64
			what string
		}{{b.Tokens, "tokens"}, {b.Requests, "calls"}, {b.RequestsPerMinute, "calls a minute"}} {
			if x.n > 0 {
				bounds = append(bounds, fmt.Sprintf("%d %s", x.n, x.what))
			}
		}
		if b.MaxOutput > 0 {
			bounds = append(bounds, fmt.Sprintf("an output cap of %d set on a call naming none", b.MaxOutput))
		}
		fmt.Fprintf(w, "             model budget %s (each call reserves its input's size and its output cap at the gateway; past it, the vendor's 429)\n", strings.Join(bounds, ", "))
	}
	if b := p.Limits.MCP; b.Calls > 0 || len(b.Tools) > 0 {
		var bounds []string
		if b.Calls > 0 {
			bounds = append(bounds, fmt.Sprintf("%d tools/call", b.Calls))
		}
		for _, t := range slices.Sorted(maps.Keys(b.Tools)) {
			bounds = append(bounds, fmt.Sprintf("%d of %s", b.Tools[t], t))
		}
		fmt.Fprintf(w, "             MCP budget, on each server: %s (past it, a JSON-RPC error)\n", strings.Join(bounds, ", "))
	}
	for _, r := range p.Network.Allow {
		if policy.IsModelAPI(r.API) {
			fmt.Fprintf(w, "audit:       model calls keep %s (audit.model)\n", p.Audit.Model)
			break
		}
	}
	if ex.Pod == nil {
		fmt.Fprintln(w, "\nOCI spec changes (on containerd's default spec):")
		for _, ch := range ex.SpecChange {
			fmt.Fprintln(w, "  - "+ch)
		}
	}
	fmt.Fprintln(w, "\nrunsc flags (the shim config's tuning flags, then the role's; the shim adds each sandbox's --pod-init-config):")
	keys := make([]string, 0, len(ex.RunscFlags))
	for k := range ex.RunscFlags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  --%s=%s\n", k, ex.RunscFlags[k])
	}
}

func orList(prefix string, l []string) string {
	if len(l) == 0 {
		return ""
	}
	return prefix + strings.Join(l, ", ")
}

func orNone(ok bool, s string) string {
	if ok {
		return s
	}
	return "unlimited"
}

func hostMounts(hm []policy.HostMount) string {
	if len(hm) == 0 {
		return "none"
	}
	var parts []string
	for _, m := range hm {
		mode := "rw"
		if m.ReadOnly != nil && *m.ReadOnly {
			mode = "ro"
		}
		parts = append(parts, m.Path+" ("+mode+")")
	}
	return strings.Join(parts, ", ")
}

func orAny(l []string) []string {
	if len(l) == 0 {
		return []string{"any"}
	}
	return l
}

func egressRules(rules []policy.EgressRule) string {
	if len(rules) == 0 {
		return ""
	}
	var parts []string
	for _, r := range rules {
		dst := r.Host
		if dst == "" {
			dst = r.CIDR
		}
		if len(r.Ports) > 0 {
			dst += fmt.Sprintf(" ports %v", r.Ports)
		}
		if r.HTTP != nil {
			dst += fmt.Sprintf(" (TLS terminated: methods %v, paths %v)", orAny(r.HTTP.Methods), orAny(r.HTTP.Paths))
		}
		if r.WebSocket {
			dst += " (websocket)"
		}
		switch {
		case r.API == policy.APIMCP && r.Tools != nil:
			dst += fmt.Sprintf(" (MCP server: TLS terminated, tools/call only of %v%s, other tools hidden from tools/list)", r.Tools.Allow, denied(r.Tools.Deny))
		case r.API != "":
			dst += fmt.Sprintf(" (model host, %s API: TLS terminated, each call recorded)", r.API)
		}
		parts = append(parts, dst)
	}
	return " to " + strings.Join(parts, "; ")
}

// containerd's CRI directories of the sample pod (default containerd root
// and state).
const (
	SampleSandboxDir      = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/ID"
	SampleSandboxStateDir = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/ID"
)

// denied says what an MCP rule denies among the tools it allows.
func denied(deny []string) string {
	if len(deny) == 0 {
		return ""
	}
	return fmt.Sprintf(" but %v", deny)
}
