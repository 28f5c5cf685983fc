//go:build e2e

package e2e

// Reading a sandbox's trail in the e2e suite: its records, decoded as
// the OCSF the shim writes them, and the agentbox CLI.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

type record struct {
	Time      string `json:"time"`
	Event     string `json:"event"`
	ClassUID  int    `json:"class_uid"`
	Status    string `json:"status"`
	Errno     int    `json:"errno"`
	Seq       int    `json:"seq"`
	Container string `json:"container_id"`
	Sandbox   string `json:"sandbox_id"`
	PodNS     string `json:"pod_namespace"`
	PodName   string `json:"pod_name"`
	Role      string `json:"role"`
	Digest    string `json:"policy_digest"`
	Message   string `json:"message"`
	Process   *struct {
		PID        int      `json:"pid"`
		Name       string   `json:"name"`
		Argv       []string `json:"argv"`
		Env        []string `json:"env"`
		Exe        string   `json:"exe"`
		UID        *int     `json:"uid"`
		ExitStatus *int     `json:"exit_status"`
	} `json:"process"`
	File *struct {
		Path  string `json:"path"`
		Flags string `json:"flags"`
		Mode  uint32 `json:"mode"`
	} `json:"file"`
	Target *struct {
		Path string `json:"path"`
	} `json:"target"`
	Activity string `json:"activity_name"`
	Dst      *struct {
		IP   string `json:"ip"`
		Port int    `json:"port"`
	} `json:"dst_endpoint"`
	Src *struct {
		IP   string `json:"ip"`
		Port int    `json:"port"`
	} `json:"src_endpoint"`
	Counts map[string]int    `json:"counts"`
	Detail map[string]string `json:"detail"`
	// Claim and WarmPool: the task a claimed sandbox works for, or the
	// warm pool holding it.
	Claim    *audit.Claim `json:"claim"`
	WarmPool string       `json:"warm_pool"`
	// MCP is an agentbox/mcp_call's call.
	MCP *audit.MCPCall `json:"mcp"`
	// Model is a model call's record, as far as the budget tests read it.
	Model *struct {
		Requested string `json:"requested_model"`
		Endpoint  string `json:"endpoint"`
		Budget    *struct {
			Reserved int64 `json:"reserved_tokens"`
			Charged  int64 `json:"charged_tokens"`
			CapSet   int64 `json:"cap_set"`
		} `json:"budget"`
	} `json:"model"`
}

func readTrail(t *testing.T, sandbox string) []record {
	t.Helper()
	path := filepath.Join(dev.dir, "audit", sandbox+".jsonl")
	var recs []record
	if eventually(t, 20*time.Second, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		recs = parseTrail(t, b)
		return len(recs) > 0 && recs[len(recs)-1].Event == "agentbox/sandbox_end"
	}) {
		return recs
	}
	t.Fatalf("trail %s has no end record: %d records", path, len(recs))
	return nil
}

// decodeRecord reads an OCSF line back into agentbox's own model
// (audit.ParseLine), seen through the fields the tests check.
func decodeRecord(line []byte) (record, error) {
	var r record
	ar, err := audit.ParseLine(line)
	if err != nil {
		return r, err
	}
	flat, err := json.Marshal(ar)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(flat, &r)
}

// parseTrail decodes a trail's records, failing on a line that is not one.
func parseTrail(t *testing.T, b []byte) []record {
	t.Helper()
	var recs []record
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		r, err := decodeRecord([]byte(l))
		if err != nil {
			t.Fatalf("bad record %q: %v", l, err)
		}
		recs = append(recs, r)
	}
	return recs
}

func agentbox(args ...string) result {
	return dev.run(60*time.Second, "agentbox", args...)
}
