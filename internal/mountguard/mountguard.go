// Package mountguard mounts what the policy accepted, and nothing else.
//
// A bind source named in a spec is a path: between the check and runsc's
// gofer opening it, any symlink on it (one an agent planted in a writable
// host mount, say) could send the mount elsewhere. So each accepted source
// is opened once, beneath the directory it was accepted under, refusing
// every symlink component (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and
// the opened file itself is cloned (open_tree), hardened (mount_setattr:
// nosuid, nodev, and read-only or noexec) and attached at a root-owned
// staging path in the container's bundle (move_mount). The spec then names
// the staging path. Release unmounts them at Delete.
package mountguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/policy"
)

// DirName is the staging directory inside a bundle.
const DirName = "agentbox-mounts"

// Stager stages one container's binds under its bundle. Safe for
// concurrent use.
type Stager struct {
	dir string
	mu  sync.Mutex
	n   int
}

// New returns the stager of the container whose bundle is bundle.
func New(bundle string) *Stager { return &Stager{dir: filepath.Join(bundle, DirName)} }

// Dir is the staging directory.
func (s *Stager) Dir() string { return s.dir }

// Stage opens b's source beneath b.Root without following any symlink,
// checks its kind, and mounts exactly that file at a new staging path,
// which it returns.
func (s *Stager) Stage(b policy.Bind) (string, error) {
	fd, err := Open(b.Root, b.Rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", b.Source, err)
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	isFile := st.Mode&unix.S_IFMT == unix.S_IFREG
	switch {
	case !isDir && !isFile:
		return "", fmt.Errorf("%s is neither a regular file nor a directory", b.Source)
	case b.Kind == "file" && !isFile:
		return "", fmt.Errorf("%s must be a regular file (%s)", b.Source, b.Origin)
	case b.Kind == "dir" && !isDir:
		return "", fmt.Errorf("%s must be a directory (%s)", b.Source, b.Origin)
	}
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_EMPTY_PATH
	if b.Recursive {
		flags |= unix.AT_RECURSIVE
	}
	mfd, err := unix.OpenTree(fd, "", uint(flags))
	if err != nil {
		return "", fmt.Errorf("clone mount of %s: %w", b.Source, err)
	}
	defer unix.Close(mfd)
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if b.ReadOnly {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if b.NoExec {
		attr |= unix.MOUNT_ATTR_NOEXEC
	}
	if err := unix.MountSetattr(mfd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
		return "", fmt.Errorf("harden mount of %s: %w", b.Source, err)
	}
	target, err := s.target(isDir)
	if err != nil {
		return "", err
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		os.Remove(target)
		return "", fmt.Errorf("attach mount of %s: %w", b.Source, err)
	}
	return target, nil
}

// target makes the next staging mount point, a file or a directory.
func (s *Stager) target(dir bool) (string, error) {
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	if err := os.Mkdir(s.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("staging directory: %w", err)
	}
	p := filepath.Join(s.dir, strconv.Itoa(n))
	if dir {
		if err := os.Mkdir(p, 0o700); err != nil {
			return "", fmt.Errorf("staging mount point: %w", err)
		}
		return p, nil
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("staging mount point: %w", err)
	}
	return p, f.Close()
}

// Open opens root/rel as an O_PATH file (never O_NOFOLLOW: with O_PATH it
// would open a final symlink itself): root without any symlink
// component, rel beneath root without any symlink or ".." leaving it.
func Open(root, rel string) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	rfd, err := unix.Openat2(unix.AT_FDCWD, root, &how)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", root, describe(err, "it"))
	}
	if rel == "" {
		return rfd, nil
	}
	defer unix.Close(rfd)
	how.Resolve |= unix.RESOLVE_BENEATH
	fd, err := unix.Openat2(rfd, rel, &how)
	if err != nil {
		return -1, fmt.Errorf("open %s beneath %s: %w", rel, root, describe(err, "the path below "+root))
	}
	return fd, nil
}

func describe(err error, what string) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s has a symlink component (%w)", what, err)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s leaves the directory it must stay in (%w)", what, err)
	}
	return err
}

// Release unmounts and removes every staging mount under dir (a bundle's
// DirName). It may run twice, and on a directory that does not exist.
func Release(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RemoveAll detaches every mount below dir, deepest first, then removes
// dir. runsc leaves one in its root (state/null-netns, its placeholder
// network namespace), which os.RemoveAll alone cannot remove.
func RemoveAll(dir string) error {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	var below []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			below = append(below, f[1])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(below)))
	var errs []error
	for _, m := range below {
		if err := unix.Unmount(m, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
