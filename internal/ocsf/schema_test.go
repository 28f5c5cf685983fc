package ocsf

import (
	"strings"
	"testing"
)

func TestLoadCompilesTheSchema(t *testing.T) {
	s, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != "1.9.0-dev" || len(s.Classes) < 70 {
		t.Fatalf("version %s, %d classes", s.Version, len(s.Classes))
	}
	for _, tc := range []struct {
		uid      int
		caption  string
		category int
		required []string
	}{
		{0, "Base Event", 0, []string{"activity_id", "class_uid", "metadata", "severity_id", "time"}},
		{1001, "File System Activity", 1, []string{"actor", "device", "file"}},
		{1007, "Process Activity", 1, []string{"actor", "device", "process"}},
		{4003, "DNS Activity", 4, nil},
		{6002, "Application Lifecycle", 6, []string{"app"}},
	} {
		c := s.Classes[tc.uid]
		if c == nil || c.Caption != tc.caption || c.CategoryUID != tc.category {
			t.Fatalf("class %d: %+v", tc.uid, c)
		}
		req := strings.Join(c.Required(), " ")
		for _, r := range tc.required {
			if !strings.Contains(" "+req+" ", " "+r+" ") {
				t.Errorf("class %d: %s not required (%s)", tc.uid, r, req)
			}
		}
		// activity_id's enum: the base event's Unknown and Other, and
		// the class's own activities.
		if e := c.Attrs["activity_id"].Enum; e["0"] != "Unknown" || e["99"] != "Other" {
			t.Errorf("class %d: activity_id enum %v", tc.uid, e)
		}
	}
	if e := s.Classes[1001].Attrs["activity_id"].Enum; e["4"] != "Delete" || e["5"] != "Rename" {
		t.Errorf("file activity enum: %v", e)
	}
	// A profile's attributes carry the profile; system classes take
	// actor and device without one.
	if a := s.Classes[1001].Attrs["attestation_list"]; a == nil || a.Profile != "record_integrity" || !a.Array {
		t.Errorf("attestation_list: %+v", a)
	}
	if a := s.Classes[1001].Attrs["actor"]; a.Profile != "" || a.Requirement != "required" {
		t.Errorf("system actor: %+v", a)
	}
	if a := s.Object("process").Attrs["ai_agent"]; a == nil || a.Profile != "ai_operation" {
		t.Errorf("process.ai_agent: %+v", a)
	}
	if o := s.Object("file"); strings.Join(o.Required(), ",") != "name,type_id" {
		t.Errorf("file requires %v", o.Required())
	}
}

func TestValidateBasics(t *testing.T) {
	s, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	ok := `{"time":1,"class_uid":0,"category_uid":0,"activity_id":99,"type_uid":99,"severity_id":1,"metadata":{"version":"1.9.0-dev","product":{"name":"x"}}}`
	if p := s.ValidateJSON([]byte(ok)); len(p) != 0 {
		t.Fatalf("minimal base event: %v", p)
	}
	for in, want := range map[string]string{
		`[]`:                  "not a JSON object",
		`{"class_uid":"0"}`:   "class_uid: missing or not an integer",
		`{"class_uid":77777}`: "not a class",
		strings.Replace(ok, `"time":1`, `"time":1.5`, 1):                                                     "time: must be an integer",
		strings.Replace(ok, `"product":{"name":"x"}`, `"product":{}`, 1):                                     "metadata.product",
		strings.Replace(ok, `"version":"1.9.0-dev"`, `"version":"1.0.0"`, 1):                                 "metadata.version",
		strings.Replace(ok, `"severity_id":1`, `"severity_id":1,"device":{"type_id":1,"ip":"not-an-ip"}`, 1): "profile",
	} {
		p := s.ValidateJSON([]byte(in))
		if len(p) == 0 || !strings.Contains(p[0].Error()+" "+joinProblems(p), want) {
			t.Errorf("%s: want %q, got %v", in, want, p)
		}
	}
}

func joinProblems(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString(p.Error() + "; ")
	}
	return b.String()
}
