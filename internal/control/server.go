package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"agentbox.dev/agentbox/internal/privdir"
)

// Handler applies a request from peer. It is called for valid requests
// only, one connection at a time per server.
type Handler func(ctx context.Context, peer Peer, req Request) Response

// requestTimeout bounds how long a client may take to send its request.
const requestTimeout = 5 * time.Second

// Server serves one sandbox's control socket.
type Server struct {
	path  string
	ln    *net.UnixListener
	allow uint32
	// h answers each request. The server holds no lock around it: the
	// handler serializes what changes a sandbox (the shim's sandbox
	// operation lock), so a status is never held behind a checkpoint.
	h  Handler
	wg sync.WaitGroup
}

// Listen creates the socket at path (its directory 0700, the socket 0600)
// and serves it: only a peer whose uid is allowUID is answered.
func Listen(path string, allowUID uint32, h Handler) (*Server, error) {
	// Whoever could replace the socket could answer for the sandbox.
	if err := privdir.Ensure(filepath.Dir(path), privdir.Private); err != nil {
		return nil, fmt.Errorf("control socket dir: %w; it must be owned by uid %d with mode 0700", err, os.Geteuid())
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stale control socket: %w", err)
	}
	// The socket is created 0600 (umask), not chmod'ed after: no window in
	// which another user could connect.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	s := &Server{path: path, ln: ln, allow: allowUID, h: h}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Close stops serving and removes the socket; it waits for a request
// being applied.
func (s *Server) Close() {
	s.ln.Close()
	s.wg.Wait()
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			s.answer(c)
		}()
	}
}

// answer reads one request from c and writes one response.
func (s *Server) answer(c *net.UnixConn) {
	reply := func(r Response) {
		b, _ := json.Marshal(r)
		c.SetWriteDeadline(time.Now().Add(requestTimeout))
		c.Write(append(b, '\n'))
	}
	peer, err := PeerOf(c)
	if err != nil {
		reply(Response{Error: "peer credentials: " + err.Error()})
		return
	}
	if peer.UID != s.allow {
		reply(Response{Error: fmt.Sprintf("permission denied: uid %d may not control sandboxes (only uid %d)", peer.UID, s.allow)})
		return
	}
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	req, err := readRequest(c)
	if err != nil {
		reply(Response{Error: err.Error()})
		return
	}
	c.SetReadDeadline(time.Time{})
	start := time.Now()
	resp := s.h(context.Background(), peer, req)
	if resp.Micros == 0 {
		resp.Micros = time.Since(start).Microseconds()
	}
	reply(resp)
}

// readRequest reads and checks one request line.
func readRequest(r io.Reader) (Request, error) {
	line, err := bufio.NewReaderSize(io.LimitReader(r, maxRequest+1), 4096).ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) || len(line) > maxRequest {
			return Request{}, fmt.Errorf("request: longer than %d bytes", maxRequest)
		}
		if !errors.Is(err, io.EOF) || len(line) == 0 {
			return Request{}, fmt.Errorf("request: %w", err)
		}
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("request: %w", err)
	}
	if err := req.Validate(); err != nil {
		return Request{}, err
	}
	return req, nil
}

// PeerOf is the connected process's credentials, as the kernel recorded
// them at connect.
func PeerOf(c *net.UnixConn) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if cerr != nil {
		return Peer{}, cerr
	}
	return Peer{UID: cred.Uid, PID: cred.Pid}, nil
}
