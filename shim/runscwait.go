package shim

// Waits answered in the shim. gVisor's task service learns that a
// container exited from a `runsc wait ID` process it starts once the
// container has started, and that lives as long as the container: two
// whole runsc processes a pod (each about 3 MiB of PSS, and some 14 ms of
// CPU to start, most of it runsc's package initialisation). The shim makes
// the call that process makes (containerManager.Wait over the sandbox's
// control socket) itself: runsccmd's process monitor, through which every
// runsc command gVisor's task service runs is started, is wrapped, and a
// plain `wait ID` of a container whose sandbox the shim knows starts no
// process; its result is what runsc wait would print. Every other command
// (a wait with flags: a checkpoint's, a restore's, a pid's; a container
// the shim does not know) is runsc's, as before.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"time"

	runc "github.com/containerd/go-runc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsccmd"

	"agentbox.dev/agentbox/internal/runscctl"
)

// sandboxStopTimeout bounds how long a root container's wait waits for its
// sandbox process to go once the container exited, as runsc wait does.
const sandboxStopTimeout = 2 * time.Minute

// waitTarget is where a container's wait is answered: its sandbox's
// control socket, and for the sandbox's root container, the wait for its
// sandbox process to go (runsc wait's too).
type waitTarget struct {
	socket  string
	stopped func() error // nil: not the root
}

// waitMonitor is runsccmd's process monitor with waits answered in the
// shim.
type waitMonitor struct {
	next   runsccmd.ProcessMonitor
	target func(id string) (waitTarget, bool)
	mu     sync.Mutex
	// ours are the waits answered in the shim, by their command.
	// +checklocks:mu
	ours map[*exec.Cmd]chan runc.Exit
}

var _ runsccmd.ProcessMonitor = (*waitMonitor)(nil)

// plainWait is the container id of a `runsc [--flag=value...] wait ID`
// command: a wait with no flags of its own.
func plainWait(args []string) (string, bool) {
	n := len(args)
	if n < 3 || args[n-2] != "wait" || args[n-1] == "" || args[n-1][0] == '-' {
		return "", false
	}
	for _, a := range args[1 : n-2] {
		if len(a) < 3 || a[:2] != "--" {
			return "", false // not a global --flag=value: a command's own
		}
	}
	return args[n-1], true
}

// Start implements runsccmd.ProcessMonitor.
func (m *waitMonitor) Start(cmd *exec.Cmd) (chan runc.Exit, error) {
	id, ok := plainWait(cmd.Args)
	if !ok {
		return m.next.Start(cmd)
	}
	t, ok := m.target(id)
	if !ok {
		return m.next.Start(cmd)
	}
	ec := make(chan runc.Exit, 1)
	m.mu.Lock()
	m.ours[cmd] = ec
	m.mu.Unlock()
	go func() {
		status, err := t.wait(id)
		if err != nil {
			if cmd.Stderr != nil {
				_, _ = fmt.Fprintf(cmd.Stderr, "waiting on container %q: %v", id, err)
			}
			ec <- runc.Exit{Status: 1}
			return
		}
		if cmd.Stdout != nil {
			_ = json.NewEncoder(cmd.Stdout).Encode(struct {
				ID         string `json:"id"`
				ExitStatus int    `json:"exitStatus"`
			}{id, status})
		}
		ec <- runc.Exit{Status: 0}
	}()
	return ec, nil
}

// Wait implements runsccmd.ProcessMonitor.
func (m *waitMonitor) Wait(cmd *exec.Cmd, ec chan runc.Exit) (int, error) {
	m.mu.Lock()
	mine, ok := m.ours[cmd]
	delete(m.ours, cmd)
	m.mu.Unlock()
	if !ok || mine != ec {
		return m.next.Wait(cmd, ec)
	}
	return (<-ec).Status, nil
}

// wait is runsc wait's: the container's exit status from its sandbox, and
// for the root, once its sandbox process has gone. A failed wait of the
// root is runsc's too: its status is the sandbox process's (exitRepair).
func (t waitTarget) wait(id string) (int, error) {
	status, err := runscctl.Wait(context.Background(), t.socket, id)
	if err != nil {
		return 0, err
	}
	if t.stopped != nil {
		if err := t.stopped(); err != nil {
			return 0, err
		}
	}
	return status, nil
}

// waitTarget is where container id's wait is answered in the shim, when
// the shim knows its sandbox.
func (s *service) waitTarget(id string) (waitTarget, bool) {
	sb, ok := s.sandboxes.of(id)
	if !ok || sb.control == "" {
		return waitTarget{}, false
	}
	t := waitTarget{socket: sb.control}
	if id == sb.id {
		pid, ok := s.exits.livePid(id)
		if !ok {
			return waitTarget{}, false
		}
		t.stopped = func() error {
			if _, ok := s.exits.waitReaped(pid, sandboxStopTimeout); !ok {
				return errors.New("the sandbox process did not stop")
			}
			return nil
		}
	}
	return t, true
}

// installWaits wraps runsccmd's process monitor (gVisor's task service
// sets it as it is built) so that waits are answered in the shim.
func (s *service) installWaits() {
	runsccmd.Monitor = &waitMonitor{next: runsccmd.Monitor, target: s.waitTarget, ours: map[*exec.Cmd]chan runc.Exit{}}
}
