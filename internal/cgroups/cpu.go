package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNoIdle is SetIdle's error when the cgroup has no cpu.idle file: a
// kernel before 5.15, a cgroup v2 tree without the cpu controller, or a
// cgroup already removed.
var ErrNoIdle = errors.New("the cgroup has no cpu.idle")

// cpuDir is the directory of the cgroup at path (cgroupfs form) below root
// that holds file in cgroup v1's cpu hierarchy or the v2 tree, and
// whether it is v2's.
func cpuDir(root, path, file string) (string, bool, error) {
	dir, ok := cleanPath(path)
	if !ok {
		return "", false, fmt.Errorf("cgroup %q: not a cgroupfs path below the root", path)
	}
	for _, h := range []string{"cpu", "cpu,cpuacct", "", "unified"} {
		d := filepath.Join(root, h, dir)
		if _, err := os.Stat(filepath.Join(d, file)); err == nil {
			return d, h == "" || h == "unified", nil
		}
	}
	return "", false, fmt.Errorf("cgroup %s: no %s", dir, file)
}

// SetIdle puts the cgroup at path (cgroupfs form) below root in the idle
// CPU class (cpu.idle 1: its tasks run only when its siblings leave a CPU
// free) or takes it out (0), in cgroup v1's cpu hierarchy or the v2 tree.
// It gives the file written.
func SetIdle(root, path string, idle bool) (string, error) {
	d, _, err := cpuDir(root, path, "cpu.idle")
	if err != nil {
		if _, ok := cleanPath(path); ok {
			err = fmt.Errorf("%w (%v)", ErrNoIdle, err)
		}
		return "", err
	}
	v := "0"
	if idle {
		v = "1"
	}
	f := filepath.Join(d, "cpu.idle")
	if err := os.WriteFile(f, []byte(v), 0); err != nil {
		return f, fmt.Errorf("write %s: %w", f, err)
	}
	return f, nil
}

// Quota is a cgroup's CPU bandwidth: Quota microseconds of CPU time per
// Period (Quota -1: unbounded).
type Quota struct{ Quota, Period int64 }

// Millis is q in thousandths of a CPU (0: unbounded).
func (q Quota) Millis() int64 {
	if q.Quota < 0 || q.Period <= 0 {
		return 0
	}
	return q.Quota * 1000 / q.Period
}

// quotaDir is the directory holding the CPU bandwidth of the cgroup at
// path: v1's cpu.cfs_quota_us, else v2's cpu.max; and whether it is v2's.
func quotaDir(root, path string) (string, bool, error) {
	if d, v2, err := cpuDir(root, path, "cpu.cfs_quota_us"); err == nil {
		return d, v2, nil
	}
	return cpuDir(root, path, "cpu.max")
}

// ReadQuota reads the CPU bandwidth of the cgroup at path (cgroupfs form):
// v1's cpu.cfs_quota_us and cpu.cfs_period_us, or v2's cpu.max.
func ReadQuota(root, path string) (Quota, error) {
	d, v2, err := quotaDir(root, path)
	if err != nil {
		return Quota{}, err
	}
	if v2 {
		b, err := os.ReadFile(filepath.Join(d, "cpu.max"))
		if err != nil {
			return Quota{}, err
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return Quota{}, fmt.Errorf("%s/cpu.max: %q", d, b)
		}
		q := Quota{Quota: -1}
		if f[0] != "max" {
			if q.Quota, err = strconv.ParseInt(f[0], 10, 64); err != nil {
				return Quota{}, fmt.Errorf("%s/cpu.max: %w", d, err)
			}
		}
		if q.Period, err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return Quota{}, fmt.Errorf("%s/cpu.max: %w", d, err)
		}
		return q, nil
	}
	quota, ok1 := readInt(filepath.Join(d, "cpu.cfs_quota_us"))
	period, ok2 := readInt(filepath.Join(d, "cpu.cfs_period_us"))
	if !ok1 || !ok2 {
		return Quota{}, fmt.Errorf("%s: cpu.cfs_quota_us or cpu.cfs_period_us unreadable", d)
	}
	return Quota{Quota: quota, Period: period}, nil
}

// SetQuota sets the CPU bandwidth of the cgroup at path (cgroupfs form) to
// q's quota, in its own period (v1's cpu.cfs_quota_us, v2's cpu.max).
func SetQuota(root, path string, q Quota) error {
	d, v2, err := quotaDir(root, path)
	if err != nil {
		return err
	}
	f, v := filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(q.Quota, 10)
	if v2 {
		f = filepath.Join(d, "cpu.max")
		if q.Quota < 0 {
			v = "max"
		}
		v += " " + strconv.FormatInt(q.Period, 10)
	}
	if err := os.WriteFile(f, []byte(v), 0); err != nil {
		return fmt.Errorf("write %s: %w", f, err)
	}
	return nil
}

// Lower brings the memory limit and CPU bandwidth of the cgroup at path
// (cgroupfs form) down to memory bytes and cpu (a zero value: leave it),
// never raising either: runsc sets a sandbox's limits only on a cgroup it
// creates, and the kubelet creates a pod's before the runtime runs. It
// says what it lowered.
func Lower(root, path string, memory int64, cpu Quota) ([]string, error) {
	var did []string
	if memory > 0 {
		d, v2, err := memDir(root, path)
		if err != nil {
			return did, err
		}
		f := filepath.Join(d, "memory.limit_in_bytes")
		if v2 {
			f = filepath.Join(d, "memory.max")
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return did, err
		}
		cur, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if strings.TrimSpace(string(b)) == "max" {
			cur, err = -1, nil
		}
		if err != nil {
			return did, fmt.Errorf("%s: %w", f, err)
		}
		if cur < 0 || cur > memory {
			if err := os.WriteFile(f, []byte(strconv.FormatInt(memory, 10)), 0); err != nil {
				return did, fmt.Errorf("write %s: %w", f, err)
			}
			did = append(did, fmt.Sprintf("memory %d", memory))
		}
	}
	if cpu.Quota > 0 && cpu.Period > 0 {
		cur, err := ReadQuota(root, path)
		if err != nil {
			return did, err
		}
		if want := cpu.Quota * cur.Period / cpu.Period; cur.Quota < 0 || cur.Quota > want {
			if err := SetQuota(root, path, Quota{Quota: want, Period: cur.Period}); err != nil {
				return did, err
			}
			did = append(did, fmt.Sprintf("cpu %d/%d", want, cur.Period))
		}
	}
	return did, nil
}

// Exists says whether the cgroup at path (cgroupfs form) is in cgroup v1's
// memory or cpu hierarchy, or the v2 tree, below root: made by someone
// before the runtime (the kubelet makes a pod's).
func Exists(root, path string) bool {
	dir, ok := cleanPath(path)
	if !ok {
		return false
	}
	for _, f := range []string{"memory/" + dir + "/memory.limit_in_bytes", "cpu/" + dir + "/cpu.cfs_quota_us", dir + "/cgroup.controllers"} {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			return true
		}
	}
	return false
}
