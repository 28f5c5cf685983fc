//go:build e2e

package e2e

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// packageFiles makes what the web host serves under base (an allowed
// name): a PyPI simple index with one wheel (/pypi/), an npm registry with
// one package (/npm/), and a git repository over git's dumb HTTP protocol
// (/git/repo.git/), built with the node's git. No registry is reached.
func packageFiles(base string) (map[string][]byte, error) {
	files := map[string][]byte{}
	// A wheel: abxdemo 1.0, pure Python.
	var whl bytes.Buffer
	zw := zip.NewWriter(&whl)
	var record strings.Builder
	for _, f := range []struct{ name, body string }{
		{"abxdemo/__init__.py", "VALUE = 'abxdemo-ok'\n"},
		{"abxdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: abxdemo\nVersion: 1.0\n"},
		{"abxdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: agentbox-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	} {
		fw, err := zw.Create(f.name)
		if err != nil {
			return nil, err
		}
		fw.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("abxdemo-1.0.dist-info/RECORD,,\n")
	fw, err := zw.Create("abxdemo-1.0.dist-info/RECORD")
	if err != nil {
		return nil, err
	}
	fw.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		return nil, err
	}
	whlSum := sha256.Sum256(whl.Bytes())
	files["/pypi/files/abxdemo-1.0-py3-none-any.whl"] = whl.Bytes()
	files["/pypi/simple/abxdemo/"] = []byte(fmt.Sprintf("<!DOCTYPE html><html><body><a href=\"%s/pypi/files/abxdemo-1.0-py3-none-any.whl#sha256=%s\">abxdemo-1.0-py3-none-any.whl</a></body></html>\n", base, hex.EncodeToString(whlSum[:])))

	// An npm package: abxdemo 1.0.0.
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, body string }{
		{"package/package.json", `{"name":"abxdemo","version":"1.0.0","main":"index.js"}`},
		{"package/index.js", "module.exports = 'abxdemo-ok';\n"},
	} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(1700000000, 0)})
		tw.Write([]byte(f.body))
	}
	tw.Close()
	gz.Close()
	sha1sum := sha1.Sum(tgz.Bytes())
	sha512sum := sha512.Sum512(tgz.Bytes())
	meta, _ := json.Marshal(map[string]any{
		"name": "abxdemo", "dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{"name": "abxdemo", "version": "1.0.0", "dist": map[string]string{
			"tarball":   base + "/npm/abxdemo/-/abxdemo-1.0.0.tgz",
			"shasum":    hex.EncodeToString(sha1sum[:]),
			"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
		}}},
	})
	files["/npm/abxdemo"] = meta
	files["/npm/abxdemo/-/abxdemo-1.0.0.tgz"] = tgz.Bytes()

	// A git repository, served as plain files (git's dumb HTTP protocol).
	dir, err := os.MkdirTemp("", "abx-e2e-git-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	work, bare := filepath.Join(dir, "work"), filepath.Join(dir, "repo.git")
	git := func(args ...string) error {
		cmd := exec.Command("git", append([]string{"-c", "user.name=e2e", "-c", "user.email=e2e@example.test", "-c", "init.defaultBranch=main"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %v: %v: %s", args, err, out)
		}
		return nil
	}
	if err := git("init", "-q", work); err != nil {
		return nil, err
	}
	os.WriteFile(filepath.Join(work, "README"), []byte("cloned-through-the-gateway\n"), 0o644)
	for _, args := range [][]string{{"-C", work, "add", "README"}, {"-C", work, "commit", "-qm", "first"},
		{"clone", "-q", "--bare", work, bare}, {"-C", bare, "update-server-info"}} {
		if err := git(args...); err != nil {
			return nil, err
		}
	}
	err = filepath.Walk(bare, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(bare, p)
		files["/git/repo.git/"+filepath.ToSlash(rel)] = b
		return nil
	})
	return files, err
}

// realClientScript: each client the way an agent uses it.
const realClientScript = `
step() { name=$1; shift; out=$( ( "$@" ) 2>&1 ); rc=$?; echo "== $name: rc=$rc $(printf '%s' "$out" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"; }
cd /workspace
A=https://a.gw.e2e.test
step curl curl -sS $A/curl
step curl-passthrough sh -c 'printf "%s" "$AGENT_CA_PEM" > /workspace/webca.pem && curl -sS --cacert /workspace/webca.pem https://other.gw.e2e.test/curl-pass'
step curl-passthrough-untrusted curl -sS https://other.gw.e2e.test/curl-untrusted
step python-urllib python3 -c "import urllib.request; print(urllib.request.urlopen('$A/urllib').read().decode())"
step node-https node -e "require('https').get('$A/node-https', r => { let d = ''; r.on('data', c => d += c); r.on('end', () => console.log(d)); }).on('error', e => { console.log(String(e)); process.exit(1); })"
step node-fetch node --no-warnings -e "fetch('$A/node-fetch').then(r => r.text()).then(t => console.log(t), e => { console.log(String(e.cause || e)); process.exit(1); })"
step git-clone sh -c "git clone -q $A/git/repo.git repo && cat repo/README"
step pip sh -c "python3 -m venv /workspace/v && /workspace/v/bin/pip install -q --disable-pip-version-check --index-url $A/pypi/simple abxdemo && /workspace/v/bin/python -c 'import abxdemo; print(abxdemo.VALUE)'"
step npm sh -c "mkdir -p app && cd app && npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error --registry $A/npm/ abxdemo >/dev/null && node -e 'console.log(require(\"abxdemo\"))'"
echo probes-done
sleep 600
`

// TestEgressGatewayRealClients: from the glibc image, curl, Python's
// urllib, Node's https and fetch, git over https, pip and npm reach an
// inspected rule through the gateway, each trusting the sandbox's CA
// through the variables and bundle agentbox gives every container (no -k,
// no option of the test's); curl verifies a passthrough rule's server
// itself, and without the web host's CA it is refused by its own check.
func TestEgressGatewayRealClients(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "gwreal", "e2e-gw-real", map[string]string{"agentbox.dev/role": "e2e-gw-real"})
	id := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", realClientScript},
		"envs": []map[string]string{{"key": "HOME", "value": "/workspace"}, {"key": "npm_config_cache", "value": "/workspace/.npm"},
			{"key": "AGENT_CA_PEM", "value": web.caPEM}},
		"linux": map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	logs := waitLogsWithin(t, id, "probes-done", 4*time.Minute)
	lines := stepLines(logs.stdout)
	for step, want := range map[string]string{
		"curl": "site=" + gwAllowA + " path=/curl", "curl-passthrough": "site=" + gwOther + " path=/curl-pass",
		"python-urllib": "path=/urllib", "node-https": "path=/node-https", "node-fetch": "path=/node-fetch",
		"git-clone": "cloned-through-the-gateway", "pip": "abxdemo-ok", "npm": "abxdemo-ok",
	} {
		if got := lines[step]; !strings.HasPrefix(got, "rc=0 ") || !strings.Contains(got, want) {
			t.Errorf("%s: %q, want rc=0 and %q", step, got, want)
		}
	}
	if got := lines["curl-passthrough-untrusted"]; strings.HasPrefix(got, "rc=0") || strings.Contains(got, "site=") {
		t.Errorf("passthrough without the web host's CA: %q (the client verifies the real server there)", got)
	}
	if t.Failed() {
		t.Fatalf("pod output:\n%s\n%s", logs.stdout, logs.stderr)
	}
	p.remove()
	seen := map[string]bool{}
	for _, r := range readTrail(t, p.id) {
		if r.Event == "agentbox/egress_request" && r.Detail["protocol"] == "https" {
			seen[r.Detail["path"]] = true
		}
	}
	for _, path := range []string{"/curl", "/urllib", "/node-https", "/node-fetch", "/git/repo.git/info/refs?service=...", "/pypi/simple/abxdemo/", "/npm/abxdemo"} {
		if !seen[path] {
			t.Errorf("trail: no request for %s (saw %v)", path, seen)
		}
	}
}
