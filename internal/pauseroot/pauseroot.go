// Package pauseroot keeps, on each node, an EROFS image of each pod sandbox
// image's root filesystem (the pause container's). gVisor mounts such an
// image in the Sentry from one host file, so runsc starts no gofer for the
// pause container: a process, its memory and its start fewer per pod.
//
// An image is named by the digest of its bytes, which the same tree always
// gives (internal/erofs writes deterministically): every node names the
// same pause image alike, as a restore on another node needs (gVisor
// checks the root's image path a checkpoint was taken with). It is built
// once from the pause rootfs's layers; a small file named from the layers
// (their paths and identities: a committed snapshot does not change while
// it exists) says which image they make. The directory is root's alone and
// holds at most Keep images.
package pauseroot

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/erofs"
	"agentbox.dev/agentbox/internal/privdir"
)

// format names how images are built; a change of it builds new ones.
const format = "agentbox pause-root erofs 1"

// Keep is how many images the directory holds: the oldest go first.
const Keep = 8

// limits bound a pause image: it is one small binary in practice.
var limits = erofs.Limits{Files: 20000, Bytes: 256 << 20}

// Image returns the path of the image of the root filesystem whose layers
// (directories, the topmost first, as an overlay mount stacks them) are
// given, building it in dir if it is not there yet. Empty layers (a new
// container's upper directory) add nothing and are left out.
func Image(dir string, layers []string) (string, error) {
	if err := privdir.Ensure(dir, privdir.Private); err != nil {
		return "", fmt.Errorf("the pause image directory: %w", err)
	}
	var used []string
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", format)
	for _, l := range layers {
		var st unix.Stat_t
		if err := unix.Lstat(l, &st); err != nil {
			return "", fmt.Errorf("layer %s: %w", l, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", fmt.Errorf("layer %s is not a directory", l)
		}
		empty, err := isEmpty(l)
		if err != nil {
			return "", err
		}
		if empty {
			continue
		}
		used = append(used, l)
		fmt.Fprintf(h, "%s\x00%d %d %d.%d\n", l, st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	}
	if len(used) == 0 {
		return "", errors.New("the rootfs is empty")
	}
	key := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))+".layers")
	if path, ok := named(dir, key); ok {
		return path, nil
	}
	path, err := build(dir, used)
	if err != nil {
		return "", err
	}
	if err := writeAtomic(dir, key, []byte(strings.TrimSuffix(filepath.Base(path), ".erofs")+"\n")); err != nil {
		return "", err
	}
	prune(dir, path)
	return path, nil
}

// named returns the image a layers file names, if the file holds a digest
// and that image is there; anything else is nothing to trust, and the
// image is built again.
func named(dir, key string) (string, bool) {
	b, err := os.ReadFile(key)
	if err != nil {
		return "", false
	}
	d, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(d) != sha256.Size {
		return "", false
	}
	path := filepath.Join(dir, hex.EncodeToString(d)+".erofs")
	if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
		return "", false
	}
	return path, true
}

// writeAtomic writes b to path through a file beside it.
func writeAtomic(dir, path string, b []byte) error {
	tmp, err := os.CreateTemp(dir, "build-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func isEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// build writes the image of the layers' merged view into dir, named by
// its digest, through a file beside it renamed into place whole, and
// returns its path. One layer is read as it is; more are merged by the
// kernel, through a read-only overlay mount of them in a directory of
// dir's.
func build(dir string, layers []string) (_ string, err error) {
	src := layers[0]
	if len(layers) > 1 {
		mnt, err := os.MkdirTemp(dir, "merge-")
		if err != nil {
			return "", err
		}
		defer os.Remove(mnt)
		opts := "ro,lowerdir=" + strings.Join(layers, ":")
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
			return "", fmt.Errorf("mount the pause rootfs's %d layers: %w", len(layers), err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		src = mnt
	}
	root, err := os.OpenRoot(src)
	if err != nil {
		return "", err
	}
	defer root.Close()
	tree, err := Tree(root)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer func() {
		tmp.Close()
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err := erofs.Write(io.MultiWriter(tmp, h), tree, limits); err != nil {
		return "", fmt.Errorf("the pause rootfs: %w", err)
	}
	if err := tmp.Chmod(0o400); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	path := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))+".erofs")
	return path, os.Rename(tmp.Name(), path)
}

// Tree reads the tree under root (names, types, modes, owners, bytes; no
// times), without following a symlink anywhere: each regular file is
// opened beneath root when its bytes are written, and must still be the
// file that was measured.
func Tree(root *os.Root) (*erofs.Node, error) {
	return node(root, ".", "")
}

func node(root *os.Root, path, name string) (*erofs.Node, error) {
	fi, err := root.Lstat(path)
	if err != nil {
		return nil, err
	}
	// No times: the pause reads none, and a layer's directories carry
	// the time they were unpacked on this node, which would make the same
	// image's bytes, and so its name, differ from node to node.
	n := &erofs.Node{Name: name, Mode: fi.Mode()}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		n.UID, n.GID = st.Uid, st.Gid
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if n.Target, err = root.Readlink(path); err != nil {
			return nil, err
		}
	case fi.Mode().IsRegular():
		n.Size = fi.Size()
		n.Open = func() (io.ReadCloser, error) {
			f, err := root.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return nil, err
			}
			if now, err := f.Stat(); err != nil || !os.SameFile(fi, now) {
				f.Close()
				return nil, fmt.Errorf("%s changed while it was read", path)
			}
			return f, nil
		}
	case fi.IsDir():
		d, err := root.Open(path)
		if err != nil {
			return nil, err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return nil, err
		}
		sort.Strings(names)
		for _, c := range names {
			child, err := node(root, filepath.Join(path, c), c)
			if err != nil {
				return nil, err
			}
			n.Children = append(n.Children, child)
		}
	}
	return n, nil
}

// prune removes the oldest images past Keep (never keep, the one just
// used), the layer files that name no image there, and what an
// interrupted build left.
func prune(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type img struct {
		path string
		mod  int64
	}
	var imgs []img
	var keys []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "build-"):
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 10*time.Minute {
				os.Remove(p)
			}
		case strings.HasSuffix(e.Name(), ".layers"):
			keys = append(keys, p)
		case strings.HasSuffix(e.Name(), ".erofs") && p != keep:
			if fi, err := e.Info(); err == nil {
				imgs = append(imgs, img{p, fi.ModTime().UnixNano()})
			}
		}
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].mod > imgs[j].mod })
	for i := Keep - 1; i < len(imgs); i++ {
		os.Remove(imgs[i].path)
	}
	for _, k := range keys {
		if _, ok := named(dir, k); !ok {
			os.Remove(k)
		}
	}
}
