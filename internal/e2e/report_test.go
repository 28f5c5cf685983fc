//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAuditReportInBrowser: an agent forks, deletes a file, is refused a
// write outside its scope, and exits 3; `agentbox audit
// report -o html` of its trail, opened in a real headless Chromium (no
// network: the page is one file), shows the process tree with the argv
// and exit codes and the denials. The text and JSON forms name the same.
func TestAuditReportInBrowser(t *testing.T) {
	requireEnv(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (hack/setup.sh installs it)")
	}
	id := uniqueID("report")
	script := `echo x > /tmp/notes.txt; rm /tmp/notes.txt; echo y > /etc/agentbox-x 2>/dev/null; ` +
		`sh -c 'exit 5'; exit 3`
	r := dev.runAgent(t, id, []string{"--annotation", "agentbox.dev/role=baseline"}, "sh", "-c", script)
	if r.code != 3 {
		t.Fatalf("run: %v", r)
	}
	readTrail(t, id)
	dir := filepath.Join(dev.dir, "audit")
	txt := agentbox("audit", "report", "--sandbox", id, dir)
	if txt.code != 0 {
		t.Fatalf("report: %v", txt)
	}
	for _, want := range []string{"sh -c " + script + "  -> exit 3", "sh -c exit 5  -> exit 5", "deleted  /tmp/notes.txt", "REFUSALS AND DENIALS", "/etc/agentbox-x", "CHAIN  intact, ended"} {
		if !strings.Contains(txt.stdout, want) {
			t.Fatalf("text report lacks %q:\n%s", want, txt.stdout)
		}
	}
	if js := agentbox("audit", "report", "--sandbox", id, "-o", "json", dir); js.code != 0 || !strings.Contains(js.stdout, `"op": "deleted"`) {
		t.Fatalf("json report: %v", js)
	}
	if bad := agentbox("audit", "report", "--sandbox", id, "-o", "pdf", dir); bad.code == 0 || !strings.Contains(bad.stderr+bad.stdout, "--output") {
		t.Fatalf("an unknown format must be refused, naming the flag: %v", bad)
	}
	html := agentbox("audit", "report", "--sandbox", id, "-o", "html", dir)
	if html.code != 0 {
		t.Fatalf("html report: %v", html)
	}
	work := t.TempDir()
	page := filepath.Join(work, "report.html")
	os.WriteFile(page, []byte(html.stdout), 0o644)
	browser := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
			"--disable-component-update", "--disable-sync", "--user-data-dir=" + filepath.Join(work, "profile")}
		out, err := exec.CommandContext(ctx, chromium, append(base, args...)...).Output()
		if err != nil {
			t.Fatalf("chromium %v: %v", args, err)
		}
		return string(out)
	}
	dom := browser("--dump-dom", "file://"+page)
	tree := section(dom, `id="process-tree"`)
	refusals := section(dom, `id="refusals"`)
	for _, want := range []string{"exit 3", "exit 5", "sh -c exit 5"} {
		if !strings.Contains(tree, want) {
			t.Fatalf("the rendered process tree lacks %q:\n%s", want, tree)
		}
	}
	if !strings.Contains(refusals, "/etc/agentbox-x") {
		t.Fatalf("the rendered denials lack the refused write:\n%s", refusals)
	}
	shot := filepath.Join(work, "report.png")
	browser("--screenshot="+shot, "--window-size=1200,1600", "file://"+page)
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot: %v", err)
	}
	if out := os.Getenv("AGENTBOX_REPORT_SCREENSHOT"); out != "" {
		b, _ := os.ReadFile(shot)
		os.WriteFile(out, b, 0o644)
	}
}

// section is the DOM from the element with attr to the next h2.
func section(dom, attr string) string {
	i := strings.Index(dom, attr)
	if i < 0 {
		return ""
	}
	rest := dom[i:]
	if j := strings.Index(rest, "<h2"); j > 0 {
		rest = rest[:j]
	}
	return rest
}
