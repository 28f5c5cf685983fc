//go:build e2e

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/nsthread"
)

// The gateway's edges (issue 35): names and addresses of the test.
const (
	gwLate = "late.gw.e2e.test"
	// lateAddr is late.gw.e2e.test's address: the web host's at first,
	// then the node's own (a VIP added while the sandbox runs).
	lateAddr = "198.51.100.77"
	gwNAT64  = "nat64.gw.e2e.test"
	// nat64Loopback is 127.0.0.1 in NAT64's well-known prefix.
	nat64Loopback = "64:ff9b::7f00:1"
	// echoSecret is injected toward b.gw.e2e.test by e2e-gw-edges: every
	// encoding spells it its own way.
	echoSecret = `e2e/refl+ct"ed<v>&=echo-secret-value`
)

// edgesAgentScript runs in the glibc image, with curl as agents use it:
// each attack beside its legitimate twin.
const edgesAgentScript = `
step() { name=$1; shift; out=$( ( "$@" ) 2>&1 ); rc=$?; echo "== $name: rc=$rc $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-1500)"; }
A=http://a.gw.e2e.test; B=https://b.gw.e2e.test
raw() { printf "$1" | timeout 20 bash -c 'exec 3<>/dev/tcp/a.gw.e2e.test/80; cat >&3; cat <&3' | head -c 400; }
# 1. An h2c upgrade (curl --http2 on http://) would tunnel to any site.
step h2c curl -sS --http2 $A/h2c
# On the inspected rule too, whatever the method and path it allows.
step h2c-tls curl -sS -X POST -H 'Connection: Upgrade, HTTP2-Settings' -H 'Upgrade: h2c' -H 'HTTP2-Settings: AAMAAABkAAQAAP__' https://a.gw.e2e.test/admin
step plain curl -sS $A/plain
# 3. The injected secret, echoed back in every way an origin does.
step token sh -c 'case "$AGENT_ECHO_TOKEN" in agentbox-placeholder-*) echo placeholder;; *) echo "not a placeholder";; esac'
step echo curl -sS $B/echo
step echo-gzip-asked curl -sS --compressed $B/echo
step echo-gzip curl -sS --compressed $B/echo-gzip
step echo-base64 curl -sS $B/echo-base64
step echo-json curl -sS $B/echo-json
step trace curl -sS -X TRACE $B/
# Issue 47's side doors: an interim response, stacked and doubled gzip,
# MIME's wrapped base64 (decoded here, as a mail client would); the
# honest 103 twin.
mime() { curl -sS $B/echo-mime | tail -n +3 | tr -d '\r\n' | base64 -d 2>/dev/null; }
step echo-hints curl -sS -i $B/echo-hints
step hints curl -sS -i $B/hints
step echo-stacked curl -sS $B/echo-stacked
step echo-gzip-twice curl -sS $B/echo-gzip-twice
step echo-mime mime
step b-normal curl -sS $B/normal
# The fragile points.
step host-port raw 'GET / HTTP/1.1\r\nHost: a.gw.e2e.test:other.gw.e2e.test\r\nConnection: close\r\n\r\n'
step double-slash raw 'GET //other.gw.e2e.test/x HTTP/1.1\r\nHost: a.gw.e2e.test\r\nConnection: close\r\n\r\n'
step placeholder-encoded sh -c 'curl -sS "http://a.gw.e2e.test/p?k=$(printf %s "$AGENT_ECHO_TOKEN" | sed "s/-/%2D/g")"'
step post curl -sS -d payload=1 $A/post
step trickle raw 'POST /trickle HTTP/1.1\r\nHost: a.gw.e2e.test\r\nContent-Length: 100000\r\nConnection: close\r\n\r\nx'
step nat64 curl -sS http://nat64.gw.e2e.test/n
# 2. The late name, while its address is still the web host's.
step late-before curl -sS http://late.gw.e2e.test/before
echo probes-done
sleep 600
`

// edgesProbeScript: WebSockets, from abx-fetch in the probe image.
const edgesProbeScript = `
` + `echo "== ws-allowed: $(abx-fetch -ws hello ws://a.gw.e2e.test/ws 2>&1 | tr '\n' ' ')"
echo "== ws-not-allowed: $(abx-fetch -ws hello ws://b.gw.e2e.test/ws 2>&1 | tr '\n' ' ')"
echo probes-done
sleep 600
`

// TestGatewayEdges: from inside the sandbox, each way past the gateway's
// name decision that was found, tried with the clients agents use, beside
// its legitimate twin:
//   - an h2c upgrade is refused before the origin (which honours h2c) sees
//     it; an allowed WebSocket works and is recorded opening and closing;
//   - an address that becomes the node's own while the sandbox runs is
//     not dialled for an allowed name that resolves to it;
//   - the injected secret, echoed by its host (raw, gzipped, base64,
//     JSON, TRACE), never reaches the sandbox, and each echo is recorded;
//   - a Host with a name for a port, a '//' target, a percent-encoded
//     placeholder, a trickled upload and a NAT64 spelling of loopback are
//     refused, with the reason in the trail.
func TestGatewayEdges(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	// late.gw.e2e.test is, at first, a second address of the web host.
	lateWeb := serveInWebNetns(t, lateAddr+":80", "late-web")
	webBefore := web.count(gwOther)
	p := newPodIn(t, "gwedges", "e2e-gw-edges", map[string]string{"agentbox.dev/role": "e2e-gw-edges"})
	agent := p.containerWith(t, "agent", map[string]any{
		"image":   map[string]any{"image": realAgentImage},
		"command": []string{"bash", "-c", edgesAgentScript},
		"envs":    []map[string]string{{"key": "HOME", "value": "/workspace"}},
		"linux":   map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
	})
	probe := p.containerWith(t, "probe", map[string]any{
		"image":   map[string]any{"image": probeImage},
		"command": []string{"sh", "-c", edgesProbeScript},
	})
	logs := waitLogsWithin(t, agent, "probes-done", 3*time.Minute)
	plogs := waitLogs(t, probe, "probes-done")
	lines := stepLines(logs.stdout)
	for k, v := range stepLines(plogs.stdout) {
		lines[k] = v
	}
	expect := func(step string, wants ...string) {
		t.Helper()
		for _, want := range wants {
			if !strings.Contains(lines[step], want) {
				t.Errorf("%s: %q, want %q", step, lines[step], want)
			}
		}
	}
	refused := "agentbox egress gateway: refused"
	expect("h2c", refused, "Upgrade h2c is not served")
	expect("h2c-tls", refused, "Upgrade h2c is not served")
	expect("plain", "rc=0", "site="+gwAllowA+" path=/plain")
	expect("ws-allowed", "ws: echo hello")
	expect("ws-not-allowed", "error:")
	expect("token", "placeholder")
	for _, step := range []string{"echo", "echo-gzip-asked", "echo-gzip", "echo-json"} {
		expect(step, "rc=0", "agentbox-placeholder-")
	}
	expect("echo-base64", "rc=0")
	expect("echo-hints", "rc=0", "103 Early Hints", "Link: </style.css?auth=Bearer agentbox-placeholder-", "after the hints")
	expect("hints", "rc=0", "103 Early Hints", "Link: </style.css>; rel=preload", "after the hints")
	for _, step := range []string{"echo-stacked", "echo-gzip-twice"} {
		expect(step, "rc=0", "Authorization: Bearer agentbox-placeholder-")
	}
	expect("echo-mime", "Authorization: Bearer ")
	expect("trace", refused, "TRACE is not served")
	expect("b-normal", "rc=0", "site="+gwAllowB+" path=/normal")
	expect("host-port", "403", `Host port "other.gw.e2e.test"`)
	expect("double-slash", "403", "starts with '//'")
	expect("placeholder-encoded", refused, "in the URL")
	expect("post", "rc=0", "path=/post")
	expect("trickle", "408", "arrived too slowly")
	expect("nat64", "every address withheld", "embeds 127.0.0.1 (NAT64")
	expect("late-before", "rc=0", "late-web")
	// The secret: nowhere in what the sandbox read, in any spelling; the
	// base64 echo decodes to no secret either.
	for _, form := range echoSpellings(echoSecret) {
		if strings.Contains(logs.stdout, form) {
			t.Errorf("the secret reached the sandbox (as %q)", form)
		}
	}
	if b64 := strings.TrimPrefix(lines["echo-base64"], "rc=0 "); b64 != "" {
		if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64)); err != nil || strings.Contains(string(dec), echoSecret) || !strings.Contains(string(dec), "Authorization: Bearer ") {
			t.Errorf("the base64 echo: %q (%v)", dec, err)
		}
	}
	if t.Failed() {
		t.Fatalf("agent output:\n%s\nprobe output:\n%s", logs.stdout, plogs.stdout)
	}
	if n := web.count(gwOther) - webBefore; n != 0 {
		t.Errorf("another site was reached %d times", n)
	}

	// 2. The address becomes the node's own (a VIP), with a service on it.
	lateWeb.Close()
	if err := ipCmd("-n", webNetns, "addr", "del", lateAddr+"/24", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := ipCmd("addr", "add", lateAddr+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ipCmd("addr", "del", lateAddr+"/32", "dev", "lo") })
	nodeService, err := serveHTTPReply(lateAddr+":80", "node-service")
	if err != nil {
		t.Fatal(err)
	}
	defer nodeService.ln.Close()
	after := dev.crictl(30*time.Second, "exec", agent, "curl", "-sS", "http://"+gwLate+"/after")
	if strings.Contains(after.stdout, "node-service") || !strings.Contains(after.stdout, "the node's own address") {
		t.Errorf("after the address became the node's: %s", after)
	}
	if n := nodeService.count(lateAddr); n != 0 {
		t.Errorf("the node's service was reached %d times", n)
	}
	p.remove()

	// The trail: each refusal with its reason, each echo replaced and
	// recorded, the WebSocket opened and closed, every forwarded request
	// with the address it went to.
	recs := readTrail(t, p.id)
	reflected := map[string]string{}
	var wsOpen, wsClosed, lateRefused bool
	for _, r := range recs {
		d := r.Detail
		switch r.Event {
		case "agentbox/secret_reflected":
			reflected[d["path"]] += d["encoding"] + ","
			if strings.Contains(r.Message, echoSecret) {
				t.Errorf("a record holds the secret: %s", r.Message)
			}
		case "agentbox/egress_request":
			if d["path"] == "/ws" && d["http_status"] == "101" {
				wsOpen = true
			}
			if d["dialled"] == "" {
				t.Errorf("a forwarded request's record has no address: %v", d)
			}
		case "agentbox/websocket_closed":
			wsClosed = d["path"] == "/ws" && d["bytes_sent"] != "" && d["bytes_received"] != "" && d["dialled"] == webAddr+":80"
		case "agentbox/egress_refused":
			// Withheld at the lookup or at the dial (an answer kept from
			// before), both asking the kernel then.
			if d["host"] == gwLate && strings.Contains(d["reason"], lateAddr) && strings.Contains(d["reason"], "the node's own address") {
				lateRefused = true
			}
		}
	}
	for path, enc := range map[string]string{"/echo": "raw", "/echo-gzip": "raw", "/echo-base64": "base64", "/echo-json": "json",
		"/echo-hints": "raw", "/echo-stacked": "raw", "/echo-gzip-twice": "raw", "/echo-mime": "base64"} {
		if !strings.Contains(reflected[path], enc) {
			t.Errorf("%s: reflections %q, want %s", path, reflected[path], enc)
		}
	}
	if !wsOpen || !wsClosed || !lateRefused {
		logGatewayRecords(t, recs)
		t.Errorf("trail: websocket opened %v, closed %v; late address refused %v", wsOpen, wsClosed, lateRefused)
	}
	// What the echoing host received: the secret itself.
	if got := web.authSeen(gwAllowB, "/normal"); len(got) != 1 || got[0] != "Authorization: Bearer "+echoSecret {
		t.Errorf("the host received %q", got)
	}
}

// echoSpellings are the ways an echo writes s (as the test web host's
// encoders and HTTP clients would), for finding it in output.
func echoSpellings(s string) []string {
	j, _ := json.Marshal(s)
	return []string{s, url.QueryEscape(s), url.PathEscape(s), string(j[1 : len(j)-1]),
		strings.NewReplacer(`"`, `\"`).Replace(s)}
}

// serveInWebNetns adds addr's address to the web host and serves reply on
// it from there; Close stops it (the address stays for the caller).
func serveInWebNetns(t *testing.T, addr, reply string) io.Closer {
	t.Helper()
	host, _, _ := net.SplitHostPort(addr)
	if err := ipCmd("-n", webNetns, "addr", "add", host+"/24", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	err := nsthread.Run(nsthread.Path("/var/run/netns/"+webNetns), func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, reply) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// browserScript: headless Chromium as a browsing agent runs it (no
// sandbox of its own: gVisor is the sandbox), trusting the sandbox's CA,
// and the web host's for the passthrough rule, through its NSS database.
const browserScript = `
# The page's text, or the error Chromium shows instead.
step() { name=$1; shift; out=$( ( "$@" ) 2>&1 ); rc=$?; echo "== $name: rc=$rc $(printf '%s' "$out" | grep -o 'site=[^<]*\|ERR_[A-Z_]*' | head -n 1)"; }
db=sql:$HOME/.pki/nssdb
mkdir -p $HOME/.pki/nssdb && certutil -d $db -N --empty-password
certutil -d $db -A -t C,, -n agentbox-sandbox -i /etc/agentbox/ca.pem
printf '%s' "$AGENT_CA_PEM" > /workspace/webca.pem && certutil -d $db -A -t C,, -n e2e-web -i /workspace/webca.pem
chrome() { dir=$1; shift; timeout 60 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir=/workspace/chr-$dir --dump-dom "$@"; }
P=$AGENT_ECH
step inspected-$P chrome inspected https://a.gw.e2e.test/page-inspected-$P
step plain-$P chrome plain http://a.gw.e2e.test/page-plain-$P
step passthrough-$P chrome pass https://other.gw.e2e.test/page-pass-$P
step not-allowed-$P chrome other https://b.gw.e2e.test/page-b-$P
echo probes-done
sleep 600
`

// TestGatewayBrowser: headless Chromium in the sandbox reaches the sites
// its role allows. Chromium sends a GREASE ECH extension on every
// ClientHello: an inspected rule's connection goes on (the gateway is the
// server and answers for the outer name), while a passthrough rule's is
// refused for ECH, recorded with the reason and the fix; with the policy
// that turns ECH off (mounted from the node where Chromium reads its
// managed policies) the passthrough rule works too. A site off the list
// stays closed either way.
func TestGatewayBrowser(t *testing.T) {
	requireEnv(t)
	requireRealAgentImage(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "gwbrowse", "e2e-gw-browse", map[string]string{"agentbox.dev/role": "e2e-gw-browse"})
	browser := func(name, ech string, mounts []map[string]any) string {
		return p.containerWith(t, name, map[string]any{
			"image":   map[string]any{"image": realAgentImage},
			"command": []string{"bash", "-c", browserScript},
			"envs": []map[string]string{{"key": "HOME", "value": "/workspace"}, {"key": "AGENT_CA_PEM", "value": web.caPEM},
				{"key": "AGENT_ECH", "value": ech}},
			"mounts": mounts,
			"linux":  map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 65532}}},
		})
	}
	grease := browser("browser", "grease", nil)
	off := browser("browser-ech-off", "off", []map[string]any{{"host_path": chromiumPolicyDir(), "container_path": "/etc/chromium/policies/managed", "readonly": true}})
	lines := map[string]string{}
	var out strings.Builder
	for _, id := range []string{grease, off} {
		logs := waitLogsWithin(t, id, "probes-done", 5*time.Minute)
		out.WriteString(logs.stdout)
		for k, v := range stepLines(logs.stdout) {
			lines[k] = v
		}
	}
	for _, ech := range []string{"grease", "off"} {
		for step, want := range map[string]string{
			"inspected": "site=" + gwAllowA + " path=/page-inspected-" + ech,
			"plain":     "site=" + gwAllowA + " path=/page-plain-" + ech,
		} {
			if got := lines[step+"-"+ech]; !strings.Contains(got, want) {
				t.Errorf("%s-%s: %q, want %q", step, ech, got, want)
			}
		}
		if got := lines["not-allowed-"+ech]; !strings.Contains(got, "ERR_") || strings.Contains(got, "site=") {
			t.Errorf("not-allowed-%s: %q", ech, got)
		}
	}
	if got := lines["passthrough-grease"]; !strings.Contains(got, "ERR_") || strings.Contains(got, "site=") {
		t.Errorf("passthrough with GREASE ECH: %q", got)
	}
	if got, want := lines["passthrough-off"], "site="+gwOther+" path=/page-pass-off"; !strings.Contains(got, want) {
		t.Errorf("passthrough with ECH off: %q, want %q", got, want)
	}
	p.remove()
	recs := readTrail(t, p.id)
	if t.Failed() {
		logGatewayRecords(t, recs)
		t.Fatalf("browser output:\n%s", out.String())
	}
	var echRefused, inspectedSeen bool
	for _, r := range recs {
		d := r.Detail
		switch r.Event {
		case "agentbox/egress_refused":
			if d["sni"] == gwOther && strings.Contains(d["reason"], "ECH") && strings.Contains(d["reason"], "EncryptedClientHelloEnabled=false") {
				echRefused = true
			}
		case "agentbox/egress_request":
			if d["host"] == gwAllowA && d["path"] == "/page-inspected-grease" && d["protocol"] == "https" && d["http_status"] == "200" {
				inspectedSeen = true
			}
		}
	}
	if !echRefused || !inspectedSeen {
		logGatewayRecords(t, recs)
		t.Errorf("trail: the passthrough ECH refusal %v, the inspected page's request %v", echRefused, inspectedSeen)
	}
}

// chromiumPolicyDir is the node directory the browsing test mounts where
// Chromium reads managed policies: ECH off.
func chromiumPolicyDir() string { return filepath.Join(dev.dir, "chromium-policy") }

// logGatewayRecords logs the gateway's records of a trail.
func logGatewayRecords(t *testing.T, recs []record) {
	t.Helper()
	for _, r := range recs {
		if strings.HasPrefix(r.Event, "agentbox/egress") || strings.HasPrefix(r.Event, "agentbox/websocket") || r.Event == "agentbox/secret_reflected" {
			t.Logf("%s %s %v", r.Event, r.Message, r.Detail)
		}
	}
}
