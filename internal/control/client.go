package control

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Call sends req to the sandbox behind the socket at path and returns its
// answer. A response that says the request failed is an error naming the
// socket.
func Call(path string, req Request, timeout time.Duration) (Response, error) {
	if err := req.Validate(); err != nil {
		return Response{}, err
	}
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return Response{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	b, err := json.Marshal(req)
	if err != nil {
		return Response{}, err
	}
	// A shim that refuses the peer answers before it reads: its answer,
	// not the failed write, is what the caller needs.
	_, werr := c.Write(append(b, '\n'))
	line, err := bufio.NewReaderSize(c, 64<<10).ReadBytes('\n')
	if err != nil && len(line) == 0 {
		if werr != nil {
			err = werr
		}
		return Response{}, fmt.Errorf("%s: no answer: %w", path, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("%s: malformed answer: %w", path, err)
	}
	if !resp.OK {
		if resp.Error == "" {
			resp.Error = "the shim answered neither ok nor an error"
		}
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}

// Listed is one socket of a control directory and what its shim said.
type Listed struct {
	Socket  string
	Sandbox *Sandbox
	// Err says why the socket did not answer (a shim that is gone left it).
	Err error
}

// List asks every sandbox socket under dir for its info. A directory that
// does not exist lists nothing.
func List(dir string, timeout time.Duration) ([]Listed, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []Listed
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".sock") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		p := filepath.Join(dir, e.Name())
		resp, err := Call(p, Request{Op: OpInfo}, timeout)
		out = append(out, Listed{Socket: p, Sandbox: resp.Sandbox, Err: err})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Sandbox == nil) != (b.Sandbox == nil) {
			return a.Sandbox != nil
		}
		if a.Sandbox != nil && b.Sandbox != nil && !a.Sandbox.Started.Equal(b.Sandbox.Started) {
			return a.Sandbox.Started.Before(b.Sandbox.Started)
		}
		return a.Socket < b.Socket
	})
	return out, nil
}

// Find picks the one sandbox that id names (its full id, or a prefix of it
// that only it has) or, with pod, the running sandbox of pod NAMESPACE/NAME.
func Find(listed []Listed, id, pod string) (Listed, error) {
	if (id == "") == (pod == "") {
		return Listed{}, errors.New("name one sandbox: an ID, or --pod NAMESPACE/NAME")
	}
	var hits []Listed
	for _, l := range listed {
		if l.Sandbox == nil {
			continue
		}
		switch {
		case pod != "" && l.Sandbox.Pod == pod,
			id != "" && strings.HasPrefix(l.Sandbox.ID, id):
			hits = append(hits, l)
		}
	}
	what := "sandbox " + id
	if pod != "" {
		what = "pod " + pod
	}
	switch len(hits) {
	case 0:
		return Listed{}, fmt.Errorf("no running sandbox for %s (agentbox sandbox list shows them)", what)
	case 1:
		return hits[0], nil
	}
	var ids []string
	for _, h := range hits {
		ids = append(ids, h.Sandbox.ID)
	}
	return Listed{}, fmt.Errorf("%s matches %d sandboxes (%s): give the full id", what, len(hits), strings.Join(ids, ", "))
}
