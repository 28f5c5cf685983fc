package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
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
func (c *Cache) Load(dir string) (*Set, error) { return c.LoadStored(dir, Store{}) }

// LoadStored is Load, with the node's Store in front of parsing: a set
// this process has not loaded yet is taken from the store when one was
// stored for the same files' bytes by the same binary, and stored when it
// was not.
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
// or parses them and stores it.
func loadStored(dir string, st Store) (*Set, error) {
	in := readInput(dir)
	key := ""
	if st.Dir != "" {
		if err := st.open(); err != nil {
			st.warn(err)
		} else {
			key = in.key(buildID())
		}
	}
	if key != "" {
		if set := st.get(key); set != nil {
			return set, nil
		}
	}
	set, err := in.load()
	if err == nil && key != "" {
		st.put(key, set)
	}
	return set, err
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
