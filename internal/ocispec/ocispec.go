// Package ocispec holds the pure rewrites the shim applies to a container's
// OCI spec before runsc sees it. Each rewrite is a small function that
// reports whether it changed anything; none does I/O.
package ocispec

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Annotations that tell runsc whether a container is a sandbox root or joins
// an existing sandbox.
const (
	ContainerTypeAnnotation     = "io.kubernetes.cri.container-type"
	SandboxIDAnnotation         = "io.kubernetes.cri.sandbox-id"
	CRIOContainerTypeAnnotation = "io.kubernetes.cri-o.ContainerType"
	CRIOSandboxIDAnnotation     = "io.kubernetes.cri-o.SandboxID"
	// SandboxNamespaceAnnotation is the pod's Kubernetes namespace, set by
	// containerd's CRI from the pod metadata.
	SandboxNamespaceAnnotation = "io.kubernetes.cri.sandbox-namespace"
	// SandboxNameAnnotation is the pod's name.
	SandboxNameAnnotation = "io.kubernetes.cri.sandbox-name"
	// SandboxUIDAnnotation is the pod's UID, set by containerd's CRI from
	// the pod metadata (the API server assigns it).
	SandboxUIDAnnotation = "io.kubernetes.cri.sandbox-uid"

	ContainerTypeSandbox   = "sandbox"
	ContainerTypeContainer = "container"
)

// Rewrite is one change to a spec. It returns a description of what it
// changed, or "" when it left the spec alone.
type Rewrite func(s *specs.Spec) (string, error)

// Apply runs rewrites in order and returns the descriptions of the changes
// made.
func Apply(s *specs.Spec, rewrites ...Rewrite) ([]string, error) {
	var changes []string
	for _, rw := range rewrites {
		msg, err := rw(s)
		if err != nil {
			return changes, err
		}
		if msg != "" {
			changes = append(changes, msg)
		}
	}
	return changes, nil
}

// IsSandboxContainerOf reports whether s asks to join another container's
// sandbox, and that sandbox's id.
func IsSandboxContainerOf(s *specs.Spec) (string, bool) {
	if s.Annotations[ContainerTypeAnnotation] == ContainerTypeContainer {
		return s.Annotations[SandboxIDAnnotation], true
	}
	if s.Annotations[CRIOContainerTypeAnnotation] == ContainerTypeContainer {
		return s.Annotations[CRIOSandboxIDAnnotation], true
	}
	return "", false
}

// MarkSandboxRoot makes a container that carries no container-type
// annotation (plain ctr, nerdctl, BuildKit) the root of its own sandbox.
//
// gVisor's task service only hands the container's stdio to `runsc create`
// for sandbox roots; without the annotation the sandbox process inherits the
// pipe the shim reads runsc's output from, and Create never returns.
func MarkSandboxRoot(s *specs.Spec) (string, error) {
	if _, ok := s.Annotations[ContainerTypeAnnotation]; ok {
		return "", nil
	}
	if _, ok := s.Annotations[CRIOContainerTypeAnnotation]; ok {
		return "", nil
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[ContainerTypeAnnotation] = ContainerTypeSandbox
	return "no container-type annotation: container is the root of its own sandbox", nil
}

// RaiseOOMScoreAdj returns a rewrite that raises process.oomScoreAdj to
// floor when the spec asks for less. Use it when the host refuses to lower
// oom_score_adj (no CAP_SYS_RESOURCE): runsc would otherwise fail the start.
func RaiseOOMScoreAdj(floor int) Rewrite {
	return func(s *specs.Spec) (string, error) {
		if s.Process == nil || s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj >= floor {
			return "", nil
		}
		asked := *s.Process.OOMScoreAdj
		v := floor
		s.Process.OOMScoreAdj = &v
		return fmt.Sprintf("process.oomScoreAdj raised from %d to %d: the host refuses to lower oom_score_adj", asked, floor), nil
	}
}

// GVisorAnnotationPrefix marks annotations runsc reads as flag and spec
// overrides (dev.gvisor.flag.*, dev.gvisor.spec.*).
const GVisorAnnotationPrefix = "dev.gvisor."

// StripGVisorAnnotations removes every dev.gvisor.* annotation. They can
// loosen the sandbox (runsc flags, extra mounts), so they come from the
// shim's policy only, never from a pod or a ctr user.
func StripGVisorAnnotations(s *specs.Spec) (string, error) {
	var removed []string
	for k := range s.Annotations {
		if strings.HasPrefix(k, GVisorAnnotationPrefix) {
			removed = append(removed, k)
			delete(s.Annotations, k)
		}
	}
	if len(removed) == 0 {
		return "", nil
	}
	sort.Strings(removed)
	return "removed runtime-override annotations " + strings.Join(removed, ", "), nil
}

// ResolvConfPath is where a container reads its resolver configuration.
const ResolvConfPath = "/etc/resolv.conf"

// ResolvConfSource returns the host file mounted at /etc/resolv.conf, if
// any (CRI mounts the pod's).
func ResolvConfSource(s *specs.Spec) string { return MountSource(s, ResolvConfPath) }

// HostsPath is where a container reads its hosts file.
const HostsPath = "/etc/hosts"

// MountSource is the source of the bind mount at dst ("" when there is
// none).
func MountSource(s *specs.Spec, dst string) string {
	for _, m := range s.Mounts {
		if filepath.Clean(m.Destination) == dst && m.Type == "bind" {
			return m.Source
		}
	}
	return ""
}

// MountResolvConf returns a rewrite that mounts path read-only at
// /etc/resolv.conf in place of any other resolv.conf mount.
func MountResolvConf(path string) Rewrite {
	return func(s *specs.Spec) (string, error) {
		replaced, err := MountFile(ResolvConfPath, path)(s)
		if replaced != "" {
			return fmt.Sprintf("%s: %s replaced by the pod's resolver configuration %s", ResolvConfPath, replaced, path), err
		}
		return fmt.Sprintf("%s: the pod's resolver configuration %s mounted", ResolvConfPath, path), err
	}
}

// MountFile returns a rewrite that bind-mounts path read-only at dst in
// place of every other mount there; its message is the source it replaced
// ("" when there was none).
func MountFile(dst, path string) Rewrite {
	return func(s *specs.Spec) (string, error) {
		mount := specs.Mount{Destination: dst, Type: "bind", Source: path, Options: []string{"rbind", "ro"}}
		replaced, kept := "", s.Mounts[:0]
		for _, m := range s.Mounts {
			if filepath.Clean(m.Destination) == dst {
				if replaced == "" {
					replaced = m.Source
				}
				continue
			}
			kept = append(kept, m)
		}
		s.Mounts = append(kept, mount)
		return replaced, nil
	}
}

// plainUID says whether uid is a plain pod UID: 1 to 128 of A-Z, a-z,
// 0-9 and '-', not starting with '-'. (A loop, not a regular expression:
// this package is in every shim process, and compiling one with a
// repetition count cost each of them 0.4 ms at init.)
func plainUID(uid string) bool {
	if len(uid) == 0 || len(uid) > 128 || uid[0] == '-' {
		return false
	}
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// PodUID returns the pod UID of a CRI sandbox spec ("" when it carries
// none), refusing one that is not a plain UID: it becomes a path component.
func PodUID(s *specs.Spec) (string, error) {
	uid, ok := s.Annotations[SandboxUIDAnnotation]
	if !ok {
		return "", nil
	}
	if !plainUID(uid) {
		return "", fmt.Errorf("annotation %s: %q is not a pod UID", SandboxUIDAnnotation, uid)
	}
	return uid, nil
}
