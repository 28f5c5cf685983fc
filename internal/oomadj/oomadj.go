// Package oomadj finds out whether this host lets the shim lower
// oom_score_adj, which needs CAP_SYS_RESOURCE. Some hosts (these CI VMs
// among them) withhold it even from root; the stock gVisor shim then fails
// every start.
package oomadj

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Adjust describes whether this host lets us lower oom_score_adj.
type Adjust struct {
	// Floor is the lowest value a process started by us can be given:
	// the current value when lowering is refused, -1000 otherwise.
	Floor int
	// Refused holds the reason lowering was refused, or nil.
	Refused error
}

var (
	oomOnce  sync.Once
	oomProbe Adjust
)

// Host probes once whether the host lets this process lower its
// oom_score_adj. Lowering needs CAP_SYS_RESOURCE, which some hosts (these
// CI VMs among them) withhold even from root.
func Host() Adjust {
	oomOnce.Do(func() {
		oomProbe = probe("/proc/self/oom_score_adj")
	})
	return oomProbe
}

func probe(path string) Adjust {
	cur, err := readOOMScoreAdj(path)
	if err != nil {
		return Adjust{Floor: 0, Refused: err}
	}
	if cur <= -1000 {
		return Adjust{Floor: -1000}
	}
	if err := Write(path, cur-1); err != nil {
		return Adjust{Floor: cur, Refused: err}
	}
	// Raising back is always allowed.
	if err := Write(path, cur); err != nil {
		return Adjust{Floor: cur - 1, Refused: fmt.Errorf("restoring oom_score_adj: %w", err)}
	}
	return Adjust{Floor: -1000}
}

func readOOMScoreAdj(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Write sets the oom_score_adj file at path (/proc/PID/oom_score_adj).
func Write(path string, v int) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteString(strconv.Itoa(v)); err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return fmt.Errorf("write %s=%d: %w (lowering oom_score_adj needs CAP_SYS_RESOURCE)", path, v, err)
		}
		return fmt.Errorf("write %s=%d: %w", path, v, err)
	}
	return nil
}
