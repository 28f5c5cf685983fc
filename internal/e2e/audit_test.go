//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestAuditTrail: a container under a role performs known actions; exactly
// the expected records appear, with the right role, sandbox and results;
// tampering with the file is caught by `agentbox audit verify`.
func TestAuditTrail(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("audit")
	script := `cat /etc/passwd >/dev/null; echo notes > /tmp/notes.txt; cat /no/such/file 2>/dev/null; ` +
		`/tmp/notes.txt 2>/dev/null; exit 4`
	r := dev.runAgent(t, id, []string{"--annotation", "agentbox.dev/role=e2e-secret", "--env", "API_KEY=sk-should-not-appear"}, "sh", "-c", script)
	if r.code != 4 {
		t.Fatalf("run: %v", r)
	}
	recs := readTrail(t, id)
	find := func(pred func(record) bool) *record {
		for i := range recs {
			if pred(recs[i]) {
				return &recs[i]
			}
		}
		return nil
	}
	// Every record is joined with the sandbox, role and policy digest.
	for _, rec := range recs {
		if rec.Sandbox != id || rec.Role != "e2e-secret" || !strings.HasPrefix(rec.Digest, "sha256:") {
			t.Fatalf("record not joined with sandbox/role/digest: %+v", rec)
		}
	}
	if rec := find(func(r record) bool { return r.Event == "agentbox/role_resolved" }); rec == nil || rec.Seq != 1 {
		t.Fatal("the trail must start with the role decision")
	}
	start := find(func(r record) bool { return r.Event == "container/start" })
	if start == nil || strings.Join(start.Process.Argv, " ") != "sh -c "+script {
		t.Fatalf("container start: %+v", start)
	}
	for _, e := range start.Process.Env {
		if strings.Contains(e, "sk-should-not-appear") {
			t.Fatalf("secret value in the trail: %v", start.Process.Env)
		}
	}
	exec := find(func(r record) bool {
		return r.Event == "sentry/execve" && len(r.Process.Argv) > 0 && r.Process.Argv[0] == "cat" && len(r.Process.Argv) == 2 && r.Process.Argv[1] == "/etc/passwd"
	})
	if exec == nil || exec.ClassUID != 1007 || exec.Process.UID == nil || *exec.Process.UID != 65532 {
		t.Fatalf("exec of cat /etc/passwd: %+v", exec)
	}
	read := find(func(r record) bool { return r.File != nil && r.File.Path == "/etc/passwd" && r.Status == "Success" })
	if read == nil || read.ClassUID != 1001 || read.File.Flags != "O_RDONLY" {
		t.Fatalf("open of /etc/passwd: %+v", read)
	}
	write := find(func(r record) bool {
		return r.File != nil && r.File.Path == "/tmp/notes.txt" && strings.Contains(r.File.Flags, "O_CREAT")
	})
	if write == nil || write.Status != "Success" {
		t.Fatalf("write of /tmp/notes.txt: %+v", write)
	}
	missing := find(func(r record) bool { return r.File != nil && r.File.Path == "/no/such/file" })
	if missing == nil || missing.Status != "Failure" || missing.Errno != 2 {
		t.Fatalf("failed open (ENOENT): %+v", missing)
	}
	// gVisor reports no syscall/execve exit for an exec refused by noexec:
	// the attempt shows as the forked shell's exit with 126.
	noexec := find(func(r record) bool {
		return r.Event == "sentry/task_exit" && r.Process.ExitStatus != nil && *r.Process.ExitStatus == 126
	})
	if noexec == nil {
		t.Fatal("the refused exec's exit (126) is not in the trail")
	}
	exit := find(func(r record) bool { return r.Event == "agentbox/container_exit" })
	if exit == nil || !strings.Contains(exit.Message, "status 4") {
		t.Fatalf("container exit: %+v", exit)
	}
	end := recs[len(recs)-1]
	if end.Counts["lost"] != 0 || end.Counts["sentry_dropped"] != 0 || end.Counts["anomalies"] != 0 || end.Counts["written"] != len(recs) || end.Counts["received"] == 0 {
		t.Fatalf("end totals: %v (records %d)", end.Counts, len(recs))
	}

	// The trail verifies; tampering is caught with the first bad seq.
	trail := filepath.Join(dev.dir, "audit", id+".jsonl")
	if v := agentbox("audit", "verify", trail); v.code != 0 || !strings.Contains(v.stdout, "chain intact, ended") {
		t.Fatalf("verify: %v", v)
	}
	b, _ := os.ReadFile(trail)
	tampered := strings.Replace(string(b), `"path":"/no/such/file"`, `"path":"/no/such/fil3"`, 1)
	os.WriteFile(trail, []byte(tampered), 0o640)
	if v := agentbox("audit", "verify", trail); v.code == 0 || !strings.Contains(v.stdout, fmt.Sprintf("first bad seq %d", missing.Seq)) {
		t.Fatalf("modified record not caught at seq %d: %v", missing.Seq, v)
	}
	lines := strings.SplitAfter(string(b), "\n")
	os.WriteFile(trail, []byte(strings.Join(lines[:len(lines)-3], "")), 0o640) // drop the tail
	if v := agentbox("audit", "verify", trail); v.code == 0 || !strings.Contains(v.stdout, "truncated") {
		t.Fatalf("truncation not caught: %v", v)
	}
	// tail filters.
	os.WriteFile(trail, b, 0o640)
	if v := agentbox("audit", "tail", "--class", "file", "--role", "e2e-secret", "--sandbox", id, filepath.Join(dev.dir, "audit")); v.code != 0 || !strings.Contains(v.stdout, "path=/etc/passwd") || strings.Contains(v.stdout, "agentbox/role_resolved") {
		t.Fatalf("tail --class file: %v", v)
	}
}

// TestAuditNetworkAndPod: a CRI pod under an open role connects to a test
// server on the bridge and to a closed port; both connects are recorded with
// destination and result, joined with the pod's namespace and name.
func TestAuditNetworkAndPod(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	gw, port := egress.gateway, testServer(t, "hello\n")
	// A closed port next to it (bound and closed again: nothing listens).
	probe, _ := net.Listen("tcp4", "0.0.0.0:0")
	closed := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	p := newPodIn(t, "netaudit", "e2e-net", map[string]string{"agentbox.dev/role": "e2e-open"})
	id := p.container(t, "c", "sh", "-c", fmt.Sprintf("nc -w 3 %s %d </dev/null; nc -w 3 %s %d </dev/null; echo done; sleep 600", gw, port, gw, closed))
	waitLogs(t, id, "done")
	p.remove()
	recs := readTrail(t, p.id)
	var ok, refused bool
	for _, r := range recs {
		if r.PodNS != "e2e-net" || r.PodName != "netaudit" {
			t.Fatalf("record not joined with the pod: %+v", r)
		}
		if r.Event != "syscall/connect" || r.Dst == nil || r.Dst.IP != gw {
			continue
		}
		switch {
		case r.Dst.Port == port && r.Status == "Success", r.Dst.Port == port && r.Errno == 115: // EINPROGRESS
			ok = true
			if r.ClassUID != 4001 || r.Container != id {
				t.Fatalf("connect record: %+v", r)
			}
		case r.Dst.Port == closed && (r.Errno == 111 || r.Status == "Failure"):
			refused = true
		}
	}
	if !ok || !refused {
		t.Fatalf("connects not recorded (ok %v, refused %v)", ok, refused)
	}
	if v := agentbox("audit", "verify", filepath.Join(dev.dir, "audit", p.id+".jsonl")); v.code != 0 {
		t.Fatalf("pod trail does not verify: %v", v)
	}
}

// TestAuditRefusalRecorded: a refused container leaves a trail saying why.
func TestAuditRefusalRecorded(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	id := uniqueID("refused")
	if r := dev.runAgent(t, id, []string{"--annotation", "agentbox.dev/role=coder"}, "true"); r.code == 0 {
		t.Fatalf("coder must be refused here: %v", r)
	}
	recs := readTrail(t, id)
	if len(recs) != 2 || recs[0].Event != "agentbox/refused" || !strings.Contains(recs[0].Message, `role "coder" is not bound`) {
		t.Fatalf("refusal trail: %+v", recs)
	}
}

// webhookDown reserves a loopback port and leaves it closed (the endpoint
// is down), and writes a shim config in dir whose webhook sink (format
// "" or "otlp") posts to that port's path, auditing to dir/audit and
// spooling to dir/spool.
func webhookDown(t *testing.T, dir, path, format string) (addr, cfg string) {
	t.Helper()
	probe, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = probe.Addr().String()
	probe.Close()
	if format != "" {
		format = fmt.Sprintf("format = %q\n", format)
	}
	cfg = filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`version = 1
[runsc]
binary = %q
[policy]
dir = %q
handler = "agentbox"
[audit]
dir = %q
[audit.webhook]
url = "http://%s%s"
%sspool_dir = %q
`, filepath.Join(cacheDir(), "bin", "runsc"), filepath.Join(dev.dir, "agentbox", "policies"), filepath.Join(dir, "audit"), addr, path, format, filepath.Join(dir, "spool"))), 0o644)
	return addr, cfg
}

// TestAuditWebhookOutage: with a webhook configured, the shim ships every
// record. The endpoint is down while a first container runs (its shim
// exits with the records still spooled), then comes back; the next shim
// delivers the spool left behind along with its own records. Every record
// of both trails arrives, in order.
func TestAuditWebhookOutage(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	dir := t.TempDir()
	addr, cfg := webhookDown(t, dir, "/ingest", "")

	first := uniqueID("hook1")
	if r := dev.runAgent(t, first, []string{"--runtime-config-path", cfg}, "cat", "/etc/passwd"); r.code != 0 {
		t.Fatalf("first: %v", r)
	}
	spools, _ := filepath.Glob(filepath.Join(dir, "spool", "*.spool"))
	if len(spools) != 1 {
		t.Fatalf("the first trail must be spooled while the endpoint is down: %v", spools)
	}

	// The endpoint comes back.
	var mu sync.Mutex
	got := map[string][]string{}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		for _, l := range strings.Split(strings.TrimSpace(string(body)), "\n") {
			if rec, err := decodeRecord([]byte(l)); err == nil {
				got[rec.Sandbox] = append(got[rec.Sandbox], l)
			}
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()

	second := uniqueID("hook2")
	if r := dev.runAgent(t, second, []string{"--runtime-config-path", cfg, "--annotation", "agentbox.dev/wall-clock=1m"}, "sh", "-c", "sleep 2; cat /etc/group"); r.code != 0 {
		t.Fatalf("second: %v", r)
	}
	for _, id := range []string{first, second} {
		file, err := os.ReadFile(filepath.Join(dir, "audit", id+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Split(strings.TrimSpace(string(file)), "\n")
		var have []string
		eventually(t, 30*time.Second, func() bool {
			mu.Lock()
			have = append([]string(nil), got[id]...)
			mu.Unlock()
			return len(have) >= len(want)
		})
		if strings.Join(have, "\n") != strings.Join(want, "\n") {
			t.Fatalf("%s: the endpoint got %d of %d records (or out of order)", id, len(have), len(want))
		}
	}
	checkOCSF(t, filepath.Join(dir, "audit"))
}

// TestAuditFailClosed: when the audit trail cannot be written or the
// receiver cannot listen, the container does not start.
func TestAuditFailClosed(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	os.WriteFile(notADir, nil, 0o644)
	for _, tc := range []struct{ name, audit, want string }{
		{"trail", fmt.Sprintf("dir = %q", filepath.Join(notADir, "audit")), "audit dir"},
		{"receiver", fmt.Sprintf("dir = %q\nsocket_dir = %q", filepath.Join(dir, "audit"), filepath.Join(notADir, "sock")), "audit socket dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(dir, tc.name+".toml")
			os.WriteFile(cfg, []byte(fmt.Sprintf("version = 1\n[runsc]\nbinary = %q\n[policy]\ndir = %q\n[audit]\n%s\n",
				filepath.Join(cacheDir(), "bin", "runsc"), filepath.Join(dev.dir, "agentbox", "policies"), tc.audit)), 0o644)
			id := uniqueID("failclosed")
			defer dev.removeContainer(id)
			r := dev.runAgent(t, id, []string{"--runtime-config-path", cfg}, "echo", "should-not-run")
			if r.code == 0 || strings.Contains(r.stdout, "should-not-run") || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("want the container refused (%q): %v", tc.want, r)
			}
		})
	}
}

// TestAuditFileMutations: what an agent destroys is in its trail. A
// busybox shell creates a tree, renames a config over another, links,
// chmods, truncates and deletes it all; each change is a File System
// Activity record with its resolved path(s) and result, and a refused one
// (rmdir of a full directory) is there with its errno.
func TestAuditFileMutations(t *testing.T) {
	requireEnv(t)
	id := uniqueID("mutate")
	script := `cd /tmp && mkdir repo && echo a > repo/config && echo b > repo/config.new && ` +
		`mv repo/config.new repo/config && ln -s /etc/passwd repo/pw && ln repo/config repo/hard && ` +
		`chmod 600 repo/config && : > repo/config && rmdir repo 2>/dev/null; rm -rf /tmp/repo; ls /tmp/repo 2>/dev/null; exit 0`
	r := dev.runAgent(t, id, []string{"--annotation", "agentbox.dev/role=baseline"}, "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("run: %v", r)
	}
	recs := readTrail(t, id)
	has := func(activity, path, target, status string) *record {
		for i, rec := range recs {
			if rec.ClassUID == 1001 && rec.Activity == activity && rec.File != nil && rec.File.Path == path && rec.Status == status &&
				(target == "" || rec.Target != nil && rec.Target.Path == target) {
				return &recs[i]
			}
		}
		return nil
	}
	for _, want := range []struct{ activity, path, target, status string }{
		{"Create", "/tmp/repo", "", "Success"},                            // mkdir
		{"Rename", "/tmp/repo/config.new", "/tmp/repo/config", "Success"}, // mv over another
		{"Create", "/tmp/repo/pw", "/etc/passwd", "Success"},              // symlink: the link, its target
		{"Create", "/tmp/repo/config", "/tmp/repo/hard", "Success"},       // hard link
		{"Set Security", "/tmp/repo/config", "", "Success"},               // chmod
		{"Delete", "/tmp/repo", "", "Failure"},                            // rmdir of a full directory
		{"Delete", "/tmp/repo/config", "", "Success"},                     // rm -rf: each file
		{"Delete", "/tmp/repo/pw", "", "Success"},
		{"Delete", "/tmp/repo", "", "Success"}, // and the directory
	} {
		if has(want.activity, want.path, want.target, want.status) == nil {
			var files []string
			for _, rec := range recs {
				if rec.ClassUID == 1001 && rec.Activity != "Open" {
					files = append(files, fmt.Sprintf("%s %s %+v %+v %s", rec.Event, rec.Activity, rec.File, rec.Target, rec.Status))
				}
			}
			t.Fatalf("no %s of %s (-> %q) with %s in the trail; file changes recorded:\n%s", want.activity, want.path, want.target, want.status, strings.Join(files, "\n"))
		}
	}
	if rec := has("Set Security", "/tmp/repo/config", "", "Success"); rec.File.Mode != 0o600 {
		t.Fatalf("chmod mode: %o", rec.File.Mode)
	}
	if rec := has("Delete", "/tmp/repo", "", "Failure"); rec.Errno != 39 { // ENOTEMPTY
		t.Fatalf("rmdir of a full directory: errno %d", rec.Errno)
	}
	if v := agentbox("audit", "verify", filepath.Join(dev.dir, "audit", id+".jsonl")); v.code != 0 {
		t.Fatalf("verify: %v", v)
	}
}

// TestAuditSendBuffer: gVisor's end of the audit socket has the send buffer
// the config asks for (agentbox's runsc patch sets it), so a burst of
// events waits in the socket rather than in gVisor's retry backoff; with
// `sentry_send_buffer = 0` it keeps the kernel's default. Both trails get
// their events.
func TestAuditSendBuffer(t *testing.T) {
	requireEnv(t)
	wmemDefault := readSysctlInt(t, "/proc/sys/net/core/wmem_default")
	for _, c := range []struct {
		name    string
		setting string
		want    func(int) bool
		wantDoc string
	}{
		// The kernel doubles what SO_SNDBUF(FORCE) asks for (its bookkeeping).
		{"default", "", func(n int) bool { return n == 2*(4<<20) }, "8 MiB (4 MiB doubled by the kernel)"},
		{"kernel default", "\nsentry_send_buffer = 0", func(n int) bool { return n == wmemDefault }, fmt.Sprintf("%d (net.core.wmem_default)", wmemDefault)},
	} {
		t.Run(c.name, func(t *testing.T) {
			audit := "[audit]\ndir = \"" + filepath.Join(dev.dir, "audit") + "\""
			args := []string{"run", "-d", "--runtime", runtimeType, "--annotation", "agentbox.dev/role=baseline"}
			if c.setting != "" {
				args = append(args, "--runtime-config-path", configVariant(t, audit, audit+c.setting))
			}
			id := uniqueID("sndbuf")
			r := dev.ctr(60*time.Second, append(args, agentImage, id, "sh", "-c", "cat /etc/hostname >/dev/null; sleep 600")...)
			if r.code != 0 {
				t.Fatalf("run: %v", r)
			}
			defer dev.removeContainer(id)
			got := sinkSendBuffer(t, id)
			t.Logf("gVisor's end of the audit socket: SO_SNDBUF %d", got)
			if !c.want(got) {
				t.Fatalf("SO_SNDBUF of gVisor's audit socket is %d, want %s", got, c.wantDoc)
			}
			// The shell may not have run cat yet: its open is waited for
			// (removing the container first would lose it, and fail
			// nothing of what this test is about).
			found := eventually(t, 30*time.Second, func() bool {
				for _, rec := range trailSoFar(t, id) {
					if rec.File != nil && rec.File.Path == "/etc/hostname" {
						return true
					}
				}
				return false
			})
			if !found {
				t.Fatal("the open of /etc/hostname is not in the trail")
			}
			dev.removeContainer(id)
			readTrail(t, id)
		})
	}
}

func readSysctlInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// sinkSendBuffer finds the sandbox process of container id and, among its
// descriptors, the SOCK_SEQPACKET socket connected to an agentbox audit
// socket; it returns that socket's SO_SNDBUF, read from a duplicate taken
// with pidfd_getfd(2).
func sinkSendBuffer(t *testing.T, id string) int {
	t.Helper()
	var pid int
	eventually(t, 20*time.Second, func() bool {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, _ := os.ReadFile(p)
			if strings.HasPrefix(string(b), "runsc-sandbox\x00") && strings.Contains(string(b), "/"+id+"/") {
				pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
			}
		}
		return pid != 0
	})
	if pid == 0 {
		t.Fatalf("no runsc-sandbox process for %s", id)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(pidfd)
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range fds {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		n, err := strconv.Atoi(e.Name())
		if err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			continue
		}
		typ, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
		peer, _ := unix.Getpeername(fd)
		buf, berr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
		unix.Close(fd)
		if ua, ok := peer.(*unix.SockaddrUnix); ok && typ == unix.SOCK_SEQPACKET && strings.HasPrefix(ua.Name, "/run/agentbox/audit/") {
			if berr != nil {
				t.Fatalf("SO_SNDBUF: %v", berr)
			}
			return buf
		}
	}
	t.Fatalf("runsc-sandbox %d has no socket connected to an audit socket", pid)
	return 0
}
