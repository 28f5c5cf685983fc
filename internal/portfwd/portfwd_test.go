package portfwd

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

// containerManager stands in for runsc's control server: PortForward
// echoes (in upper case) what comes on the stream it is given, for port
// serve of container "pod" only, as the Sentry connects to a port where
// something listens.
type containerManager struct {
	serve uint16
	mu    sync.Mutex
	calls []string
}

func (cm *containerManager) PortForward(opts *portForwardOpts, _ *struct{}) error {
	cm.mu.Lock()
	cm.calls = append(cm.calls, opts.ContainerID)
	cm.mu.Unlock()
	if len(opts.Files) != 1 {
		return errors.New("stream FD is required for port forward")
	}
	if opts.ContainerID != "pod" || opts.Port != cm.serve {
		for _, f := range opts.Files {
			f.Close()
		}
		return errors.New("connection refused")
	}
	// The server closes the call's files when it returns, as runsc's
	// imports its own copy.
	fd, err := unix.Dup(int(opts.Files[0].Fd()))
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "stream")
	go func() {
		defer f.Close()
		b, _ := io.ReadAll(f)
		f.Write([]byte(strings.ToUpper(string(b))))
	}()
	return nil
}

// controlServer serves cm on a unix socket in dir.
func controlServer(t *testing.T, dir string, cm *containerManager) string {
	t.Helper()
	path := filepath.Join(dir, "runsc-pod.sock")
	ss, err := unet.BindAndListen(path, false)
	if err != nil {
		t.Fatal(err)
	}
	srv := urpc.NewServer()
	srv.Register(cm)
	go func() {
		for {
			s, err := ss.Accept()
			if err != nil {
				return
			}
			srv.StartHandling(s)
		}
	}()
	t.Cleanup(func() { ss.Close() })
	return path
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// A port's connection goes to the sandbox through its control socket and
// back, whole, and is one record at its end; a port where the sandbox has
// nothing is a recorded failure; after Close nothing listens.
func TestForwarder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering a network namespace needs root")
	}
	open, closed := freePort(t), freePort(t)
	cm := &containerManager{serve: uint16(open)}
	socket := controlServer(t, t.TempDir(), cm)
	recs := make(chan Conn, 2*maxConns)
	f, err := Start("/proc/self/ns/net", []int{open, closed}, socket, "pod", func(c Conn) { recs <- c })
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(open)))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "hello")
	c.(*net.TCPConn).CloseWrite()
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "HELLO" {
		t.Errorf("through the forwarder: %q", b)
	}
	if r := <-recs; r.Err != nil || r.In != 5 || r.Out != 5 {
		t.Errorf("the connection's record: %+v", r)
	}

	c, err = net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(closed)))
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _ := c.Read(make([]byte, 1)); n != 0 {
		t.Error("a port the sandbox does not serve answered")
	}
	c.Close()
	if r := <-recs; r.Err == nil || !strings.Contains(r.Err.Error(), "connection refused") {
		t.Errorf("the refused connection's record: %+v", r)
	}

	// At most maxConns at once: one over is closed and recorded (the
	// listener accepts in order, so the held ones hold every slot).
	var held []net.Conn
	for range maxConns {
		c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(open)))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "x") // answered once this side ends
		held = append(held, c)
	}
	c, err = net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(open)))
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _ := c.Read(make([]byte, 1)); n != 0 {
		t.Error("a connection over the bound was forwarded")
	}
	c.Close()
	if r := <-recs; r.Err == nil || !strings.Contains(r.Err.Error(), "port-forward connections at once") {
		t.Errorf("the connection over the bound: %+v", r)
	}
	// Close ends the connections under way, and records each.
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range held {
		c.Close()
	}
	if got := len(recs); got != maxConns {
		t.Errorf("%d records of the %d connections Close ended", got, maxConns)
	}
	if c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(open))); err == nil {
		c.Close()
		t.Error("a port listens after Close")
	}
}
