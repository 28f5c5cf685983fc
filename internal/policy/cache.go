package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Cache keeps the last set loaded from each policy directory and reloads it
// when any file in the directory changes (name, size or modification
// time), so a Create does not re-parse unchanged policies.
type Cache struct {
	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	fingerprint string
	set         *Set
}

// Load returns the set in dir, from the cache when nothing changed. A
// directory that fails to load is never served from an older good copy:
// the caller gets the error.
func (c *Cache) Load(dir string) (*Set, error) { return c.LoadStored(dir, nil) }

// Store keeps checked sets across processes, by the digest of the files
// they were loaded from (policystore.Dir is the node's).
type Store interface {
	// Load returns the set kept for digest, or else load's, which it
	// keeps when it loaded.
	Load(digest string, load func() (*Set, error)) (*Set, error)
}

// LoadStored is Load, with a Store in front of parsing (nil: none): a set
// this process has not loaded yet is the store's when it keeps one for the
// same files' bytes.
func (c *Cache) LoadStored(dir string, st Store) (*Set, error) {
	fp, err := fingerprint(dir)
	if err != nil {
		return nil, fmt.Errorf("policy directory %s: %w", dir, err)
	}
	c.mu.Lock()
	if e, ok := c.entries[dir]; ok && e.fingerprint == fp {
		c.mu.Unlock()
		return e.set, nil
	}
	c.mu.Unlock()
	set, err := loadStored(dir, st)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]cacheEntry{}
	}
	c.entries[dir] = cacheEntry{fingerprint: fp, set: set}
	return set, nil
}

// loadStored reads dir's files once, and takes their set from the store,
// or parses them (and the store keeps it).
func loadStored(dir string, st Store) (*Set, error) {
	in := readInput(dir)
	d := in.digest()
	if st == nil || d == "" {
		return in.load()
	}
	return st.Load(d, in.load)
}

// digest is the SHA-256 of every file's path, length and bytes as read
// (what load parses); "" when the input has problems: a set that does not
// load is never kept.
func (in *input) digest() string {
	if len(in.problems) > 0 {
		return ""
	}
	h := sha256.New()
	for i, f := range in.files {
		io.WriteString(h, f+"\x00"+strconv.Itoa(len(in.data[i]))+"\x00")
		h.Write(in.data[i])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fingerprint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var parts []string
	for _, e := range entries {
		if !PolicyFileName(e.Name()) {
			continue
		}
		info, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", err
		}
		parts = append(parts, fmt.Sprintf("%s/%d/%d/%v", e.Name(), info.Size(), info.ModTime().UnixNano(), info.IsDir()))
	}
	sort.Strings(parts)
	return strings.Join(parts, "|"), nil
}
