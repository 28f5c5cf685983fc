package policy

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"agentbox.dev/agentbox/internal/errkind"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SafeSysctls are the sysctls a pod may set: Kubernetes' safe set, each
// namespaced to the pod (and, under gVisor, to its sandbox).
var SafeSysctls = map[string]bool{
	"kernel.shm_rmid_forced":              true,
	"net.ipv4.ip_local_port_range":        true,
	"net.ipv4.ip_local_reserved_ports":    true,
	"net.ipv4.ip_unprivileged_port_start": true,
	"net.ipv4.ping_group_range":           true,
	"net.ipv4.tcp_syncookies":             true,
	"net.ipv4.tcp_keepalive_time":         true,
	"net.ipv4.tcp_fin_timeout":            true,
	"net.ipv4.tcp_keepalive_intvl":        true,
	"net.ipv4.tcp_keepalive_probes":       true,
}

// Namespaces a container must have of its own (or its pod's): without them
// it would share the host's network, processes or IPC.
var requiredNamespaces = []struct {
	typ  specs.LinuxNamespaceType
	what string
}{
	{specs.NetworkNamespace, "host network"},
	{specs.PIDNamespace, "host PID"},
	{specs.IPCNamespace, "host IPC"},
}

// checkHostOptions refuses what a pod author may ask for that reaches
// around the sandbox: host namespaces, privileged device access, devices
// and sysctls the role does not allow. Each error names the spec field.
func (p *Profile) checkHostOptions(s *specs.Spec) (string, error) {
	var errs []error
	if s.Linux == nil {
		return "", errkind.PermissionDenied(errors.New("linux: the spec has no linux section (no namespaces): agentbox runs only namespaced containers"))
	}
	have := map[specs.LinuxNamespaceType]bool{}
	for _, ns := range s.Linux.Namespaces {
		have[ns.Type] = true
	}
	for _, r := range requiredNamespaces {
		if !have[r.typ] {
			errs = append(errs, fmt.Errorf("linux.namespaces: no %s namespace (%s): agentbox does not run pods in the host's namespaces", r.typ, r.what))
		}
	}
	privileged := false
	if r := s.Linux.Resources; r != nil {
		for i, d := range r.Devices {
			if d.Allow && (d.Type == "" || d.Type == "a") && d.Major == nil && d.Minor == nil {
				privileged = true
				errs = append(errs, fmt.Errorf("linux.resources.devices[%d]: allows every device (a privileged container): agentbox does not run privileged containers", i))
			}
		}
	}
	allowedDev := map[string]bool{}
	for _, d := range p.Filesystem.Devices {
		allowedDev[d] = true
	}
	for i, d := range s.Linux.Devices {
		// A privileged container lists every host device: said once above.
		if !allowedDev[d.Path] && !privileged {
			errs = append(errs, fmt.Errorf("linux.devices[%d]: device %s is not allowed by role %q (filesystem.devices)", i, d.Path, p.Role))
		}
	}
	var keys []string
	for k := range s.Linux.Sysctl {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !SafeSysctls[k] {
			errs = append(errs, fmt.Errorf("linux.sysctl[%q]: not a safe sysctl (agentbox accepts %s)", k, strings.Join(safeSysctlNames(), ", ")))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return "", errkind.PermissionDenied(fmt.Errorf("host options refused: %w", err))
	}
	return "", nil
}

func safeSysctlNames() []string {
	var out []string
	for k := range SafeSysctls {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
