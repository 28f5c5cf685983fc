package policy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"agentbox.dev/agentbox/internal/errkind"
)

// Annotations agentbox reads from pods and containers.
const (
	AnnotationPrefix = "agentbox.dev/"
	// RoleAnnotation names the role a pod (CRI) or container (ctr) claims.
	RoleAnnotation = "agentbox.dev/role"
	// RestoreAnnotation names a checkpoint in the node's store that a
	// sandbox (a pod, or a ctr container) restores from instead of booting.
	RestoreAnnotation = "agentbox.dev/restore-from"
)

// Tightening annotations: a pod may narrow its role with these, never widen
// it. Each has its own check.
const (
	WallClockAnnotation    = "agentbox.dev/wall-clock"
	MemoryAnnotation       = "agentbox.dev/memory"
	CPUAnnotation          = "agentbox.dev/cpu"
	MaxProcessesAnnotation = "agentbox.dev/max-processes"
	EgressAnnotation       = "agentbox.dev/egress"
)

// Request is what the runtime knows, and can trust, about a container.
type Request struct {
	// Annotations of the container's OCI spec (for CRI containers they
	// include the pod's forwarded agentbox.dev/* annotations).
	Annotations map[string]string `json:"annotations,omitempty"`
	// ContainerdNamespace is the containerd namespace (always known).
	ContainerdNamespace string `json:"containerdNamespace"`
	// PodNamespace is the Kubernetes namespace from the CRI; empty for
	// containers not created through the CRI.
	PodNamespace string `json:"podNamespace,omitempty"`
	// Handler is the runtime handler named in the shim config; may be empty.
	Handler string `json:"handler,omitempty"`
	// DefaultRole is used when no role is claimed.
	DefaultRole string `json:"defaultRole,omitempty"`
}

// RoleName returns the role the request claims, or the default.
func (r Request) RoleName() string {
	if v, ok := r.Annotations[RoleAnnotation]; ok {
		return v
	}
	return r.DefaultRole
}

// Select resolves the role a request claims, checks that the request may
// claim it, and compiles it with the request's tightening annotations. The
// error says which role and why.
func (s *Set) Select(req Request) (*Profile, error) {
	name := req.RoleName()
	if name == "" {
		return nil, errkind.InvalidArgument(fmt.Errorf("no %s annotation and no default role configured", RoleAnnotation))
	}
	if _, ok := s.Roles[name]; !ok {
		return nil, errkind.NotFound(fmt.Errorf("role %q is not defined in the policy (%d roles: %s)", name, len(s.Roles), strings.Join(s.roleNames(), ", ")))
	}
	if err := s.Authorize(name, req); err != nil {
		return nil, errkind.PermissionDenied(err)
	}
	p, err := s.Profile(name)
	if err != nil {
		return nil, errkind.InvalidArgument(fmt.Errorf("role %q: %w", name, err))
	}
	if err := p.tighten(req.Annotations); err != nil {
		return nil, errkind.PermissionDenied(fmt.Errorf("role %q: %w", name, err))
	}
	return p, nil
}

func (s *Set) roleNames() []string {
	var names []string
	for n := range s.Roles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Authorize reports whether some binding lets req claim role.
func (s *Set) Authorize(role string, req Request) error {
	for _, b := range s.Bindings {
		if b.Spec.Role != role {
			continue
		}
		for _, sub := range b.Spec.Subjects {
			if sub.Matches(req) {
				return nil
			}
		}
	}
	return fmt.Errorf("role %q is not bound to %s", role, req.describe())
}

func (r Request) describe() string {
	return r.String() + ": no RoleBinding subject matches"
}

// String names what the request is bound by.
func (r Request) String() string {
	var parts []string
	if r.PodNamespace != "" {
		parts = append(parts, fmt.Sprintf("pod namespace %q", r.PodNamespace))
	}
	parts = append(parts, fmt.Sprintf("containerd namespace %q", r.ContainerdNamespace))
	if r.Handler != "" {
		parts = append(parts, fmt.Sprintf("runtime handler %q", r.Handler))
	} else {
		parts = append(parts, "no runtime handler")
	}
	return strings.Join(parts, ", ")
}

// Matches: every field the subject sets must match; "*" matches any value
// that is present.
func (sub Subject) Matches(req Request) bool {
	return field(sub.Namespace, req.PodNamespace) &&
		field(sub.ContainerdNamespace, req.ContainerdNamespace) &&
		field(sub.RuntimeHandler, req.Handler)
}

func field(want, have string) bool {
	switch want {
	case "":
		return true
	case "*":
		return have != ""
	default:
		return want == have
	}
}

// tighteners are the agentbox.dev/* annotations a pod may narrow its role
// with, each with its own check: it may only narrow, never widen.
var tighteners = map[string]func(p *Profile, v string) error{
	WallClockAnnotation: func(p *Profile, v string) error {
		d, err := parseDuration(&v, 0)
		if err != nil {
			return err
		}
		if p.Limits.WallClock > 0 && d > p.Limits.WallClock {
			return fmt.Errorf("%s would raise wall-clock %v above the role's %v", v, d, p.Limits.WallClock)
		}
		p.Limits.WallClock = d
		return nil
	},
	MemoryAnnotation: func(p *Profile, v string) error {
		b, err := parseBytes(&v, 0)
		switch {
		case err != nil:
			return err
		case b < MinMemory:
			return fmt.Errorf("%s is below the %dMi a sandbox needs", v, MinMemory>>20)
		case p.Limits.MemoryBytes > 0 && b > p.Limits.MemoryBytes:
			return fmt.Errorf("%s would raise memory above the role's %d bytes", v, p.Limits.MemoryBytes)
		}
		p.Limits.MemoryBytes = b
		return nil
	},
	CPUAnnotation: func(p *Profile, v string) error {
		m, err := parseCPU(&v, 0)
		if err != nil {
			return err
		}
		if p.Limits.CPUMillis > 0 && m > p.Limits.CPUMillis {
			return fmt.Errorf("%s would raise CPU above the role's %dm", v, p.Limits.CPUMillis)
		}
		p.Limits.CPUMillis = m
		return nil
	},
	MaxProcessesAnnotation: func(p *Profile, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive number", v)
		}
		if n > p.Process.MaxProcesses {
			return fmt.Errorf("%d would raise maxProcesses above the role's %d", n, p.Process.MaxProcesses)
		}
		p.Process.MaxProcesses = n
		return nil
	},
	EgressAnnotation: func(p *Profile, v string) error {
		switch {
		case v == p.Network.Egress:
		case v == EgressNone:
			p.Network.Egress, p.Network.Allow = EgressNone, []EgressRule{}
		default:
			return fmt.Errorf("%q: a pod may only narrow egress to none (the role allows %s)", v, p.Network.Egress)
		}
		return nil
	},
}

// tighten applies agentbox.dev/* annotations, each of which may only narrow
// the profile. Unknown agentbox.dev/* keys are refused, so a typo cannot
// silently leave a pod looser than its author meant.
func (p *Profile) tighten(ann map[string]string) error {
	keys := make([]string, 0, len(ann))
	for k := range ann {
		if strings.HasPrefix(k, AnnotationPrefix) && k != RoleAnnotation && k != RestoreAnnotation {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := ann[k]
		apply, ok := tighteners[k]
		if !ok {
			known := []string{RoleAnnotation, RestoreAnnotation}
			for t := range tighteners {
				known = append(known, t)
			}
			sort.Strings(known)
			return fmt.Errorf("annotation %s: unknown annotation (agentbox reads %s)", k, strings.Join(known, ", "))
		}
		if err := apply(p, v); err != nil {
			return fmt.Errorf("annotation %s: %w", k, err)
		}
		p.Tightened = append(p.Tightened, k+"="+v)
	}
	if len(p.Tightened) > 0 {
		p.seal()
	}
	return nil
}
