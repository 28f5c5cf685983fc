package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/mountguard"
)

// The baseline syscall policy makes clone3 answer ENOSYS so that glibc
// falls back to clone, whose flags a filter can see. A runsc that ignores
// errnoRet answers EPERM instead, and every glibc program's threads fail.
// checkSeccompErrno boots a real sandbox with that one rule and runs this
// very binary in it (it is static) to see what clone3 answers.

// probeClone3Command is the hidden command run inside that sandbox.
func probeClone3Command() *cli.Command {
	return &cli.Command{
		Name:   "probe-clone3",
		Hidden: true,
		Action: func(c *cli.Context) error {
			_, _, errno := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
			fmt.Fprintf(c.App.Writer, "clone3 errno=%d\n", int(errno))
			return nil
		},
	}
}

func checkSeccompErrno(ctx context.Context, runsc string, found error) check {
	c := check{name: "seccomp"}
	switch {
	case found != nil:
		c.err = fmt.Errorf("no runsc to check: %w", found)
		return c
	case os.Geteuid() != 0:
		c.err = fmt.Errorf("needs root to boot a test sandbox")
		return c
	}
	self, err := os.Executable()
	if err != nil {
		c.err = err
		return c
	}
	if err := requireStatic(self); err != nil {
		c.err = fmt.Errorf("the probe runs this binary in a sandbox: %w", err)
		return c
	}
	out, err := runClone3Probe(ctx, runsc, self)
	if err != nil {
		c.err = err
		return c
	}
	switch strings.TrimSpace(out) {
	case fmt.Sprintf("clone3 errno=%d", unix.ENOSYS):
		c.detail = "runsc honours errnoRet: clone3 answers ENOSYS, threads fall back to clone"
	case fmt.Sprintf("clone3 errno=%d", unix.EPERM):
		c.err = fmt.Errorf("%s ignores seccomp errnoRet: clone3 would answer EPERM and glibc threads fail; build runsc with hack/patches (hack/setup.sh)", runsc)
	default:
		c.err = fmt.Errorf("unexpected probe output %q", out)
	}
	return c
}

// runClone3Probe runs `agentbox probe-clone3` in a sandbox whose only
// seccomp rule makes clone3 answer ENOSYS, and returns what it printed.
func runClone3Probe(ctx context.Context, runsc, self string) (string, error) {
	dir, err := os.MkdirTemp("", "agentbox-doctor-")
	if err != nil {
		return "", err
	}
	// Not os.RemoveAll: runsc leaves a mount in its root.
	defer mountguard.RemoveAll(dir)
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return "", err
	}
	if err := copyFile(self, filepath.Join(rootfs, "agentbox")); err != nil {
		return "", err
	}
	enosys := uint(unix.ENOSYS)
	spec := specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: rootfs, Readonly: true},
		Process:  &specs.Process{Args: []string{"/agentbox", "probe-clone3"}, Cwd: "/", Env: []string{"PATH=/"}},
		Hostname: "agentbox-doctor",
		Mounts:   []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}},
			Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{specs.ArchX86_64},
				Syscalls: []specs.LinuxSyscall{{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys}}},
		},
	}
	b, err := json.Marshal(&spec)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	id := fmt.Sprintf("agentbox-doctor-%d", os.Getpid())
	cmd := exec.CommandContext(ctx, runsc, "--root", filepath.Join(dir, "state"), "--network=none", "--oci-seccomp", "--ignore-cgroups",
		"run", "--bundle", dir, id)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("booting a test sandbox: %v: %s", err, lastLine(stderr.String()))
	}
	return stdout.String(), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
