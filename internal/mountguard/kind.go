package mountguard

import (
	"errors"
	"fmt"
	"io"
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

// Lookup says what the absolute path p is in the merged view of the
// layers, with overlayfs's rules: the topmost layer that has it decides, a
// whiteout (a 0/0 character device) hides it, and an opaque directory
// hides what the layers below have under it. A symlink on the way is not
// followed on the host: Lookup returns the path it leads to inside the
// container (an absolute target from the image's root, ".." never above
// it, the rest of p appended), which may lie on another mount, for the
// caller to look up instead.
func (l Layers) Lookup(p string) (kind policy.PathKind, next string, err error) {
	_, kind, next, err = l.locate(p)
	return kind, next, err
}

// locate is Lookup, also naming the layer a file is found in.
func (l Layers) locate(p string) (layer string, kind policy.PathKind, next string, err error) {
	p = filepath.Clean("/" + p)
	if p == "/" {
		return "", policy.PathDir, "", nil
	}
	comps := strings.Split(p[1:], "/")
	for _, layer = range l {
		opaque := false
		hp := layer
		for i, c := range comps {
			hp = filepath.Join(hp, c)
			var st unix.Stat_t
			err := unix.Lstat(hp, &st)
			if errors.Is(err, unix.ENOENT) {
				if opaque {
					return "", policy.PathAbsent, "", nil
				}
				break // the layers below decide
			}
			if err != nil {
				return "", 0, "", fmt.Errorf("layer %s: %w", layer, err)
			}
			last := i == len(comps)-1
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFCHR:
				if st.Rdev == 0 {
					return "", policy.PathAbsent, "", nil // whiteout
				}
			case unix.S_IFLNK:
				target, err := os.Readlink(hp)
				if err != nil {
					return "", 0, "", fmt.Errorf("layer %s: %w", layer, err)
				}
				if !filepath.IsAbs(target) {
					target = filepath.Join("/", filepath.Join(comps[:i]...), target)
				}
				next := filepath.Join(append([]string{"/", target}, comps[i+1:]...)...)
				return "", 0, filepath.Clean(next), nil
			case unix.S_IFDIR:
				if last {
					return "", policy.PathDir, "", nil
				}
				if v, _ := lgetxattr(hp, "trusted.overlay.opaque"); v == "y" {
					opaque = true
				}
				continue
			}
			if last {
				return layer, policy.PathFile, "", nil
			}
			return "", policy.PathAbsent, "", nil // below a file
		}
	}
	return "", policy.PathAbsent, "", nil
}

// ReadFile reads the file at the absolute path p of the merged view of the
// layers, at most limit bytes, following the image's symlinks inside the
// image (at most 8), never on the host.
func (l Layers) ReadFile(p string, limit int64) ([]byte, error) {
	for hop := 0; hop < 8; hop++ {
		layer, kind, next, err := l.locate(p)
		if err != nil {
			return nil, err
		}
		if next != "" {
			p = next
			continue
		}
		if kind != policy.PathFile {
			return nil, fmt.Errorf("%s: %w", p, os.ErrNotExist)
		}
		return ReadFileBeneath(layer, strings.TrimPrefix(filepath.Clean(p), "/"), limit)
	}
	return nil, fmt.Errorf("%s: too many symlinks", p)
}

// ReadFileBeneath reads the regular file rel beneath root without following
// any symlink, at most limit bytes.
func ReadFileBeneath(root, rel string, limit int64) ([]byte, error) {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	rfd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_DIRECTORY})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &how)
	if err != nil {
		return nil, fmt.Errorf("open %s beneath %s: %w", rel, root, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s beneath %s is not a regular file", rel, root)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s beneath %s is %d bytes, over %d", rel, root, st.Size(), limit)
	}
	b := make([]byte, st.Size())
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, err
	}
	return b[:n], nil
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
