//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEgressGatewayInspected: inside gVisor, a client that trusts only what
// the sandbox gives it (SSL_CERT_FILE) reaches inspected rules through the
// gateway's own certificate; methods, paths and fronting are decided per
// request; a secret reaches its host's requests and nowhere else, and is
// nowhere in the sandbox. Each denial is beside its legitimate twin.
func TestEgressGatewayInspected(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	// The web host is the suite's: other tests' model calls carry their
	// injected keys to it. This test reads what came after its start.
	before := web.allAuth()
	p := newPodIn(t, "gwi", "e2e-gw-inspect", map[string]string{"agentbox.dev/role": "e2e-gw-inspect"})
	a, b, o := "https://"+gwAllowA, "https://"+gwAllowB, "https://"+gwOther
	script := strings.Join([]string{
		gwStep("token", `case "$AGENT_TOKEN" in agentbox-placeholder-*) echo placeholder;; *) echo "not a placeholder: $AGENT_TOKEN";; esac`),
		// A part of the secret: the whole would be in grep's argv, and so
		// in the trail this test checks.
		gwStep("secret-in-sandbox", "grep -rlsF "+secretValue[4:len(secretValue)-3]+" /proc/self/environ /proc/1/environ /proc/1/cmdline /etc /tmp; echo searched"),
		gwStep("trust", `echo "$SSL_CERT_FILE $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE"; grep -c 'BEGIN CERTIFICATE' /etc/agentbox/ca-bundle.pem; grep -l 'PRIVATE KEY' /etc/agentbox/*; echo checked`),
		gwStep("get-allowed", "abx-fetch "+a+"/ok/1"),
		gwStep("get-other-path", "abx-fetch "+a+"/admin"),
		gwStep("dotdot", "abx-fetch "+a+"/ok/%2e%2e/admin"),
		gwStep("post-refused", "abx-fetch -X POST "+a+"/ok/2"),
		gwStep("fronted", "abx-fetch -host "+gwAllowB+" "+a+"/ok/3"),
		gwStep("inject", `abx-fetch -H "Authorization: Bearer $AGENT_TOKEN" `+b+"/inject1"),
		gwStep("inject-unasked", "abx-fetch "+b+"/inject2"),
		gwStep("replay-other-host", `abx-fetch -H "Authorization: Bearer $AGENT_TOKEN" `+a+"/ok/replay"),
		gwStep("replay-plain-http", `abx-fetch -H "X-Token: $AGENT_TOKEN" http://`+gwAllowA+"/ok/replay-plain"),
		gwStep("passthrough", "abx-fetch "+o+"/pass"),
		"echo probes-done", "sleep 600",
	}, "; ")
	id := p.containerWith(t, "c", map[string]any{
		"image":   map[string]any{"image": probeImage},
		"command": []string{"sh", "-c", script},
		// The web host's CA, for the passthrough rule only: the client
		// verifies the real server there.
		"envs": []map[string]string{{"key": "AGENT_CA_PEM", "value": web.caPEM}},
	})
	logs := waitLogs(t, id, "probes-done")
	lines := stepLines(logs.stdout)
	expect := func(step, want string, refused bool) { t.Helper(); expectStep(t, lines, step, want, refused) }
	expect("token", "placeholder", false)
	expect("secret-in-sandbox", "searched", false)
	if strings.Contains(lines["secret-in-sandbox"], "/") {
		t.Errorf("the secret is in the sandbox: %q", lines["secret-in-sandbox"])
	}
	expect("trust", "/etc/agentbox/ca-bundle.pem /etc/agentbox/ca.pem /etc/agentbox/ca-bundle.pem 1 checked", false)
	expect("get-allowed", "status=200 body=site="+gwAllowA+" path=/ok/1", false)
	expect("get-other-path", "status=403", true)
	expect("dotdot", "status=403", true)
	expect("post-refused", "status=403", true)
	expect("fronted", "status=403", true)
	expect("inject", "status=200 body=site="+gwAllowB+" path=/inject1", false)
	expect("inject-unasked", "status=200 body=site="+gwAllowB+" path=/inject2", false)
	expect("replay-other-host", "status=403", true)
	expect("replay-plain-http", "status=403", true)
	expect("passthrough", "status=200 body=site="+gwOther+" path=/pass", false)
	if t.Failed() {
		t.Fatalf("pod output:\n%s\nstderr:\n%s", logs.stdout, logs.stderr)
	}
	// An exec'd process gets the same: the placeholder and the trust.
	if r := dev.crictl(30*time.Second, "exec", id, "sh", "-c", `echo "$AGENT_TOKEN $SSL_CERT_FILE"`); r.code != 0 ||
		!strings.HasPrefix(r.stdout, "agentbox-placeholder-") || !strings.Contains(r.stdout, "/etc/agentbox/ca-bundle.pem") {
		t.Errorf("exec: %s", r)
	}
	// What the web host received: the secret on b's requests only, the
	// agent's placeholder nowhere.
	want := "Authorization: Bearer " + secretValue
	for _, path := range []string{"/inject1", "/inject2"} {
		if got := web.authSeen(gwAllowB, path); len(got) != 1 || got[0] != want {
			t.Errorf("%s%s received %q, want [%q]", gwAllowB, path, got, want)
		}
	}
	for k, vs := range web.allAuth() {
		for _, v := range vs[len(before[k]):] {
			if strings.Contains(v, "agentbox-placeholder-") || (strings.Contains(v, secretValue) && !strings.HasPrefix(k, gwAllowB+" /inject")) {
				t.Errorf("the web host received %q at %s", v, k)
			}
		}
	}
	for _, path := range []string{"/admin", "/ok/2", "/ok/replay", "/ok/replay-plain", "/ok/3"} {
		if n := len(web.authSeen(gwAllowA, path)) + len(web.authSeen(gwAllowB, path)); n != 0 {
			t.Errorf("%s reached the web host", path)
		}
	}
	p.remove()

	// The trail: each request and refusal, what was injected (by header
	// name), and never the secret.
	want2 := map[string]bool{}
	recs := readTrail(t, p.id)
	for _, r := range recs {
		d := r.Detail
		switch r.Event {
		case "agentbox/egress_applied":
			if strings.Contains(d["inspected"], gwAllowA) && strings.Contains(d["inspected"], gwAllowB) && d["injected"] == "Authorization -> "+gwAllowB && strings.HasPrefix(d["gateway_ca"], "sha256:") {
				want2["applied"] = true
			}
		case "agentbox/egress_request":
			switch {
			case d["host"] == gwAllowA && d["path"] == "/ok/1" && d["protocol"] == "https" && d["http_status"] == "200":
				want2["get"] = true
			case d["host"] == gwAllowB && d["path"] == "/inject1" && d["injected"] == "Authorization" && d["protocol"] == "https":
				want2["inject"] = true
			}
		case "agentbox/egress_refused":
			switch {
			case strings.Contains(d["reason"], "path /admin is not allowed"):
				want2["path"] = true
			case strings.Contains(d["reason"], "method POST is not allowed"):
				want2["method"] = true
			case strings.Contains(d["reason"], "(fronting)"):
				want2["fronting"] = true
			case strings.Contains(d["reason"], "placeholder of the secret for "+gwAllowB+" was sent to "+gwAllowA+" in header Authorization"):
				want2["replay"] = true
			case strings.Contains(d["reason"], "in header X-Token") && d["protocol"] == "http":
				want2["replay-plain"] = true
			}
		case "agentbox/egress_connection":
			if d["sni"] == gwOther {
				want2["passthrough"] = true
			}
		}
	}
	for _, k := range []string{"applied", "get", "inject", "path", "method", "fronting", "replay", "replay-plain", "passthrough"} {
		if !want2[k] {
			t.Errorf("trail: no record for %s", k)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dev.dir, "audit", p.id+"*"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), secretValue) {
			t.Errorf("the secret is in the trail %s", f)
		}
	}
	if t.Failed() {
		for _, r := range recs {
			if strings.HasPrefix(r.Event, "agentbox/egress") {
				t.Logf("%s %s %s %v", r.Event, r.Status, r.Message, r.Detail)
			}
		}
	}
}
