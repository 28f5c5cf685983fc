package runscctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// Call makes one urpc call to the control socket at socket, as runsc does:
// method with arg as one JSON message, and one JSON reply, whose result is
// decoded into result. At most limit bytes of the reply are read. ctx
// bounds the call: without a deadline (a wait), it ends when the sandbox
// answers, when the sandbox goes (the socket closes), or when ctx is done.
func Call(ctx context.Context, socket, method string, arg, result any, limit int64) error {
	dialable, done, err := Dialable(socket)
	if err != nil {
		return fmt.Errorf("sandbox control socket: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", dialable)
	done()
	if err != nil {
		return fmt.Errorf("sandbox control socket: %w", err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(deadline); err != nil {
			return err
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	call, err := json.Marshal(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{method, arg})
	if err != nil {
		return err
	}
	if _, err := conn.Write(call); err != nil {
		return fmt.Errorf("sandbox control socket: %w", err)
	}
	return DecodeReply(io.LimitReader(conn, limit), result)
}

// DecodeReply reads one urpc reply from r, its result into result.
func DecodeReply(r io.Reader, result any) error {
	var reply struct {
		Success bool            `json:"success"`
		Err     string          `json:"err"`
		Result  json.RawMessage `json:"result"`
	}
	if err := json.NewDecoder(r).Decode(&reply); err != nil {
		return fmt.Errorf("sandbox control socket: reply: %w", err)
	}
	if !reply.Success {
		return fmt.Errorf("sandbox control socket: %s", Brief(reply.Err))
	}
	if err := json.Unmarshal(reply.Result, result); err != nil {
		return fmt.Errorf("sandbox control socket: result: %w", err)
	}
	return nil
}

// Brief bounds a string the sandbox sent before it is logged.
func Brief(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// waitMethod is the control server's wait for a container's exit
// (runsc/boot.ContMgrWait), the call `runsc wait ID` makes.
const waitMethod = "containerManager.Wait"

// Wait waits for container id of the sandbox whose control socket is
// socket to exit, and gives its exit status as runsc wait prints it
// (128+N for a signal N).
func Wait(ctx context.Context, socket, id string) (int, error) {
	var ws unix.WaitStatus
	if err := Call(ctx, socket, waitMethod, id, &ws, 4096); err != nil {
		return 0, err
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}
