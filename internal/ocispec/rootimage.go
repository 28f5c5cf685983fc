package ocispec

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// gVisor's annotations for a root filesystem runsc mounts from an image
// file rather than through a gofer.
const (
	RootfsSourceAnnotation = "dev.gvisor.spec.rootfs.source"
	RootfsTypeAnnotation   = "dev.gvisor.spec.rootfs.type"
)

// podFiles are the per-pod files CRI and the shim bind into every
// container of a pod; a pod's pause process reads none of them.
var podFiles = []string{"/etc/hostname", HostsPath, ResolvConfPath}

// RootFromImage returns the rewrite that has runsc mount a pod's pause
// container's root from the read-only EROFS image at path: the root
// becomes read-only and the pod's files bound into it (hostname, hosts,
// resolv.conf) are dropped. runsc then starts no gofer for the container
// unless a host mount is left (gVisor's shim turns CRI's /dev/shm into a
// pod-shared tmpfs; any other would be served by a gofer, as before). It
// refuses, changing nothing, a spec that names a root image of its own.
func RootFromImage(path string) Rewrite {
	return func(s *specs.Spec) (string, error) {
		if s.Root == nil {
			return "", fmt.Errorf("the spec has no root")
		}
		for _, k := range []string{RootfsSourceAnnotation, RootfsTypeAnnotation} {
			if v, ok := s.Annotations[k]; ok {
				return "", fmt.Errorf("the spec already sets %s=%q", k, v)
			}
		}
		var kept []specs.Mount
		var dropped, left []string
		for _, m := range s.Mounts {
			dst := filepath.Clean(m.Destination)
			switch {
			case !hostMount(m):
			case slices.Contains(podFiles, dst):
				dropped = append(dropped, dst)
				continue
			case dst != "/dev/shm":
				left = append(left, dst)
			}
			kept = append(kept, m)
		}
		s.Mounts = kept
		s.Root.Readonly = true
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[RootfsSourceAnnotation] = path
		s.Annotations[RootfsTypeAnnotation] = "erofs"
		msg := fmt.Sprintf("the pause container's root is the node's read-only image %s", path)
		if len(dropped) > 0 {
			msg += "; its unused " + strings.Join(dropped, ", ") + " dropped"
		}
		if len(left) > 0 {
			msg += "; a gofer still serves its host mounts at " + strings.Join(left, ", ")
		}
		return msg, nil
	}
}

// hostMount says whether runsc serves m from the host through a gofer (a
// bind mount by type or option, as gVisor reads it) or from an image.
func hostMount(m specs.Mount) bool {
	if m.Type == "bind" || m.Type == "rbind" || m.Type == "erofs" {
		return true
	}
	return slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
