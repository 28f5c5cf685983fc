package shim

import (
	"bytes"
	"os/exec"
	"testing"

	runc "github.com/containerd/go-runc"
)

func TestPlainWait(t *testing.T) {
	for _, c := range []struct {
		args []string
		id   string
	}{
		{[]string{"runsc", "--root=/r", "--log=/l.json", "--log-format=json", "wait", "c1"}, "c1"},
		{[]string{"runsc", "wait", "c1"}, "c1"},
		{[]string{"runsc", "--root=/r", "wait", "--checkpoint", "c1"}, ""},
		{[]string{"runsc", "--root=/r", "wait", "--pid", "3", "c1"}, ""},
		{[]string{"runsc", "--root", "/r", "wait", "c1"}, ""}, // a flag's value apart: not runsccmd's form
		{[]string{"runsc", "--root=/r", "state", "c1"}, ""},
		{[]string{"runsc", "--root=/r", "wait", "-x"}, ""},
		{[]string{"runsc", "wait"}, ""},
		{[]string{"runsc", "--root=/r", "delete", "wait"}, ""},
	} {
		id, ok := plainWait(c.args)
		if id != c.id || ok != (c.id != "") {
			t.Errorf("%q: %q %v, want %q", c.args, id, ok, c.id)
		}
	}
}

// fakeMonitor stands for runsccmd's: it says which commands reached it.
type fakeMonitor struct{ started []string }

func (f *fakeMonitor) Start(cmd *exec.Cmd) (chan runc.Exit, error) {
	f.started = append(f.started, cmd.Args[len(cmd.Args)-2])
	ec := make(chan runc.Exit, 1)
	ec <- runc.Exit{Status: 0}
	return ec, nil
}

func (f *fakeMonitor) Wait(_ *exec.Cmd, ec chan runc.Exit) (int, error) { return (<-ec).Status, nil }

func TestWaitMonitor(t *testing.T) {
	next := &fakeMonitor{}
	targets := map[string]waitTarget{
		// No socket answers: the wait fails as runsc's would.
		"known": {socket: t.TempDir() + "/none.sock"},
	}
	m := &waitMonitor{next: next, target: func(id string) (waitTarget, bool) { tg, ok := targets[id]; return tg, ok }, ours: map[*exec.Cmd]chan runc.Exit{}}
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		cmd := exec.Command("runsc", args...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		ec, err := m.Start(cmd)
		if err != nil {
			t.Fatal(err)
		}
		st, err := m.Wait(cmd, ec)
		if err != nil {
			t.Fatal(err)
		}
		return st, out.String() + errb.String()
	}
	if st, out := run("--root=/r", "wait", "known"); st == 0 || !bytes.Contains([]byte(out), []byte(`waiting on container "known"`)) {
		t.Errorf("a failed wait in the shim: %d %q", st, out)
	}
	if st, _ := run("--root=/r", "wait", "unknown"); st != 0 {
		t.Errorf("runsc's wait: %d", st)
	}
	run("--root=/r", "state", "known")
	run("--root=/r", "wait", "--checkpoint", "known")
	if want := []string{"wait", "state", "--checkpoint"}; len(next.started) != 3 || next.started[0] != want[0] || next.started[1] != want[1] || next.started[2] != want[2] {
		t.Errorf("runsc ran %q, want %q", next.started, want)
	}
	m.mu.Lock()
	left := len(m.ours)
	m.mu.Unlock()
	if left != 0 {
		t.Errorf("%d waits left behind", left)
	}
}
