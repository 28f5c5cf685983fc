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
	rt.create(&task.CreateTaskRequest{ID: "c1", Bundle: "/b/c1", Stdout: "/fifo/out", Stderr: "/fifo/err", Terminal: true}, 42)
	st, ok := rt.state("c1")
	if !ok {
		t.Fatal("a created container is not answered")
	}
	if st.ID != "c1" || st.Bundle != "/b/c1" || st.Pid != 42 || st.Status != tasktypes.Status_CREATED ||
		st.Stdout != "/fifo/out" || st.Stderr != "/fifo/err" || !st.Terminal || st.ExitStatus != 0 || st.ExitedAt == nil {
		t.Fatalf("created state %+v", st)
	}
	if _, ok := rt.statsOf("c1"); ok {
		t.Fatal("a created container's stats are read in the shim")
	}
	rt.start("c1", 42, &sentrystats.Sandbox{Socket: "/run/s.sock", Cgroup: "/pod1"})
	if sb, ok := rt.statsOf("c1"); !ok || sb.Socket != "/run/s.sock" || sb.Cgroup != "/pod1" {
		t.Fatalf("stats read from %+v (%v)", sb, ok)
	}
	st, ok = rt.state("c1")
	if !ok {
		t.Fatal("a started container is not answered")
	}
	if st.ID != "c1" || st.Bundle != "/b/c1" || st.Pid != 42 || st.Status != tasktypes.Status_RUNNING ||
		st.Stdout != "/fifo/out" || st.Stderr != "/fifo/err" || st.Stdin != "" || !st.Terminal || st.ExitStatus != 0 || st.ExitedAt == nil {
		t.Fatalf("state %+v", st)
	}
	rt.create(&task.CreateTaskRequest{ID: "c3"}, 8)
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
	// A created container that was signalled, or whose start began:
	// whether it is still created is runsc's to say.
	rt.create(&task.CreateTaskRequest{ID: "c4"}, 9)
	rt.unsure("c4")
	if _, ok := rt.state("c4"); ok {
		t.Fatal("a created container that was signalled is answered")
	}
	rt.start("c4", 9, nil) // and once started, it is the shim's again
	if st, ok := rt.state("c4"); !ok || st.Status != tasktypes.Status_RUNNING {
		t.Fatalf("a container started after its start began: %+v %v", st, ok)
	}
	rt.unsure("c3") // a running one signalled runs until its exit is seen
	if st, ok := rt.state("c3"); !ok || st.Status != tasktypes.Status_RUNNING {
		t.Fatalf("a running container signalled: %+v %v", st, ok)
	}
	// A failed Create: no pid, nothing to answer.
	rt.create(&task.CreateTaskRequest{ID: "c5"}, 0)
	if _, ok := rt.state("c5"); ok {
		t.Fatal("a container whose Create gave no pid is answered")
	}
}
