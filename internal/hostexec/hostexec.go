// Package hostexec runs the host tools agentbox drives (nsenter, ip, nft)
// and reports their stderr when they fail.
package hostexec

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"
)

var (
	mu     sync.RWMutex
	runner = func(cmd *exec.Cmd) error { return cmd.Run() }
)

// SetRunner replaces how commands run. The shim is a subreaper whose
// SIGCHLD handler reaps every child: it runs them through its reaper, or a
// command's exit status is lost to it ("waitid: no child processes").
func SetRunner(f func(*exec.Cmd) error) {
	mu.Lock()
	defer mu.Unlock()
	runner = f
}

// run runs name with args, stdin as its input, and returns its stdout. A
// failure carries the command and its stderr.
func run(stdin, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	mu.RLock()
	runCmd := runner
	mu.RUnlock()
	if err := runCmd(cmd); err != nil {
		return so.String(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(se.String()))
	}
	return so.String(), nil
}

// InNetns runs name in the network namespace at netns (a path), through
// nsenter.
func InNetns(netns, stdin, name string, args ...string) (string, error) {
	out, err := run(stdin, "nsenter", append([]string{"--net=" + netns, "--", name}, args...)...)
	if err != nil {
		err = fmt.Errorf("in %s: %w", netns, err)
	}
	return out, err
}
