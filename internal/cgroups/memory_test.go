package cgroups

import (
	"testing"
)

func TestOOMKills(t *testing.T) {
	root := tree(t, map[string]string{
		"memory/pods/v1/memory.limit_in_bytes":  "268435456",
		"memory/pods/v1/memory.oom_control":     "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		"pods/v2/memory.max":                    "max",
		"pods/v2/memory.events":                 "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n",
		"pods/none/memory.max":                  "max",
		"pods/none/memory.events":               "low 0\n",
		"pods/bad/memory.max":                   "max",
		"pods/bad/memory.events":                "oom_kill x\n",
		"memory/pods/old/memory.limit_in_bytes": "1",
		"memory/pods/old/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\n",
	})
	for _, c := range []struct {
		path string
		want uint64
		ok   bool
	}{
		{"/pods/v1", 2, true},
		{"/pods/v2", 1, true},
		{"/pods/none", 0, false},    // no oom_kill line: not "none"
		{"/pods/bad", 0, false},     // unparsable
		{"/pods/old", 0, false},     // a kernel before 4.13
		{"/pods/missing", 0, false}, // gone
		{"../etc", 0, false},        // not below the root
	} {
		n, err := OOMKills(root, c.path)
		if n != c.want || (err == nil) != c.ok {
			t.Errorf("%s: %d, %v; want %d (ok %v)", c.path, n, err, c.want, c.ok)
		}
	}
}
