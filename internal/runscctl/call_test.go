package runscctl

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve answers each connection to a unix socket in dir with answer(call),
// written as is ("" closes the connection unanswered, as a sandbox that
// goes does).
func serve(t *testing.T, answer func(method string, arg json.RawMessage) string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "c.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var call struct {
					Method string          `json:"method"`
					Arg    json.RawMessage `json:"arg"`
				}
				if json.NewDecoder(c).Decode(&call) != nil {
					return
				}
				if a := answer(call.Method, call.Arg); a != "" {
					c.Write([]byte(a))
				}
			}()
		}
	}()
	return sock
}

func TestWait(t *testing.T) {
	release := make(chan struct{})
	sock := serve(t, func(method string, arg json.RawMessage) string {
		if method != waitMethod {
			return `{"success":false,"err":"unknown method"}`
		}
		switch string(arg) {
		case `"exits-3"`:
			return `{"success":true,"result":768}` // exit status 3
		case `"killed"`:
			return `{"success":true,"result":9}` // SIGKILL
		case `"later"`:
			<-release
			return `{"success":true,"result":0}`
		case `"blocks"`:
			<-t.Context().Done()
			return ""
		case `"gone"`:
			return ""
		case `"odd"`:
			return `{"success":true,"result":"nine"}`
		}
		return `{"success":false,"err":"no container was found"}`
	})
	ctx := context.Background()
	for _, c := range []struct {
		id, err string
		want    int
	}{
		{id: "exits-3", want: 3},
		{id: "killed", want: 137},
		{id: "unknown", err: "no container was found"},
		{id: "gone", err: "reply"},
		{id: "odd", err: "result"},
	} {
		got, err := Wait(ctx, sock, c.id)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %d, %v; want %d, %q", c.id, got, err, c.want, c.err)
		}
	}
	// A wait lasts as long as the container, and no longer than its ctx.
	done := make(chan error, 1)
	go func() { _, err := Wait(ctx, sock, "later"); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("the wait returned before the container exited: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { _, err := Wait(cctx, sock, "blocks"); done <- err }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a cancelled wait succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Error("a cancelled wait went on")
	}
	if _, err := Wait(ctx, filepath.Join(t.TempDir(), "none.sock"), "c"); err == nil || !strings.Contains(err.Error(), "control socket") {
		t.Errorf("no socket: %v", err)
	}
}
