package shim

import (
	"testing"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
)

func TestRunningTasks(t *testing.T) {
	var rt runningTasks
	if _, ok := rt.state("c1"); ok {
		t.Fatal("a container never created has a state")
	}
	rt.create(&task.CreateTaskRequest{ID: "c1", Bundle: "/b/c1", Stdout: "/fifo/out", Stderr: "/fifo/err", Terminal: true})
	if _, ok := rt.state("c1"); ok {
		t.Fatal("a created container is answered: only a running one is the shim's")
	}
	rt.start("c1", 42)
	st, ok := rt.state("c1")
	if !ok {
		t.Fatal("a started container is not answered")
	}
	if st.ID != "c1" || st.Bundle != "/b/c1" || st.Pid != 42 || st.Status != tasktypes.Status_RUNNING ||
		st.Stdout != "/fifo/out" || st.Stderr != "/fifo/err" || st.Stdin != "" || !st.Terminal || st.ExitStatus != 0 || st.ExitedAt == nil {
		t.Fatalf("state %+v", st)
	}
	rt.start("c2", 7) // never created: nothing to say of its bundle or stdio
	if _, ok := rt.state("c2"); ok {
		t.Fatal("a container started without its Create is answered")
	}
	rt.end("c1")
	if _, ok := rt.state("c1"); ok {
		t.Fatal("an exited container is answered")
	}
	rt.start("c1", 42) // a second start after the exit finds no Create
	if _, ok := rt.state("c1"); ok {
		t.Fatal("an exited container is answered after a second start")
	}
}
