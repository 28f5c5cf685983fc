//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A hostile agent cannot blind, forge or flood: the resolver, private
// answers, the audit trail's readers and storage.

// shimRSS is the resident set of the shim serving a sandbox, in KiB.
func shimRSS(t *testing.T, sandboxID string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if !strings.Contains(cmd, "containerd-shim-agentbox-v1") || !strings.Contains(cmd, "-id "+sandboxID) {
			continue
		}
		st, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
	}
	t.Fatalf("no shim process for sandbox %s", sandboxID)
	return 0
}

// TestHostileResolverFlood: an agent that opens hundreds of TCP connections
// to its pod's resolver, each announcing a 64 KiB frame, does not grow the
// shim (memory outside the pod's cgroup), and the resolver keeps answering.
func TestHostileResolverFlood(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	p := newPodIn(t, "flood", "e2e-dns", map[string]string{"agentbox.dev/role": "e2e-dns"})
	before := shimRSS(t, p.id)
	id := p.containerWith(t, "flooder", map[string]any{
		"image": map[string]any{"image": probeImage},
		"command": []string{"sh", "-c", "abx-probe dnsflood 800 20 & sleep 4; nslookup " + dnsAllowed + " >/dev/null 2>&1; echo lookup-during-flood rc=$?; " +
			"echo flooding; wait; echo flood-over; sleep 600"},
	})
	logs := waitLogs(t, id, "flooding")
	during := shimRSS(t, p.id)
	out := logs.stdout
	t.Logf("shim RSS: %d KiB before, %d KiB during the flood (%s)", before, during, strings.TrimSpace(strings.Split(out, "\n")[0]))
	if !strings.Contains(out, "dnsflood opened") || !strings.Contains(out, "lookup-during-flood rc=0") {
		t.Fatalf("flood or lookup: %v", logs)
	}
	if during-before > 32<<10 {
		t.Errorf("the shim grew by %d KiB under the flood", during-before)
	}
	dev.crictl(60*time.Second, "stopp", p.id)
	dev.crictl(60*time.Second, "rmp", p.id)
	p.released = true
	for _, r := range readTrail(t, p.id) {
		if r.Event == "agentbox/resolver_stopped" {
			if n, _ := strconv.Atoi(r.Detail["tcp_connections_rejected"]); n < 100 {
				t.Errorf("the resolver rejected %d connections, want most of 800: %v", n, r.Detail)
			}
			return
		}
	}
	t.Error("no resolver_stopped record")
}
