//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

// TestAuditOTLPCollector: with format = "otlp", the shim ships every
// record to a real OpenTelemetry Collector (abx-otelcol: the collector's
// service and its OTLP/HTTP receiver, built by hack/setup.sh from the
// collector modules v0.165.0). The collector is down while a first
// container runs (its records stay spooled), then comes up; the next shim
// delivers the spool left behind with its own. Every record of both
// trails arrives, intact (the body is the line: it still verifies) and in
// order, with its time, severity and attributes copied out.
func TestAuditOTLPCollector(t *testing.T) {
	requireEnv(t)
	expectNoLeaks(t, dev)
	col := filepath.Join(cacheDir(), "bin", "abx-otelcol")
	if _, err := os.Stat(col); err != nil {
		t.Fatalf("%s: %v (hack/setup.sh builds it)", col, err)
	}
	dir := t.TempDir()
	addr, cfg := webhookDown(t, dir, "/v1/logs", "otlp")

	first := uniqueID("otlp1")
	if r := dev.runAgent(t, first, []string{"--runtime-config-path", cfg}, "cat", "/etc/passwd"); r.code != 0 {
		t.Fatalf("first: %v", r)
	}
	if spools, _ := filepath.Glob(filepath.Join(dir, "spool", "*.spool")); len(spools) != 1 {
		t.Fatalf("the first trail must be spooled while the collector is down: %v", spools)
	}

	// The collector comes up.
	out := filepath.Join(dir, "received.jsonl")
	colCfg := filepath.Join(dir, "otelcol.yaml")
	os.WriteFile(colCfg, []byte(fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
exporters:
  abxfile:
    path: %s
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    logs:
      receivers: [otlp]
      exporters: [abxfile]
`, addr, out)), 0o644)
	cmd := exec.Command(col, "--config", "file:"+colCfg)
	logf, _ := os.Create(filepath.Join(dir, "otelcol.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
	}()

	second := uniqueID("otlp2")
	if r := dev.runAgent(t, second, []string{"--runtime-config-path", cfg}, "sh", "-c", "sleep 1; cat /etc/group"); r.code != 0 {
		t.Fatalf("second: %v", r)
	}
	for _, id := range []string{first, second} {
		file, err := os.ReadFile(filepath.Join(dir, "audit", id+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Split(strings.TrimSpace(string(file)), "\n")
		var have []otlpLog
		eventually(t, 60*time.Second, func() bool {
			have = collected(t, out)[id]
			return len(have) >= len(want)
		})
		if len(have) != len(want) {
			b, _ := os.ReadFile(filepath.Join(dir, "otelcol.log"))
			t.Fatalf("%s: the collector has %d of %d records\n%s", id, len(have), len(want), clip(string(b)))
		}
		var v audit.Verifier
		for i := range want {
			if have[i].Body != want[i] {
				t.Fatalf("%s: record %d differs or is out of order:\n got %s\nwant %s", id, i+1, have[i].Body, want[i])
			}
			if have[i].Seq != fmt.Sprint(i+1) || have[i].Severity == 0 || have[i].Time == "" || have[i].Event == "" {
				t.Fatalf("%s: record %d's log fields: %+v", id, i+1, have[i])
			}
			v.Line("collector", []byte(have[i].Body))
		}
		if res := v.Finish(false); res.Problem != nil || !res.Ended {
			t.Fatalf("%s: the collector's copy does not verify: %v", id, res.Problem)
		}
	}
	checkOCSF(t, filepath.Join(dir, "audit"))
	// Nothing is left undelivered. Delivery is at least once: a shim that
	// exits between a batch's delivery and its offset's write leaves that
	// batch in its spool, and the next shim sends it again (metadata.uid
	// tells the copies apart). So what a spool holds past its offset must
	// already be at the collector.
	have := map[string]bool{}
	for _, logs := range collected(t, out) {
		for _, l := range logs {
			have[l.Body] = true
		}
	}
	spools, _ := filepath.Glob(filepath.Join(dir, "spool", "*.spool"))
	for _, sp := range spools {
		b, err := os.ReadFile(sp)
		if err != nil {
			continue
		}
		offb, _ := os.ReadFile(strings.TrimSuffix(sp, ".spool") + ".offset")
		var off int
		fmt.Sscan(strings.TrimSpace(string(offb)), &off)
		if off > len(b) {
			t.Fatalf("%s: offset %d past its %d bytes", sp, off, len(b))
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b[off:])), "\n") {
			if l != "" && !have[l] {
				t.Fatalf("%s: a record past the offset never reached the collector: %s", sp, l)
			}
		}
	}
}

type otlpLog struct {
	Body, Seq, Event, Time string
	Severity               int
}

// collected reads what abx-otelcol wrote (one plog JSON export per line),
// by sandbox, in the order received.
func collected(t *testing.T, path string) map[string][]otlpLog {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	type attr struct {
		Key   string `json:"key"`
		Value struct {
			String string `json:"stringValue"`
			Int    string `json:"intValue"`
		} `json:"value"`
	}
	out := map[string][]otlpLog{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var req struct {
			ResourceLogs []struct {
				ScopeLogs []struct {
					LogRecords []struct {
						Time     string `json:"timeUnixNano"`
						Severity int    `json:"severityNumber"`
						Body     struct {
							String string `json:"stringValue"`
						} `json:"body"`
						Attributes []attr `json:"attributes"`
					} `json:"logRecords"`
				} `json:"scopeLogs"`
			} `json:"resourceLogs"`
		}
		if err := json.Unmarshal([]byte(l), &req); err != nil {
			t.Fatalf("collector output: %v", err)
		}
		for _, rl := range req.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, lr := range sl.LogRecords {
					lg := otlpLog{Body: lr.Body.String, Time: lr.Time, Severity: lr.Severity}
					var sb string
					for _, a := range lr.Attributes {
						switch a.Key {
						case "agentbox.seq":
							lg.Seq = a.Value.Int
						case "event.name":
							lg.Event = a.Value.String
						case "agentbox.sandbox_id":
							sb = a.Value.String
						}
					}
					out[sb] = append(out[sb], lg)
				}
			}
		}
	}
	return out
}
