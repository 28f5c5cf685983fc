package policy

// Inheritance: a role's spec with its parents' applied, nearest first.

import (
	"fmt"
	"strings"
)

// resolve returns the role's spec with its parents' applied, and the chain.
func (s *Set) resolve(name string) (RoleSpec, error) {
	var chain []*Role
	seen := map[string]bool{}
	for n := name; n != ""; {
		r, ok := s.Roles[n]
		if !ok {
			return RoleSpec{}, fmt.Errorf("role %q is not defined", n)
		}
		if seen[n] {
			var names []string
			for _, c := range chain {
				names = append(names, c.Metadata.Name)
			}
			return RoleSpec{}, fmt.Errorf("inheritance cycle: %s -> %s", strings.Join(names, " -> "), n)
		}
		seen[n] = true
		chain = append(chain, r)
		n = r.Spec.Inherits
	}
	var spec RoleSpec
	for i := len(chain) - 1; i >= 0; i-- {
		spec = mergeSpec(spec, chain[i].Spec)
	}
	return spec, nil
}

// mergeSpec applies child over parent: every field the child sets wins;
// lists replace, they do not append.
func mergeSpec(parent, child RoleSpec) RoleSpec {
	out := parent
	out.Inherits = child.Inherits
	if c := child.Filesystem; c != nil {
		m := Filesystem{}
		if parent.Filesystem != nil {
			m = *parent.Filesystem
		}
		pick(&m.Rootfs, c.Rootfs)
		pick(&m.NoExecWritable, c.NoExecWritable)
		pickSlice(&m.Writable, c.Writable)
		pickSlice(&m.HostMounts, c.HostMounts)
		pickSlice(&m.MaskedPaths, c.MaskedPaths)
		pickSlice(&m.AllowExec, c.AllowExec)
		pickSlice(&m.Devices, c.Devices)
		out.Filesystem = &m
	}
	if c := child.Network; c != nil {
		m := Network{}
		if parent.Network != nil {
			m = *parent.Network
		}
		pick(&m.Egress, c.Egress)
		pickSlice(&m.Allow, c.Allow)
		pickSlice(&m.PortForward, c.PortForward)
		out.Network = &m
	}
	if c := child.Process; c != nil {
		m := Process{}
		if parent.Process != nil {
			m = *parent.Process
		}
		pick(&m.MaxProcesses, c.MaxProcesses)
		pick(&m.RunAsUser, c.RunAsUser)
		pick(&m.RunAsGroup, c.RunAsGroup)
		pickSlice(&m.AllowUsers, c.AllowUsers)
		pickSlice(&m.AllowGroups, c.AllowGroups)
		pick(&m.AllowPrivilegeEscalation, c.AllowPrivilegeEscalation)
		pickSlice(&m.Capabilities, c.Capabilities)
		pickSlice(&m.DeniedSyscalls, c.DeniedSyscalls)
		pickSlice(&m.AllowSyscalls, c.AllowSyscalls)
		out.Process = &m
	}
	if c := child.Credentials; c != nil {
		m := Credentials{}
		if parent.Credentials != nil {
			m = *parent.Credentials
		}
		if c.Env != nil {
			m.Env = c.Env
		}
		pickSlice(&m.Secrets, c.Secrets)
		pick(&m.ServiceAccountToken, c.ServiceAccountToken)
		out.Credentials = &m
	}
	if c := child.Audit; c != nil {
		m := Audit{}
		if parent.Audit != nil {
			m = *parent.Audit
		}
		pick(&m.Process, c.Process)
		pick(&m.File, c.File)
		pick(&m.Network, c.Network)
		pick(&m.Model, c.Model)
		out.Audit = &m
	}
	if c := child.Limits; c != nil {
		m := Limits{}
		if parent.Limits != nil {
			m = *parent.Limits
		}
		pick(&m.CPU, c.CPU)
		pick(&m.Memory, c.Memory)
		pick(&m.CPUTime, c.CPUTime)
		pick(&m.OpenFiles, c.OpenFiles)
		pick(&m.WallClock, c.WallClock)
		pick(&m.Model, c.Model)
		pick(&m.MCP, c.MCP)
		out.Limits = &m
	}
	pick(&out.Template, child.Template)
	pick(&out.Suspend, child.Suspend)
	return out
}

func pick[T any](dst **T, v *T) {
	if v != nil {
		*dst = v
	}
}

func pickSlice[T any](dst *[]T, v []T) {
	if v != nil {
		*dst = v
	}
}
