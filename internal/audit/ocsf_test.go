package audit

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"agentbox.dev/agentbox/internal/ocsf"
)

func schema(t *testing.T) *ocsf.Schema {
	t.Helper()
	s, err := ocsf.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != SchemaVersion {
		t.Fatalf("records say OCSF %s, the schema copy is %s", SchemaVersion, s.Version)
	}
	return s
}

// The validator is not a rubber stamp: each way a record can go wrong is
// caught, naming the field.
func TestValidatorRejects(t *testing.T) {
	s := schema(t)
	// The golden corpus's first record (internal/audit/ingest writes it).
	golden, err := os.ReadFile("testdata/ocsf-golden.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	line := bytes.SplitN(golden, []byte("\n"), 2)[0]
	for _, tc := range []struct{ name, from, to, want string }{
		{"string time", `{"time":`, `{"time":"2026","x":`, "time: must be an integer"},
		{"wrong type_uid", `"type_uid":300303`, `"type_uid":300304`, "type_uid"},
		{"unknown attribute", `"severity_id":1`, `"severity_id":1,"sandbox_id":"x"`, "sandbox_id: not an attribute"},
		{"bad enum", `"severity_id":1`, `"severity_id":42`, "severity_id: 42 is not one of"},
		{"caption mismatch", `"severity":"Informational"`, `"severity":"High"`, "severity"},
		{"no profile", `"ai_operation",`, ``, "ai_agent: belongs to profile"},
		{"missing required", `"device":{"type_id":1,"type":"Server",`, `"device":{`, "device.type_id: required"},
		{"wrong class name", `"class_name":"Authorize Session"`, `"class_name":"Base Event"`, "class_name"},
	} {
		bad := bytes.Replace(line, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(bad, line) {
			t.Fatalf("%s: %q not in the line", tc.name, tc.from)
		}
		probs := s.ValidateJSON(bad)
		if !bytes.Contains([]byte(fmt.Sprint(probs)), []byte(tc.want)) {
			t.Errorf("%s: want a problem with %q, got %v", tc.name, tc.want, probs)
		}
	}
	if probs := s.ValidateJSON(line); len(probs) != 0 {
		t.Fatalf("the untouched line must conform: %v", probs)
	}
}

// A trail written before the OCSF records still verifies, and one that
// goes on in the new format after it does too.
func TestLegacyTrailVerifies(t *testing.T) {
	const legacy = "testdata/legacy.jsonl"
	res := VerifyTrail(TrailFiles{Files: []string{legacy}}, false)
	if res.Problem != nil || res.Records != 4 || !res.Ended || res.Gaps != 1 || res.Unrecorded != 2 {
		t.Fatalf("legacy trail: %+v", res)
	}
	b, _ := os.ReadFile(legacy)
	lines := bytes.SplitAfter(b, []byte("\n"))
	for _, l := range lines[:len(lines)-1] {
		r, err := ParseLine(l)
		if err != nil || r.Sandbox != "legacy" || r.Event == "" {
			t.Fatalf("legacy line does not parse: %v %+v", err, r)
		}
	}
	// The first three legacy records, then OCSF ones chained to them.
	var v Verifier
	var c Chain
	for _, l := range lines[:3] {
		v.Line(legacy, l)
		cf := splitChain(bytes.TrimRight(l, "\n"))
		c.Commit(cf.hash)
	}
	r := TypeSandboxEnd.New("Success", "end", nil)
	r.Sandbox = "legacy"
	line, _ := c.SealAppend(nil, r)
	v.Line("new", line)
	if res := v.Finish(false); res.Problem != nil || res.Records != 4 || !res.Ended {
		t.Fatalf("mixed trail: %+v", res)
	}
}

// Every kind of sample record conforms to the schema: the claim's
// tenant_uid in metadata, the rest of the claim and the warm pool under
// unmapped.
func TestSampleRecordsConform(t *testing.T) {
	s := schema(t)
	for i, r := range sampleRecords() {
		_, line := roundTrip(t, r)
		if probs := s.ValidateJSON(bytes.TrimRight(line, "\n")); len(probs) != 0 {
			t.Errorf("sample %d (%s): %v\n%s", i, r.Event, probs, line)
		}
		if r.Claim != nil && r.Claim.Tenant != "" && !bytes.Contains(line, []byte(`"tenant_uid":"`+r.Claim.Tenant+`"`)) {
			t.Errorf("sample %d: no metadata.tenant_uid:\n%s", i, line)
		}
	}
}
