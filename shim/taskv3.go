package shim

import (
	"context"
	"fmt"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	task3 "github.com/containerd/containerd/api/runtime/task/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// taskV3 serves containerd's task API v3 (containerd.task.v3.Task) with the
// shim's v2 service. containerd 2.x talks v3 to a shim that answered `shim
// start` with version 3, and then joins a pod's later containers to the
// pod's shim without running `shim start` for each (a process start of this
// binary saved per container; see manager.TaskV3). The two versions'
// messages are the same, field for field (api/runtime/task/v{2,3}/shim.proto
// differ only in their package), so each request and response is carried
// across by its wire encoding: nothing is interpreted on the way.
type taskV3 struct{ v2 task.TaskService }

var _ task3.TTRPCTaskService = taskV3{}

// call carries a v3 request to the v2 method and its answer back.
func call[Q2, A2, A3 any, PQ2 interface {
	*Q2
	proto.Message
}, PA2 interface {
	*A2
	proto.Message
}, PA3 interface {
	*A3
	proto.Message
}](ctx context.Context, req proto.Message, method func(context.Context, PQ2) (PA2, error)) (PA3, error) {
	in := PQ2(new(Q2))
	if err := recode(req, in); err != nil {
		return nil, err
	}
	res, err := method(ctx, in)
	if err != nil {
		return nil, err
	}
	out := PA3(new(A3))
	if err := recode(res, out); err != nil {
		return nil, err
	}
	return out, nil
}

// empty is call for the methods that answer google.protobuf.Empty in both
// versions.
func empty[Q2 any, PQ2 interface {
	*Q2
	proto.Message
}](ctx context.Context, req proto.Message, method func(context.Context, PQ2) (*emptypb.Empty, error)) (*emptypb.Empty, error) {
	in := PQ2(new(Q2))
	if err := recode(req, in); err != nil {
		return nil, err
	}
	return method(ctx, in)
}

func recode(from, to proto.Message) error {
	b, err := proto.Marshal(from)
	if err != nil {
		return fmt.Errorf("task v3: encode %T: %w", from, err)
	}
	if err := proto.Unmarshal(b, to); err != nil {
		return fmt.Errorf("task v3: decode as %T: %w", to, err)
	}
	return nil
}

func (t taskV3) State(ctx context.Context, r *task3.StateRequest) (*task3.StateResponse, error) {
	return call[task.StateRequest, task.StateResponse, task3.StateResponse](ctx, r, t.v2.State)
}

func (t taskV3) Create(ctx context.Context, r *task3.CreateTaskRequest) (*task3.CreateTaskResponse, error) {
	return call[task.CreateTaskRequest, task.CreateTaskResponse, task3.CreateTaskResponse](ctx, r, t.v2.Create)
}

func (t taskV3) Start(ctx context.Context, r *task3.StartRequest) (*task3.StartResponse, error) {
	return call[task.StartRequest, task.StartResponse, task3.StartResponse](ctx, r, t.v2.Start)
}

func (t taskV3) Delete(ctx context.Context, r *task3.DeleteRequest) (*task3.DeleteResponse, error) {
	return call[task.DeleteRequest, task.DeleteResponse, task3.DeleteResponse](ctx, r, t.v2.Delete)
}

func (t taskV3) Pids(ctx context.Context, r *task3.PidsRequest) (*task3.PidsResponse, error) {
	return call[task.PidsRequest, task.PidsResponse, task3.PidsResponse](ctx, r, t.v2.Pids)
}

func (t taskV3) Wait(ctx context.Context, r *task3.WaitRequest) (*task3.WaitResponse, error) {
	return call[task.WaitRequest, task.WaitResponse, task3.WaitResponse](ctx, r, t.v2.Wait)
}

func (t taskV3) Stats(ctx context.Context, r *task3.StatsRequest) (*task3.StatsResponse, error) {
	return call[task.StatsRequest, task.StatsResponse, task3.StatsResponse](ctx, r, t.v2.Stats)
}

func (t taskV3) Connect(ctx context.Context, r *task3.ConnectRequest) (*task3.ConnectResponse, error) {
	return call[task.ConnectRequest, task.ConnectResponse, task3.ConnectResponse](ctx, r, t.v2.Connect)
}

func (t taskV3) Pause(ctx context.Context, r *task3.PauseRequest) (*emptypb.Empty, error) {
	return empty[task.PauseRequest](ctx, r, t.v2.Pause)
}

func (t taskV3) Resume(ctx context.Context, r *task3.ResumeRequest) (*emptypb.Empty, error) {
	return empty[task.ResumeRequest](ctx, r, t.v2.Resume)
}

func (t taskV3) Checkpoint(ctx context.Context, r *task3.CheckpointTaskRequest) (*emptypb.Empty, error) {
	return empty[task.CheckpointTaskRequest](ctx, r, t.v2.Checkpoint)
}

func (t taskV3) Kill(ctx context.Context, r *task3.KillRequest) (*emptypb.Empty, error) {
	return empty[task.KillRequest](ctx, r, t.v2.Kill)
}

func (t taskV3) Exec(ctx context.Context, r *task3.ExecProcessRequest) (*emptypb.Empty, error) {
	return empty[task.ExecProcessRequest](ctx, r, t.v2.Exec)
}

func (t taskV3) ResizePty(ctx context.Context, r *task3.ResizePtyRequest) (*emptypb.Empty, error) {
	return empty[task.ResizePtyRequest](ctx, r, t.v2.ResizePty)
}

func (t taskV3) CloseIO(ctx context.Context, r *task3.CloseIORequest) (*emptypb.Empty, error) {
	return empty[task.CloseIORequest](ctx, r, t.v2.CloseIO)
}

func (t taskV3) Update(ctx context.Context, r *task3.UpdateTaskRequest) (*emptypb.Empty, error) {
	return empty[task.UpdateTaskRequest](ctx, r, t.v2.Update)
}

func (t taskV3) Shutdown(ctx context.Context, r *task3.ShutdownRequest) (*emptypb.Empty, error) {
	return empty[task.ShutdownRequest](ctx, r, t.v2.Shutdown)
}
