// Package portfwd makes the node's port-forward reach a gVisor sandbox's
// ports, and only the ones its role names.
//
// containerd answers a CRI PortForward (kubectl port-forward, crictl
// port-forward, agent-sandbox's SDK) by dialing localhost:PORT inside the
// pod's network namespace. Under gVisor nothing listens there: the
// sandbox's own network stack holds its sockets, so every port-forward to
// a gVisor pod fails. A Forwarder listens on 127.0.0.1:PORT in that
// namespace for each port the role's network.portForward names and hands
// each connection to the sandbox through runsc's control socket
// (containerManager.PortForward), as `runsc port-forward` does: the Sentry
// connects to the port inside the sandbox and copies. A port the role does
// not name has no listener, and containerd's dial is refused.
//
// Only processes in the pod's namespace on the node reach the listeners:
// the sandbox's own loopback is gVisor's, not this one.
package portfwd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"

	"agentbox.dev/agentbox/internal/nsthread"
	"agentbox.dev/agentbox/internal/runscctl"
)

const (
	// maxConns bounds the connections forwarded at once per sandbox; one
	// over it is closed and recorded.
	maxConns = 64
	// callTimeout bounds the control socket's answer.
	callTimeout = 5 * time.Second
	// method is runsc's control call (runsc/boot.ContMgrPortForward).
	method = "containerManager.PortForward"
)

// Conn is one forwarded connection, as it ended.
type Conn struct {
	Port int
	// In is the bytes the node sent the sandbox; Out what it answered.
	In, Out  int64
	Duration time.Duration
	// Err is why the sandbox did not take it (nil: it did).
	Err error
}

// Forwarder is a sandbox's port-forward listeners.
type Forwarder struct {
	socket, id string
	record     func(Conn)
	listeners  []net.Listener
	slots      chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	// +checklocks:mu
	open map[net.Conn]struct{}
	// +checklocks:mu
	closed bool
}

// Start listens on 127.0.0.1:PORT in the network namespace at netns for
// each port, forwarding to container id (the pod's sandbox) through the
// runsc control socket at socket. record is called once for each
// connection, at its end.
func Start(netns string, ports []int, socket, id string, record func(Conn)) (*Forwarder, error) {
	f := &Forwarder{socket: socket, id: id, record: record, slots: make(chan struct{}, maxConns), open: map[net.Conn]struct{}{}}
	err := nsthread.Run(nsthread.Path(netns), func() error {
		for _, port := range ports {
			l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				return fmt.Errorf("port-forward listener for port %d: %w", port, err)
			}
			f.listeners = append(f.listeners, l)
		}
		return nil
	})
	if err != nil {
		for _, l := range f.listeners {
			l.Close()
		}
		return nil, err
	}
	for i, l := range f.listeners {
		f.wg.Add(1)
		go f.serve(l, ports[i])
	}
	return f, nil
}

// Close stops the listeners and the connections under way, and waits for
// their records.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	var errs []error
	for _, l := range f.listeners {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	f.wg.Wait()
	return errors.Join(errs...)
}

func (f *Forwarder) serve(l net.Listener, port int) {
	defer f.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case f.slots <- struct{}{}:
		default:
			c.Close()
			f.record(Conn{Port: port, Err: fmt.Errorf("over %d port-forward connections at once", maxConns)})
			continue
		}
		if !f.track(c) {
			<-f.slots
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-f.slots }()
			f.record(f.forward(c, port))
			f.untrack(c)
		}()
	}
}

func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.open[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.open, c)
}

// forward hands c to the sandbox's port and copies until both ends are
// done.
func (f *Forwarder) forward(c net.Conn, port int) Conn {
	start := time.Now()
	defer c.Close()
	out := Conn{Port: port}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		out.Err = err
		return out
	}
	theirs := os.NewFile(uintptr(fds[1]), "port-forward")
	oursFile := os.NewFile(uintptr(fds[0]), "port-forward")
	ours, err := net.FileConn(oursFile)
	oursFile.Close()
	if err != nil {
		theirs.Close()
		out.Err = err
		return out
	}
	defer ours.Close()
	if !f.track(ours) {
		theirs.Close()
		out.Err = errors.New("the sandbox's port-forward stopped")
		return out
	}
	defer f.untrack(ours)
	err = call(f.socket, f.id, port, theirs)
	theirs.Close()
	if err != nil {
		out.Err = err
		return out
	}
	in := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(ours, c)
		closeWrite(ours)
		in <- n
	}()
	out.Out, _ = io.Copy(c, ours)
	closeWrite(c)
	out.In = <-in
	out.Duration = time.Since(start)
	return out
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// portForwardOpts is runsc/boot.PortForwardOpts, as its control server
// decodes it.
type portForwardOpts struct {
	urpc.FilePayload
	ContainerID string
	Port        uint16
}

// call asks the sandbox at socket to connect container id's port to
// stream.
func call(socket, id string, port int, stream *os.File) error {
	sock, err := dial(socket)
	if err != nil {
		return fmt.Errorf("sandbox control socket: %w", err)
	}
	client := urpc.NewClient(sock)
	done := make(chan error, 1)
	go func() {
		done <- client.Call(method, &portForwardOpts{FilePayload: urpc.FilePayload{Files: []*os.File{stream}}, ContainerID: id, Port: uint16(port)}, nil)
	}()
	select {
	case err = <-done:
		client.Close()
	case <-time.After(callTimeout):
		client.Close()
		err = fmt.Errorf("no answer in %v", callTimeout)
	}
	if err != nil {
		return fmt.Errorf("sandbox port %d: %w", port, err)
	}
	return nil
}

// dial connects to the unix socket at path (through /proc/self/fd when
// it is too long for sockaddr_un).
func dial(path string) (*unet.Socket, error) {
	path, done, err := runscctl.Dialable(path)
	if err != nil {
		return nil, err
	}
	defer done()
	return unet.Connect(path, false)
}
