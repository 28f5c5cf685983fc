package sandbox

import (
	"slices"
	"sync"
)

// Members are a sandbox's containers: its root (whose id is the sandbox's)
// and those that joined it. Safe for concurrent use.
type Members struct {
	mu   sync.Mutex
	root string
	// +checklocks:mu
	ids []string // guarded by mu; the root first
}

// NewMembers is a sandbox of its root container alone.
func NewMembers(root string) *Members {
	return &Members{root: root, ids: []string{root}}
}

// Root is the root container's id.
func (m *Members) Root() string { return m.root }

// Join adds a container.
func (m *Members) Join(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.ids, id) {
		m.ids = append(m.ids, id)
	}
}

// Leave removes a container.
func (m *Members) Leave(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ids = slices.DeleteFunc(m.ids, func(c string) bool { return c == id })
}

// List lists the containers, the root first.
func (m *Members) List() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ids)
}

// RootLast lists them in the order to kill them in: the root last, and
// always (a kill of a sandbox whose root has left still names it).
func (m *Members) RootLast() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.ids)+1)
	for _, c := range m.ids {
		if c != m.root {
			out = append(out, c)
		}
	}
	return append(out, m.root)
}
