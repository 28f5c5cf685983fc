package explain

import (
	"fmt"
	"io"
	"os"
	"path"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.yaml.in/yaml/v3"

	"agentbox.dev/agentbox/internal/policy"
)

// A Kubernetes Pod, read for `policy explain --pod`: what the kubelet and
// containerd's CRI turn into each container's OCI spec. Only the fields
// that reach the spec are read; in a securityContext, a field explain does
// not know is an error naming it (it may matter), elsewhere unknown fields
// are ignored (ports, probes, env sources do not reach the runtime's
// decisions).
type kubePod struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		UID         string            `yaml:"uid"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		HostNetwork                  bool            `yaml:"hostNetwork"`
		HostPID                      bool            `yaml:"hostPID"`
		HostIPC                      bool            `yaml:"hostIPC"`
		AutomountServiceAccountToken *bool           `yaml:"automountServiceAccountToken"`
		SecurityContext              yaml.Node       `yaml:"securityContext"`
		InitContainers               []kubeContainer `yaml:"initContainers"`
		Containers                   []kubeContainer `yaml:"containers"`
		Volumes                      []kubeVolume    `yaml:"volumes"`
	} `yaml:"spec"`
}

type kubeContainer struct {
	Name            string    `yaml:"name"`
	SecurityContext yaml.Node `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
	Resources struct {
		Limits map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

type kubeVolume struct {
	Name     string                 `yaml:"name"`
	HostPath *struct{ Path string } `yaml:"hostPath"`
	EmptyDir *yaml.Node             `yaml:"emptyDir"`
	// The kubelet's directory for each kind of volume it writes.
	ConfigMap   *yaml.Node `yaml:"configMap"`
	Secret      *yaml.Node `yaml:"secret"`
	Projected   *yaml.Node `yaml:"projected"`
	DownwardAPI *yaml.Node `yaml:"downwardAPI"`
}

type seccompProfile struct {
	Type             string `yaml:"type"`
	LocalhostProfile string `yaml:"localhostProfile"`
}

type podSecurityContext struct {
	RunAsUser                *int64                         `yaml:"runAsUser"`
	RunAsGroup               *int64                         `yaml:"runAsGroup"`
	RunAsNonRoot             *bool                          `yaml:"runAsNonRoot"`
	SupplementalGroups       []int64                        `yaml:"supplementalGroups"`
	SupplementalGroupsPolicy string                         `yaml:"supplementalGroupsPolicy"`
	FSGroup                  *int64                         `yaml:"fsGroup"`
	FSGroupChangePolicy      string                         `yaml:"fsGroupChangePolicy"`
	Sysctls                  []struct{ Name, Value string } `yaml:"sysctls"`
	SeccompProfile           *seccompProfile                `yaml:"seccompProfile"`
	SELinuxOptions           *yaml.Node                     `yaml:"seLinuxOptions"`
	SELinuxChangePolicy      string                         `yaml:"seLinuxChangePolicy"`
	WindowsOptions           *yaml.Node                     `yaml:"windowsOptions"`
	AppArmorProfile          *yaml.Node                     `yaml:"appArmorProfile"`
}

type containerSecurityContext struct {
	Capabilities *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
	Privileged               *bool           `yaml:"privileged"`
	RunAsUser                *int64          `yaml:"runAsUser"`
	RunAsGroup               *int64          `yaml:"runAsGroup"`
	RunAsNonRoot             *bool           `yaml:"runAsNonRoot"`
	ReadOnlyRootFilesystem   *bool           `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool           `yaml:"allowPrivilegeEscalation"`
	ProcMount                string          `yaml:"procMount"`
	SeccompProfile           *seccompProfile `yaml:"seccompProfile"`
	SELinuxOptions           *yaml.Node      `yaml:"seLinuxOptions"`
	WindowsOptions           *yaml.Node      `yaml:"windowsOptions"`
	AppArmorProfile          *yaml.Node      `yaml:"appArmorProfile"`
}

// decodeKnown decodes node into v (a pointer to a struct), first refusing
// any key v's struct does not declare: field names the node's path in the
// error.
func decodeKnown(node *yaml.Node, field string, v any) error {
	if node == nil || node.Kind == 0 {
		return nil
	}
	if node.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: not a mapping", field)
	}
	known := yamlKeys(reflect.TypeOf(v).Elem())
	for i := 0; i+1 < len(node.Content); i += 2 {
		k := node.Content[i].Value
		if !slices.Contains(known, k) {
			return fmt.Errorf("%s.%s: unknown field (known: %s)", field, k, strings.Join(known, ", "))
		}
	}
	if err := node.Decode(v); err != nil {
		return fmt.Errorf("%s: %v", field, err)
	}
	return nil
}

// yamlKeys lists, sorted, the keys a struct type's yaml tags name.
func yamlKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// podContainer is one container of the pod: what it asks for, and the OCI
// spec the CRI would hand the runtime.
type podContainer struct {
	Name string      `json:"name"`
	Asks string      `json:"asks"`
	Spec *specs.Spec `json:"-"`
	// Err: the kubelet or containerd would refuse it before agentbox.
	Err error `json:"-"`
}

// ImageUser is the image's USER as uid[:gid], which explain cannot read.
type ImageUser struct{ uid, gid uint32 }

// ParseImageUser reads --image-user: UID or UID:GID, numbers.
func ParseImageUser(s string) (ImageUser, error) {
	u, g, hasGID := strings.Cut(s, ":")
	uid, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		return ImageUser{}, fmt.Errorf("--image-user %q: want UID or UID:GID (numbers)", s)
	}
	gid := uint64(0)
	if hasGID {
		if gid, err = strconv.ParseUint(g, 10, 32); err != nil {
			return ImageUser{}, fmt.Errorf("--image-user %q: want UID or UID:GID (numbers)", s)
		}
	}
	return ImageUser{uint32(uid), uint32(gid)}, nil
}

// readPod reads a Pod manifest (YAML or JSON; "-" is standard input).
func readPod(file string, stdin io.Reader) (*kubePod, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, err
	}
	var pod kubePod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if pod.Kind != "Pod" || pod.APIVersion != "v1" {
		return nil, fmt.Errorf("%s: kind %q apiVersion %q: want a v1 Pod", file, pod.Kind, pod.APIVersion)
	}
	if len(pod.Spec.Containers) == 0 {
		return nil, fmt.Errorf("%s: spec.containers: a pod has at least one container", file)
	}
	if pod.Metadata.Namespace == "" {
		pod.Metadata.Namespace = "default"
	}
	if pod.Metadata.UID == "" {
		pod.Metadata.UID = "UID"
	}
	return &pod, nil
}

// containers turns the pod into one OCI spec per container, as the kubelet
// and containerd's CRI would (containerd 2.x defaults), and says what each
// asks for.
func (pod *kubePod) containers(base func() *specs.Spec, env policy.MountEnv, img ImageUser) ([]podContainer, []string, error) {
	var psc podSecurityContext
	if err := decodeKnown(&pod.Spec.SecurityContext, "spec.securityContext", &psc); err != nil {
		return nil, nil, err
	}
	var notes []string
	if psc.SELinuxOptions != nil || psc.AppArmorProfile != nil {
		notes = append(notes, "spec.securityContext: SELinux and AppArmor labels are not applied under gVisor (its Sentry is the boundary)")
	}
	if psc.WindowsOptions != nil {
		notes = append(notes, "spec.securityContext.windowsOptions: ignored on Linux")
	}
	volumes := map[string]kubeVolume{}
	for i, v := range pod.Spec.Volumes {
		if _, err := volumeSource(v, env.PodDir); err != nil {
			return nil, nil, fmt.Errorf("spec.volumes[%d] (%s): %v", i, v.Name, err)
		}
		volumes[v.Name] = v
	}
	var out []podContainer
	all := append(append([]kubeContainer(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i, c := range all {
		field := fmt.Sprintf("spec.containers[%d]", i-len(pod.Spec.InitContainers))
		if i < len(pod.Spec.InitContainers) {
			field = fmt.Sprintf("spec.initContainers[%d]", i)
		}
		var csc containerSecurityContext
		if err := decodeKnown(&c.SecurityContext, field+".securityContext", &csc); err != nil {
			return nil, nil, err
		}
		if csc.SELinuxOptions != nil || csc.AppArmorProfile != nil {
			notes = append(notes, field+".securityContext: SELinux and AppArmor labels are not applied under gVisor (its Sentry is the boundary)")
		}
		pc := podContainer{Name: c.Name}
		pc.Spec, pc.Asks, pc.Err = pod.containerSpec(base(), env, img, psc, csc, c, field, volumes)
		out = append(out, pc)
	}
	return out, notes, nil
}

func volumeSource(v kubeVolume, podDir string) (string, error) {
	kubelet := func(kind string) string { return path.Join(podDir, "volumes", kind, v.Name) }
	switch {
	case v.HostPath != nil:
		if !path.IsAbs(v.HostPath.Path) {
			return "", fmt.Errorf("hostPath.path %q is not absolute", v.HostPath.Path)
		}
		return v.HostPath.Path, nil
	case v.EmptyDir != nil:
		return kubelet("kubernetes.io~empty-dir"), nil
	case v.ConfigMap != nil:
		return kubelet("kubernetes.io~configmap"), nil
	case v.Secret != nil:
		return kubelet("kubernetes.io~secret"), nil
	case v.Projected != nil:
		return kubelet("kubernetes.io~projected"), nil
	case v.DownwardAPI != nil:
		return kubelet("kubernetes.io~downward-api"), nil
	}
	return "", fmt.Errorf("a volume type explain does not model (hostPath, emptyDir, configMap, secret, projected, downwardAPI)")
}

func (pod *kubePod) containerSpec(s *specs.Spec, env policy.MountEnv, img ImageUser, psc podSecurityContext, csc containerSecurityContext,
	c kubeContainer, field string, volumes map[string]kubeVolume) (*specs.Spec, string, error) {
	var asks []string
	// Identity: the container's, else the pod's, else the image's USER.
	uid, gid := int64(img.uid), int64(img.gid)
	userFrom := "the image's USER (--image-user)"
	runAsUser, runAsGroup := csc.RunAsUser, csc.RunAsGroup
	if runAsUser == nil {
		runAsUser = psc.RunAsUser
	}
	if runAsGroup == nil {
		runAsGroup = psc.RunAsGroup
	}
	if runAsUser != nil {
		uid, gid, userFrom = *runAsUser, 0, "runAsUser"
	}
	if runAsGroup != nil {
		if runAsUser == nil && img.uid == 0 {
			return nil, "", fmt.Errorf("%s: runAsGroup without runAsUser: containerd refuses it (it cannot pair a group with the image's user name)", field)
		}
		gid = *runAsGroup
	}
	for name, id := range map[string]int64{"uid": uid, "gid": gid} {
		if id < 0 || id >= 1<<32-1 {
			return nil, "", fmt.Errorf("%s: %s %d is not a valid id", field, name, id)
		}
	}
	nonRoot := csc.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = psc.RunAsNonRoot
	}
	if nonRoot != nil && *nonRoot && uid == 0 {
		return nil, "", fmt.Errorf("%s: runAsNonRoot with uid 0: the kubelet refuses to start it", field)
	}
	groups := []uint32{uint32(gid)}
	var extra []int64
	extra = append(extra, psc.SupplementalGroups...)
	if psc.FSGroup != nil {
		extra = append(extra, *psc.FSGroup)
	}
	for _, g := range extra {
		if g < 0 || g >= 1<<32-1 {
			return nil, "", fmt.Errorf("spec.securityContext: group %d is not a valid id", g)
		}
		if !slices.Contains(groups, uint32(g)) {
			groups = append(groups, uint32(g))
		}
	}
	s.Process.User = specs.User{UID: uint32(uid), GID: uint32(gid), AdditionalGids: groups}
	asks = append(asks, fmt.Sprintf("uid %d gid %d groups %v (from %s)", uid, gid, groups, userFrom))

	// Capabilities: containerd's defaults, then add ALL, drop ALL, the
	// named additions, the named drops (internal/cri/opts.WithCapabilities).
	privileged := csc.Privileged != nil && *csc.Privileged
	caps := append([]string(nil), policy.RuntimeDefaultCapabilities...)
	capsAsk := "the runtime's default capabilities"
	if privileged {
		caps = policy.AllCapabilities()
		capsAsk = "privileged (every capability and device)"
		s.Linux.Resources = &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}}
	} else if cc := csc.Capabilities; cc != nil {
		norm := func(l []string) ([]string, bool, error) {
			var out []string
			all := false
			for _, n := range l {
				if strings.ToUpper(n) == "ALL" {
					all = true
					continue
				}
				u, ok := policy.CapabilityName(n)
				if !ok {
					return nil, false, fmt.Errorf("%s.securityContext.capabilities: %q is not a Linux capability", field, n)
				}
				out = append(out, u)
			}
			return out, all, nil
		}
		add, addAll, err := norm(cc.Add)
		if err != nil {
			return nil, "", err
		}
		drop, dropAll, err := norm(cc.Drop)
		if err != nil {
			return nil, "", err
		}
		if addAll {
			caps = policy.AllCapabilities()
		}
		if dropAll {
			caps = nil
		}
		for _, a := range add {
			if !slices.Contains(caps, a) {
				caps = append(caps, a)
			}
		}
		var kept []string
		for _, c := range caps {
			if !slices.Contains(drop, c) {
				kept = append(kept, c)
			}
		}
		caps = kept
		capsAsk = fmt.Sprintf("capabilities add %v drop %v", cc.Add, cc.Drop)
	}
	sort.Strings(caps)
	s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	asks = append(asks, capsAsk)

	// no_new_privs: set only by allowPrivilegeEscalation: false.
	s.Process.NoNewPrivileges = csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation && !privileged
	asks = append(asks, fmt.Sprintf("no_new_privs %v", s.Process.NoNewPrivileges))
	s.Root.Readonly = csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem
	asks = append(asks, fmt.Sprintf("read-only root %v", s.Root.Readonly))
	switch csc.ProcMount {
	case "", "Default":
	default:
		return nil, "", fmt.Errorf("%s.securityContext.procMount: %q is not modelled by explain (Default only)", field, csc.ProcMount)
	}

	// Seccomp: the container's profile, else the pod's; none is
	// Unconfined (the kubelet's default without SeccompDefault).
	sp, spField := csc.SeccompProfile, field+".securityContext.seccompProfile"
	if sp == nil {
		sp, spField = psc.SeccompProfile, "spec.securityContext.seccompProfile"
	}
	kind := "Unconfined"
	if sp != nil {
		kind = sp.Type
	}
	switch kind {
	case "Unconfined":
		s.Linux.Seccomp = nil
	case "RuntimeDefault":
		s.Linux.Seccomp = seccomp.DefaultProfile(s)
	case "Localhost":
		if sp.LocalhostProfile == "" {
			return nil, "", fmt.Errorf("%s: type Localhost without localhostProfile", spField)
		}
		// The node's file is not read here: a deny-nothing stand-in
		// shows where the role's rules go.
		s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
		kind += " " + sp.LocalhostProfile + " (the node's file, not read by explain)"
	default:
		return nil, "", fmt.Errorf("%s.type %q is not Unconfined, RuntimeDefault or Localhost", spField, kind)
	}
	asks = append(asks, "seccomp "+kind)

	// Host namespaces: the pod's sandbox shares the host's.
	var ns []specs.LinuxNamespace
	for _, n := range s.Linux.Namespaces {
		if (n.Type == specs.NetworkNamespace && pod.Spec.HostNetwork) || (n.Type == specs.PIDNamespace && pod.Spec.HostPID) || (n.Type == specs.IPCNamespace && pod.Spec.HostIPC) {
			continue
		}
		ns = append(ns, n)
	}
	s.Linux.Namespaces = ns
	for _, sc := range psc.Sysctls {
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		s.Linux.Sysctl[sc.Name] = sc.Value
	}

	// Resources: limits become the container's cgroup limits.
	for _, res := range []string{"memory", "cpu"} {
		v, ok := c.Resources.Limits[res]
		if !ok {
			continue
		}
		parse := policy.ParseMemory
		if res == "cpu" {
			parse = policy.ParseCPU
		}
		n, err := parse(v)
		if err != nil {
			return nil, "", fmt.Errorf("%s.resources.limits.%s: %v", field, res, err)
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		if res == "memory" {
			s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &n}
		} else {
			quota, period := n*100, uint64(100000)
			s.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
		}
		asks = append(asks, res+" "+v)
	}

	// Mounts: the pod's volumes, the kubelet's /etc/hosts and termination
	// log, and the service-account token unless the pod opts out.
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: path.Join(env.PodDir, "etc-hosts"), Options: []string{"rbind", "rw"}},
		specs.Mount{Destination: "/dev/termination-log", Type: "bind", Source: path.Join(env.PodDir, "containers", c.Name, "ID"), Options: []string{"rbind", "rw"}})
	for i, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			return nil, "", fmt.Errorf("%s.volumeMounts[%d]: no volume %q", field, i, vm.Name)
		}
		src, _ := volumeSource(v, env.PodDir)
		if vm.SubPath != "" {
			src = path.Join(src, vm.SubPath)
		}
		mode := "rw"
		if vm.ReadOnly {
			mode = "ro"
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: src, Options: []string{"rbind", mode}})
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind",
			Source: path.Join(env.PodDir, "volumes/kubernetes.io~projected/kube-api-access-x"), Options: []string{"rbind", "ro"}})
	}
	return s, strings.Join(asks, "; "), nil
}
