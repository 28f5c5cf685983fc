// Package privdir makes and checks the directories on the node that only
// the runtime may use: the checkpoint store, the node agent's secrets, the
// control sockets' directory and the policy store. A directory is
// accepted only if it is one (not a link to one), is owned by the user
// expected, and has none of the mode bits its caller forbids. Each caller
// says what the directory is and why in its own error.
package privdir

import (
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Forbidden mode bits: Private lets no one else in (the directory holds
// secrets or images); NoOthersWrite lets others read but not write.
const (
	Private       fs.FileMode = 0o077
	NoOthersWrite fs.FileMode = 0o022
)

// Check refuses dir unless it is a directory (not a symlink), owned by
// uid owner, with none of the bits forbid.
func Check(dir string, owner int, forbid fs.FileMode) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	mode := fs.FileMode(st.Mode & 0o777)
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s is not a directory (a symlink?)", dir)
	case int(st.Uid) != owner:
		return fmt.Errorf("%s is owned by uid %d, not uid %d", dir, st.Uid, owner)
	case mode&forbid != 0:
		what := "others may enter or read it"
		if mode&forbid&NoOthersWrite != 0 {
			what = "others may write to it"
		}
		return fmt.Errorf("%s has mode %#o: %s", dir, uint32(mode), what)
	}
	return nil
}

// Ensure makes dir (mode 0700, with its parents) if it is missing, then
// checks it as Check does, owned by this process's user.
func Ensure(dir string, forbid fs.FileMode) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return Check(dir, os.Geteuid(), forbid)
}
