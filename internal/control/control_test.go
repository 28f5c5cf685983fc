package control

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func serve(t *testing.T, dir, id string, allow uint32, h Handler) *Server {
	t.Helper()
	s, err := Listen(SocketPath(dir, "/run/containerd.sock", id), allow, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

var started atomic.Int64

func info(id, pod string) Handler {
	at := time.Unix(started.Add(1), 0)
	return func(_ context.Context, _ Peer, req Request) Response {
		return Response{OK: true, Message: req.Op + " " + req.Reason, Sandbox: &Sandbox{ID: id, Pod: pod, Started: at}}
	}
}

func TestCallAndPeer(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	var seen atomic.Value
	s := serve(t, dir, "sb1", uint32(os.Geteuid()), func(_ context.Context, p Peer, req Request) Response {
		seen.Store(p)
		return Response{OK: true, Message: req.Op + ": " + req.Reason}
	})
	fi, err := os.Stat(s.Path())
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v mode %v", err, fi.Mode())
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v", di.Mode())
	}
	resp, err := Call(s.Path(), Request{Op: OpQuarantine, Reason: "exfil seen"}, time.Second)
	if err != nil || resp.Message != "quarantine: exfil seen" {
		t.Fatalf("%+v %v", resp, err)
	}
	if p := seen.Load().(Peer); p.UID != uint32(os.Geteuid()) || p.PID != int32(os.Getpid()) {
		t.Fatalf("peer %+v", p)
	}
}

// A peer of another uid is refused before its request is read, whatever
// the socket's mode lets through.
func TestOtherUIDRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	called := false
	s := serve(t, dir, "sb1", uint32(os.Geteuid())+1, func(context.Context, Peer, Request) Response {
		called = true
		return Response{OK: true}
	})
	_, err := Call(s.Path(), Request{Op: OpStop, Reason: "x"}, time.Second)
	if err == nil || !strings.Contains(err.Error(), "permission denied") || called {
		t.Fatalf("err %v called %v", err, called)
	}
}

func TestBadRequests(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	s := serve(t, dir, "sb1", uint32(os.Geteuid()), info("sb1", ""))
	for _, tc := range []struct{ send, want string }{
		{`{"op":"quarantine"}` + "\n", "reason: quarantine needs a reason"},
		{`{"op":"explode","reason":"x"}` + "\n", `op: "explode" is not one of`},
		{`{"op":"info","extra":1}` + "\n", `unknown field "extra"`},
		{`not json` + "\n", "request:"},
		{`{"op":"stop","reason":"a` + strings.Repeat("b", 2000) + `"}` + "\n", "reason: 2001 bytes, at most 1024"},
		{`{"op":"stop","reason":"a\u001b[2Jb"}` + "\n", "reason: control character"},
		{strings.Repeat("x", maxRequest+10), "longer than"},
		{`{"op":"owner"}` + "\n", "owner: owner needs the Sandbox"},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Pod","namespace":"a","name":"b","uid":"u"}}}` + "\n", `owner.sandbox.kind: "Pod", not Sandbox`},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b/../c","uid":"u"}}}` + "\n", `owner.sandbox.name: "b/../c" is not a Kubernetes name`},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":""}}}` + "\n", "owner.sandbox.uid: 0 bytes"},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":"u"},"holder":{"kind":"SandboxClaim","namespace":"other","name":"c","uid":"v"}}}` + "\n", `owner.holder.namespace: "other", not the Sandbox's "a"`},
		{`{"op":"info","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":"u"}}}` + "\n", "owner: only owner takes one, not info"},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":"u"},"holder":{"kind":"SandboxWarmPool","namespace":"a","name":"p","uid":"v"},"claim":{"task":"t"}}}` + "\n", "owner.claim: only with a SandboxClaim holder"},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":"u"},"claimRefused":"x"}}` + "\n", "owner.claim: only with a SandboxClaim holder"},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":"u"},"holder":{"kind":"SandboxClaim","namespace":"a","name":"c","uid":"v"},"claim":{"subject":"a\nb"}}}` + "\n", "owner.claim.subject: holds a character that is not printable (U+000A)"},
		{`{"op":"owner","owner":{"sandbox":{"kind":"Sandbox","namespace":"a","name":"b","uid":"u"},"holder":{"kind":"SandboxClaim","namespace":"a","name":"c","uid":"v"},"claim":{"task":"t"},"claimRefused":"x"}}` + "\n", "owner.claim: both a claim and why it was refused"},
	} {
		c, err := net.Dial("unix", s.Path())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(tc.send))
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _ := c.Read(buf)
		c.Close()
		var got Response
		if err := json.Unmarshal(buf[:n], &got); err != nil || got.OK || !strings.Contains(got.Error, tc.want) {
			t.Errorf("%.40q: got %q (%v), want %q", tc.send, buf[:n], err, tc.want)
		}
	}
	// A client that sends nothing is cut off, and the socket keeps serving.
	c, _ := net.Dial("unix", s.Path())
	defer c.Close()
	if _, err := Call(s.Path(), Request{Op: OpInfo}, time.Second); err != nil {
		t.Fatal(err)
	}
}

// A directory others can write to could hold a socket that answers for
// the sandbox: the shim refuses to serve there.
func TestLooseDirRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	_, err := Listen(SocketPath(dir, "a", "b"), uint32(os.Geteuid()), info("b", ""))
	if err == nil || !strings.Contains(err.Error(), "mode 0700") {
		t.Fatalf("got %v", err)
	}
}

func TestListAndFind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	uid := uint32(os.Geteuid())
	serve(t, dir, "aaaa1111", uid, info("aaaa1111", "agents/coder-1"))
	serve(t, dir, "aaaa2222", uid, info("aaaa2222", "agents/coder-2"))
	gone := serve(t, dir, "bbbb", uid, info("bbbb", ""))
	// A shim killed without cleaning up leaves its socket behind.
	gone.ln.SetUnlinkOnClose(false)
	gone.Close()
	listed, err := List(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 3 || listed[2].Err == nil || listed[0].Sandbox.ID != "aaaa1111" {
		t.Fatalf("%+v", listed)
	}
	for _, tc := range []struct{ id, pod, want, err string }{
		{id: "aaaa2", want: "aaaa2222"},
		{pod: "agents/coder-1", want: "aaaa1111"},
		{id: "aaaa", err: "matches 2 sandboxes"},
		{id: "cccc", err: "no running sandbox for sandbox cccc"},
		{pod: "agents/x", err: "no running sandbox for pod agents/x"},
		{err: "name one sandbox"},
		{id: "a", pod: "b/c", err: "name one sandbox"},
	} {
		got, err := Find(listed, tc.id, tc.pod)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s %s: got %v, want %q", tc.id, tc.pod, err, tc.err)
		case tc.err == "" && (err != nil || got.Sandbox.ID != tc.want):
			t.Errorf("%s %s: got %+v %v", tc.id, tc.pod, got, err)
		}
	}
	if l, err := List(filepath.Join(dir, "none"), time.Second); err != nil || l != nil {
		t.Fatalf("missing dir: %v %v", l, err)
	}
}

// The server holds no lock of its own around its handler: requests reach
// it at once, and the handler serializes what changes a sandbox (the
// shim's operation lock), so a status is never held behind a slow
// checkpoint. (The lock order, shim/sandbox's package doc, has no place
// for one here.)
func TestRequestsReachTheHandlerAtOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	var inside, most atomic.Int32
	s := serve(t, dir, "sb1", uint32(os.Geteuid()), func(context.Context, Peer, Request) Response {
		n := inside.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		inside.Add(-1)
		return Response{OK: true}
	})
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		go func() {
			_, err := Call(s.Path(), Request{Op: OpFreeze, Reason: "x"}, 5*time.Second)
			errs <- err
		}()
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if most.Load() < 2 {
		t.Fatalf("at most %d request reached the handler at once: the server serializes them", most.Load())
	}
}

// Owners compare by holder (the shim's once-bound claim) and in full (what
// the node agent resends).
func TestOwnerSame(t *testing.T) {
	sb := ObjectRef{Kind: "Sandbox", Namespace: "a", Name: "s", UID: "u"}
	pool := &ObjectRef{Kind: "SandboxWarmPool", Namespace: "a", Name: "p", UID: "v"}
	claim := &ObjectRef{Kind: "SandboxClaim", Namespace: "a", Name: "c", UID: "w"}
	warm := &Owner{Sandbox: sb, Holder: pool}
	claimed := &Owner{Sandbox: sb, Holder: claim}
	bound := &Owner{Sandbox: sb, Holder: claim, Claim: &Claim{Tenant: "acme"}}
	other := &Owner{Sandbox: sb, Holder: claim, Claim: &Claim{Tenant: "other"}}
	refused := &Owner{Sandbox: sb, Holder: claim, ClaimRefused: "no"}
	for _, tc := range []struct {
		a, b             *Owner
		sameHolder, same bool
	}{
		{warm, warm, true, true},
		{warm, claimed, false, false},
		{&Owner{Sandbox: sb}, warm, false, false},
		{claimed, bound, true, false},
		{bound, &Owner{Sandbox: sb, Holder: claim, Claim: &Claim{Tenant: "acme"}}, true, true},
		{bound, other, true, false},
		{bound, refused, true, false},
	} {
		if got := tc.a.SameHolder(tc.b); got != tc.sameHolder {
			t.Errorf("%+v SameHolder %+v: %v", tc.a, tc.b, got)
		}
		if got := tc.a.Same(tc.b); got != tc.same {
			t.Errorf("%+v Same %+v: %v", tc.a, tc.b, got)
		}
	}
	if claimed.ClaimRead() || !bound.ClaimRead() || !refused.ClaimRead() {
		t.Error("ClaimRead")
	}
}
