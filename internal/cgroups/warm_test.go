package cgroups

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWarm walks a warm pod's cgroup (v1 and v2 layouts) through its
// states: held by a warm pool, ready, a role's lower limit while capped,
// claimed; and a cgroup without cpu.idle.
func TestWarm(t *testing.T) {
	for _, c := range []struct {
		name, quotaFile, idleFile, start string
		capped, followed                 string
	}{
		{name: "v1", quotaFile: "cpu/pods/p/cpu.cfs_quota_us", idleFile: "cpu/pods/p/cpu.idle", start: "200000",
			capped: "5000", followed: "1000"},
		{name: "v2 unbounded", quotaFile: "pods/p/cpu.max", idleFile: "pods/p/cpu.idle", start: "max 100000",
			capped: "5000 100000", followed: "1000 100000"},
		{name: "v2 below the cap", quotaFile: "pods/p/cpu.max", idleFile: "pods/p/cpu.idle", start: "2000 100000",
			capped: "2000 100000", followed: "1000 100000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := map[string]string{c.quotaFile: c.start, c.idleFile: "0"}
			if c.name == "v1" {
				files["cpu/pods/p/cpu.cfs_period_us"] = "100000"
			}
			root := tree(t, files)
			read := func(f string) string { b, _ := os.ReadFile(filepath.Join(root, f)); return string(b) }
			var w Warm
			if said := w.Set(root, "/pods/p", true, false, 50); !strings.HasPrefix(said, "idle while the warm pool holds it") || !w.Idle || w.Capped() || read(c.idleFile) != "1" {
				t.Fatalf("held: %q, %+v, cpu.idle %s", said, w, read(c.idleFile))
			}
			if said := w.Set(root, "/pods/p", true, false, 50); said != "" {
				t.Errorf("nothing differed, but: %q", said)
			}
			if said := w.Set(root, "/pods/p", true, true, 50); !strings.HasPrefix(said, "capped at 50m while it waits ready") || read(c.quotaFile) != c.capped {
				t.Fatalf("ready: %q, quota %q, want %q", said, read(c.quotaFile), c.capped)
			}
			// A role's 10m while capped: the cap stays (never above 10m),
			// and 10m is what the claim gives back.
			if err := w.Follow(root, "/pods/p", Quota{1000, 100000}, 50); err != nil || w.Had.Millis() != 10 {
				t.Fatalf("follow: %v, had %+v", err, w.Had)
			}
			if read(c.quotaFile) != c.followed {
				t.Errorf("followed: quota %q, want %q", read(c.quotaFile), c.followed)
			}
			said := w.Set(root, "/pods/p", false, false, 50)
			if !strings.HasPrefix(said, "normal (") || !strings.HasSuffix(said, "uncapped: 10m") || w.Idle || w.Capped() || read(c.idleFile) != "0" {
				t.Errorf("claimed: %q, %+v, cpu.idle %s", said, w, read(c.idleFile))
			}
			if q, _ := ReadQuota(root, "/pods/p"); q.Millis() != 10 {
				t.Errorf("claimed: quota %+v, want the role's 10m", q)
			}
			if err := w.Follow(root, "/pods/p", Quota{1, 100000}, 50); err != nil || w.Capped() {
				t.Errorf("follow uncapped: %v, %+v", err, w)
			}
		})
	}
	t.Run("no cpu.idle", func(t *testing.T) {
		root := tree(t, map[string]string{"pods/p/cpu.max": "max 100000"})
		var w Warm
		said := w.Set(root, "/pods/p", true, true, 50)
		if !strings.HasPrefix(said, "class unchanged: "+ErrNoIdle.Error()) || w.Idle || !w.Capped() {
			t.Errorf("%q, %+v", said, w)
		}
	})
}
