package mountguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/policy"
)

// KindBeneath says what rel is beneath root (rel "": root itself), without
// following any symlink: absent, a directory, or anything else.
func KindBeneath(root, rel string) (policy.PathKind, error) {
	fd, err := Open(root, rel)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return policy.PathAbsent, nil
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return policy.PathDir, nil
	}
	return policy.PathFile, nil
}

// Layers are the directories a container's root filesystem is made of,
// topmost first: an overlay's upperdir then its lowerdirs, or the one
// directory of a bind (or already mounted) rootfs.
type Layers []string

// RootfsMount is one of a task's rootfs mounts, as containerd sends them.
type RootfsMount struct {
	Type, Source string
	Options      []string
}

// LayersOf reads the layers from a task's rootfs mounts; none means the
// rootfs is already mounted at bundle/rootfs.
func LayersOf(bundle string, mounts []RootfsMount) (Layers, error) {
	switch {
	case len(mounts) == 0:
		return Layers{filepath.Join(bundle, "rootfs")}, nil
	case len(mounts) > 1:
		return nil, fmt.Errorf("a rootfs of %d mounts", len(mounts))
	}
	m := mounts[0]
	switch m.Type {
	case "bind", "rbind":
		return Layers{m.Source}, nil
	case "overlay":
		var upper string
		var lower []string
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = v
			}
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				lower = strings.Split(v, ":")
			}
		}
		if len(lower) == 0 {
			return nil, errors.New("an overlay rootfs without lowerdir")
		}
		var l Layers
		if upper != "" {
			l = append(l, upper)
		}
		for _, d := range append(l, lower...) {
			if !filepath.IsAbs(d) {
				return nil, fmt.Errorf("overlay layer %q is not an absolute path", d)
			}
		}
		return append(l, lower...), nil
	}
	return nil, fmt.Errorf("a rootfs of type %q", m.Type)
}

// Kind says what rel (no leading "/") is in the merged view of the layers,
// with overlayfs's rules: the topmost layer that has it decides, a
// whiteout (a 0/0 character device) hides it, and an opaque directory
// hides what the layers below have under it. A symlink on the way is an
// error: what it would resolve to inside the container is not known here.
func (l Layers) Kind(rel string) (policy.PathKind, error) {
	comps := strings.Split(filepath.Clean("/" + rel)[1:], "/")
	if comps[0] == "" {
		return policy.PathDir, nil
	}
	for _, layer := range l {
		opaque := false
		p := layer
		for i, c := range comps {
			p = filepath.Join(p, c)
			var st unix.Stat_t
			err := unix.Lstat(p, &st)
			if errors.Is(err, unix.ENOENT) {
				if opaque {
					return policy.PathAbsent, nil
				}
				break // the layers below decide
			}
			if err != nil {
				return 0, fmt.Errorf("layer %s: %w", layer, err)
			}
			last := i == len(comps)-1
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFCHR:
				if st.Rdev == 0 {
					return policy.PathAbsent, nil // whiteout
				}
			case unix.S_IFLNK:
				return 0, fmt.Errorf("/%s is a symlink in the image: mask the path it points to", strings.Join(comps[:i+1], "/"))
			case unix.S_IFDIR:
				if last {
					return policy.PathDir, nil
				}
				if v, _ := lgetxattr(p, "trusted.overlay.opaque"); v == "y" {
					opaque = true
				}
				continue
			}
			if last {
				return policy.PathFile, nil
			}
			return policy.PathAbsent, nil // below a file
		}
	}
	return policy.PathAbsent, nil
}

func lgetxattr(path, name string) (string, error) {
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// MaskFile makes the empty read-only file bound over masked files, in the
// bundle (root-owned, removed with it).
func MaskFile(bundle string) (string, error) {
	p := filepath.Join(bundle, "agentbox-masked")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o444)
	if err != nil {
		return "", fmt.Errorf("mask file: %w", err)
	}
	return p, f.Close()
}
