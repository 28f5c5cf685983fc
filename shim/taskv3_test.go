package shim

import (
	"context"
	"testing"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	task3 "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// v2Recorder is the v2 service behind taskV3 in the tests: it keeps the
// requests it got and answers with set fields. Methods it does not define
// are not called.
type v2Recorder struct {
	task.TaskService
	got []proto.Message
}

func (r *v2Recorder) Create(_ context.Context, q *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	r.got = append(r.got, q)
	return &task.CreateTaskResponse{Pid: 4242}, nil
}

func (r *v2Recorder) State(_ context.Context, q *task.StateRequest) (*task.StateResponse, error) {
	r.got = append(r.got, q)
	return &task.StateResponse{ID: q.ID, Bundle: "/b", Pid: 7, Stdout: "/o", ExitStatus: 3}, nil
}

func (r *v2Recorder) Kill(_ context.Context, q *task.KillRequest) (*emptypb.Empty, error) {
	r.got = append(r.got, q)
	return &emptypb.Empty{}, nil
}

// Every field crosses from v3 to v2 and back: the two versions' messages
// have the same numbers, and the adapter carries their encoding.
func TestTaskV3CarriesEveryField(t *testing.T) {
	rec := &v2Recorder{}
	v3 := taskV3{rec}
	ctx := context.Background()
	opts := &anypb.Any{TypeUrl: "runtimeoptions.v1.Options", Value: []byte{1, 2, 3}}
	create, err := v3.Create(ctx, &task3.CreateTaskRequest{
		ID: "c1", Bundle: "/run/b/c1", Rootfs: []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l"}}},
		Stdin: "/i", Stdout: "/o", Terminal: true, Options: opts,
	})
	if err != nil || create.Pid != 4242 {
		t.Fatalf("create: %v %v", create, err)
	}
	want := &task.CreateTaskRequest{
		ID: "c1", Bundle: "/run/b/c1", Rootfs: []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l"}}},
		Stdin: "/i", Stdout: "/o", Terminal: true, Options: opts,
	}
	if !proto.Equal(rec.got[0], want) {
		t.Fatalf("v2 got %v, want %v", rec.got[0], want)
	}
	st, err := v3.State(ctx, &task3.StateRequest{ID: "c1", ExecID: "e"})
	if err != nil || st.ID != "c1" || st.Bundle != "/b" || st.Pid != 7 || st.Stdout != "/o" || st.ExitStatus != 3 {
		t.Fatalf("state: %v %v", st, err)
	}
	if q := rec.got[1].(*task.StateRequest); q.ID != "c1" || q.ExecID != "e" {
		t.Fatalf("state request: %v", q)
	}
	if _, err := v3.Kill(ctx, &task3.KillRequest{ID: "c1", Signal: 9, All: true}); err != nil {
		t.Fatal(err)
	}
	if q := rec.got[2].(*task.KillRequest); q.ID != "c1" || q.Signal != 9 || !q.All {
		t.Fatalf("kill request: %v", q)
	}
}
