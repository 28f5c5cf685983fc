package shim

import (
	"testing"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"

	"agentbox.dev/agentbox/internal/sentrystats"
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
	if _, ok := rt.statsOf("c1"); ok {
		t.Fatal("a created container's stats are read in the shim")
	}
	rt.start("c1", 42, &sentrystats.Sandbox{Socket: "/run/s.sock", Cgroup: "/pod1"})
	if sb, ok := rt.statsOf("c1"); !ok || sb.Socket != "/run/s.sock" || sb.Cgroup != "/pod1" {
		t.Fatalf("stats read from %+v (%v)", sb, ok)
	}
	st, ok := rt.state("c1")
	if !ok {
		t.Fatal("a started container is not answered")
	}
	if st.ID != "c1" || st.Bundle != "/b/c1" || st.Pid != 42 || st.Status != tasktypes.Status_RUNNING ||
		st.Stdout != "/fifo/out" || st.Stderr != "/fifo/err" || st.Stdin != "" || !st.Terminal || st.ExitStatus != 0 || st.ExitedAt == nil {
		t.Fatalf("state %+v", st)
	}
	rt.create(&task.CreateTaskRequest{ID: "c3"})
	rt.start("c3", 8, nil) // its sandbox's stats are not read in the shim
	if _, ok := rt.statsOf("c3"); ok {
		t.Fatal("stats read in the shim without a sandbox to read them from")
	}
	if _, ok := rt.state("c3"); !ok {
		t.Fatal("a running container without in-shim stats has no state")
	}
	rt.start("c2", 7, nil) // never created: nothing to say of its bundle or stdio
	if _, ok := rt.state("c2"); ok {
		t.Fatal("a container started without its Create is answered")
	}
	rt.end("c1")
	if _, ok := rt.state("c1"); ok {
		t.Fatal("an exited container is answered")
	}
	if _, ok := rt.statsOf("c1"); ok {
		t.Fatal("an exited container's stats are read in the shim")
	}
	rt.start("c1", 42, nil) // a second start after the exit finds no Create
	if _, ok := rt.state("c1"); ok {
		t.Fatal("an exited container is answered after a second start")
	}
}
