//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// realAgentImage is hack/images.sh realagent's: Debian bookworm (glibc)
// with python3, venv, pip, node, npm, git, curl, sqlite3, openssl, make.
const realAgentImage = "docker.io/agentbox/realagent:bookworm"

// realAgentScript is what a coding agent does, each step labelled with its
// exit status and the last lines of its output. Run as uid 65532 with
// HOME=/workspace under both runtimes.
const realAgentScript = `
step() { name=$1; shift; out=$( ( "$@" ) 2>&1 ); rc=$?; echo "== $name: rc=$rc $(printf '%s' "$out" | tail -n 3 | tr '\n' ' ' | cut -c1-300)"; }
cd /workspace
step py-threads python3 -c 'import threading; ts=[threading.Thread(target=sum, args=([1],)) for _ in range(8)]; [t.start() for t in ts]; [t.join() for t in ts]; print("threads-ok")'
step py-multiprocessing python3 -c 'import multiprocessing as m; print("pool", sum(m.Pool(4).map(abs, range(100))))'
step py-subprocess python3 -c 'import subprocess; print(subprocess.run(["echo","sub-ok"], capture_output=True, text=True).stdout.strip())'
step py-asyncio-loopback python3 -c '
import asyncio
async def main():
    async def echo(r, w):
        w.write(await r.read(5)); await w.drain(); w.close()
    srv = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"hello"); await w.drain()
    print("asyncio", (await r.read(5)).decode())
asyncio.run(main())'
step py-sqlite python3 -c 'import sqlite3; c=sqlite3.connect("/workspace/db.sqlite"); c.execute("create table t(x)"); c.execute("insert into t values (42)"); print("sqlite", c.execute("select x from t").fetchone()[0])'
step node-worker node -e 'const {Worker}=require("worker_threads"); new Worker("require(\"worker_threads\").parentPort.postMessage(7)",{eval:true}).on("message",m=>console.log("worker",m))'
step node-child node -e 'console.log(require("child_process").execFileSync("echo",["child-ok"]).toString().trim())'
step git sh -c 'git init -q repo && cd repo && echo x > f && git add f && git -c user.email=a@example.test -c user.name=agent commit -qm first && git log --oneline | wc -l'
step openssl openssl sha256 -r /etc/os-release
step venv-pip sh -c 'python3 -m venv /workspace/v && /workspace/v/bin/pip --version'
step npm-bin sh -c 'mkdir -p tool app && cd tool && printf "%s" "{\"name\":\"tool\",\"version\":\"1.0.0\",\"bin\":{\"tool\":\"cli.js\"}}" > package.json && printf "#!/usr/bin/env node\nconsole.log(\"tool-ran\")\n" > cli.js && chmod +x cli.js && cd ../app && printf "%s" "{\"name\":\"app\",\"version\":\"1.0.0\",\"scripts\":{\"t\":\"tool\"},\"dependencies\":{\"tool\":\"file:../tool\"}}" > package.json && npm install --offline --no-audit --no-fund --loglevel=error >/dev/null && npm run -s t'
step make-run sh -c 'printf "build/hello:\n\tmkdir -p build && printf \"#!/bin/sh\\\\necho built-and-ran\\\\n\" > \$@ && chmod +x \$@\n" > Makefile && make -s && ./build/hello'
step loopback-server sh -c 'python3 -m http.server 8123 --bind 127.0.0.1 --directory /workspace >/dev/null 2>&1 & for i in 1 2 3 4 5 6 7 8 9 10; do curl -sf -o /dev/null http://127.0.0.1:8123/ && break; sleep 0.5; done; curl -s http://127.0.0.1:8123/ | grep -c db.sqlite; kill $!'
step exec-tmp sh -c 'cp /bin/true /tmp/t && /tmp/t'
echo probes-done
sleep 600
`

// realAgentWants: each step's output must hold this (and rc=0, except
// exec-tmp, which the runtimes answer differently).
var realAgentWants = map[string]string{
	"py-threads": "threads-ok", "py-multiprocessing": "pool 4950", "py-subprocess": "sub-ok",
	"py-asyncio-loopback": "asyncio hello", "py-sqlite": "sqlite 42", "node-worker": "worker 7",
	"node-child": "child-ok", "git": "rc=0 1", "openssl": "/etc/os-release", "venv-pip": "pip ",
	"npm-bin": "tool-ran", "make-run": "built-and-ran", "loopback-server": "rc=0 1",
}

// runRealAgent runs the script in a pod under handler and returns each
// step's line.
func runRealAgent(t *testing.T, handlerName, namespace string, annotations map[string]string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	p := &pod{dir: dir, logDir: filepath.Join(dir, "logs"), uid: uniqueID("uid")}
	p.podJSON = writeJSON(t, filepath.Join(dir, "pod.json"), map[string]any{
		"metadata":    map[string]any{"name": "realagent-" + handlerName, "namespace": namespace, "uid": p.uid, "attempt": 0},
		"annotations": annotations, "log_directory": p.logDir, "linux": map[string]any{},
	})
	r := dev.crictl(90*time.Second, "runp", "--runtime", handlerName, p.podJSON)
	if r.code != 0 {
		t.Fatalf("runp %s: %v", handlerName, r)
	}
	p.id = strings.TrimSpace(r.stdout)
	t.Cleanup(func() {
		dev.crictl(60*time.Second, "stopp", p.id)
		dev.crictl(60*time.Second, "rmp", "-f", p.id)
	})
	id := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", realAgentScript},
		"envs":    []map[string]string{{"key": "HOME", "value": "/workspace"}, {"key": "npm_config_cache", "value": "/workspace/.npm"}},
		"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	logs := waitLogsWithin(t, id, "probes-done", 4*time.Minute)
	if !strings.Contains(logs.stdout, "probes-done") {
		t.Fatalf("%s: the script did not finish:\n%s\n%s", handlerName, logs.stdout, logs.stderr)
	}
	return stepLines(logs.stdout)
}

func requireRealAgentImage(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cacheDir(), "images", "realagent.tar")); err != nil {
		t.Fatalf("the real-agent image is not built (hack/images.sh realagent, part of hack/setup.sh): %v", err)
	}
}

// TestRealAgentWorkloads: what a coding agent runs (Python threads,
// multiprocessing, asyncio on loopback, sqlite, Node workers and child
// processes, git, a venv's pip, an npm package's bin, what make built, a
// local server with a client) works under the coder role as under runc,
// from a glibc image through the CRI; and what coder keeps noexec (/tmp)
// is refused there with 126 while runc runs it.
func TestRealAgentWorkloads(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	got := map[string]map[string]string{
		"agentbox": runRealAgent(t, "agentbox", "agents", map[string]string{"agentbox.dev/role": "coder"}),
		"runc":     runRealAgent(t, "runc", "bench", nil),
	}
	for _, rt := range []string{"runc", "agentbox"} {
		for step, want := range realAgentWants {
			line := got[rt][step]
			if !strings.HasPrefix(line, "rc=0 ") || !strings.Contains(line, want) {
				t.Errorf("%s %s: %q, want rc=0 and %q", rt, step, line, want)
			}
		}
	}
	if line := got["runc"]["exec-tmp"]; !strings.HasPrefix(line, "rc=0") {
		t.Errorf("runc exec-tmp: %q", line)
	}
	if line := got["agentbox"]["exec-tmp"]; !strings.HasPrefix(line, "rc=126") {
		t.Errorf("agentbox exec-tmp: %q, want 126 (coder's /tmp is noexec)", line)
	}
	if t.Failed() {
		t.Logf("runc: %v\nagentbox: %v", fmt.Sprint(got["runc"]), fmt.Sprint(got["agentbox"]))
	}
}
