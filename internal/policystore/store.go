// Package policystore keeps checked policy sets in a node-wide directory
// shared by every shim process on the node (policy.Store): each pod's shim
// is a fresh process, and parsing and checking the whole policy directory
// was the largest part of agentbox's own work on a pod's start.
//
// An entry is keyed by the digest of the exact bytes of every policy file,
// with its path (policy computes it from the bytes it parses), and the Go
// build ID of the binary that checked
// them, so an entry never answers for a changed file, nor for a binary
// whose parsing or checks differ. Only sets that loaded without a problem
// are kept: a broken directory is parsed on every load, and its problems
// are reported in full. The directory must be the caller's own and closed
// to everyone else (it is under the runtime's control directory, which no
// sandbox may mount); one that is not is not used.
package policystore

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"

	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/privdir"
)

// Dir is a store in a directory.
type Dir struct {
	// Path is the store's directory.
	Path string
	// Warn is told what kept the store from serving or keeping a set (a
	// full disk, a corrupt entry); the load itself goes on without it.
	Warn func(error)
}

// storeVersion names the entry format; part of every key.
const storeVersion = "agentbox policy store v1"

// maxStoredEntries bounds the store: the oldest entries beyond it are
// removed when one is written.
const maxStoredEntries = 16

// maxEntrySize bounds what is read from (and written to) the store.
const maxEntrySize = 64 << 20

// storedSet is an entry: the set, and the key it answers for.
type storedSet struct {
	Key string
	Set *policy.Set
}

// buildID is this binary's Go build ID, which changes with any change to
// the code or the toolchain that built it; "" when it cannot be read (the
// store is then not used). It is read from /proc/self/exe, the running
// process's own file: after an upgrade replaced the binary on disk, a shim
// still running the old one must not key its sets with the new one's ID
// (os.Executable would name the new file).
var buildID = sync.OnceValue(func() string {
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		return ""
	}
	defer f.Close()
	sec := f.Section(".note.go.buildid")
	if sec == nil {
		return ""
	}
	note, err := sec.Data()
	if err != nil || len(note) <= 16 {
		return ""
	}
	return string(note[16:]) // after the note's header and "Go\x00\x00"
})

// key is the entry's name for the files' digest under build; "" when the
// binary has no build ID (the store is then not used).
func key(build, digest string) string {
	if build == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(storeVersion + "\x00" + build + "\x00" + digest))
	return hex.EncodeToString(sum[:])
}

// Load is policy.Store's: the set kept for digest, or else load's, kept
// when it loaded.
func (st Dir) Load(digest string, load func() (*policy.Set, error)) (*policy.Set, error) {
	if err := st.open(); err != nil {
		st.warn(err)
		return load()
	}
	k := key(buildID(), digest)
	if k == "" {
		return load()
	}
	if set := st.get(k); set != nil {
		return set, nil
	}
	set, err := load()
	if err == nil {
		st.put(k, set)
	}
	return set, err
}

// open checks the store's directory, creating it: a directory (not a
// link) owned by this process's user, that no one else may write.
func (st Dir) open() error {
	return privdir.Ensure(st.Path, privdir.NoOthersWrite)
}

func (st Dir) warn(err error) {
	if st.Warn != nil {
		st.Warn(fmt.Errorf("policy store %s: %w", st.Path, err))
	}
}

// get returns the set stored under key, or nil.
func (st Dir) get(key string) *policy.Set {
	f, err := os.Open(filepath.Join(st.Path, key+".set"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		st.warn(err)
		return nil
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxEntrySize+1))
	if err != nil {
		st.warn(err)
		return nil
	}
	if len(data) > maxEntrySize {
		st.warn(fmt.Errorf("entry %s is larger than %d bytes: loading the policy files instead", key, maxEntrySize))
		return nil
	}
	e, err := decodeStored(data)
	if err == nil && (e.Key != key || e.Set == nil) {
		err = fmt.Errorf("it is not the entry for its name")
	}
	if err != nil {
		st.warn(fmt.Errorf("entry %s: %w: loading the policy files instead", key, err))
		return nil
	}
	return e.Set
}

// put stores set under key (written whole, then renamed into place), and
// removes the oldest entries beyond maxStoredEntries.
func (st Dir) put(key string, set *policy.Set) {
	data, err := encodeStored(&storedSet{Key: key, Set: set})
	if err == nil && len(data) > maxEntrySize {
		err = fmt.Errorf("%d bytes, more than %d", len(data), maxEntrySize)
	}
	if err == nil {
		// What a later load is given must be what this one checked: an
		// entry that does not read back as the same set is not kept.
		var back *storedSet
		if back, err = decodeStored(data); err == nil && !reflect.DeepEqual(back.Set, set) {
			err = fmt.Errorf("it does not read back as the set loaded")
		}
	}
	if err != nil {
		st.warn(fmt.Errorf("entry %s not kept: %w", key, err))
		return
	}
	tmp, err := os.CreateTemp(st.Path, ".entry-*")
	if err != nil {
		st.warn(err)
		return
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(st.Path, key+".set"))
	}
	if err != nil {
		os.Remove(tmp.Name())
		st.warn(err)
		return
	}
	st.prune()
}

// prune removes the oldest entries beyond maxStoredEntries, and temporary
// files a killed writer left.
func (st Dir) prune() {
	entries, err := os.ReadDir(st.Path)
	if err != nil || len(entries) <= maxStoredEntries {
		return
	}
	type aged struct {
		name string
		mod  int64
	}
	var all []aged
	for _, e := range entries {
		if fi, err := e.Info(); err == nil {
			all = append(all, aged{e.Name(), fi.ModTime().UnixNano()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod > all[j].mod })
	for _, a := range all[min(len(all), maxStoredEntries):] {
		os.Remove(filepath.Join(st.Path, a.name))
	}
}
