package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The SBOM of a real binary (this package's own, built here) describes
// it, with its checksum, and every module its build information names,
// each a purl, each contained by the binary; every id is an SPDX id.
func TestSBOMOfABinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sbom")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	doc, err := build("agentbox-1.2.3", "1.2.3", []string{bin}, time.Unix(0, 0), map[string]string{"sbom": "a note"})
	if err != nil {
		t.Fatal(err)
	}
	if doc.Version != "SPDX-2.3" || doc.Creation.Created != "1970-01-01T00:00:00Z" || len(doc.Packages) < 2 {
		t.Fatalf("document %+v", doc)
	}
	b := doc.Packages[0]
	if b.Name != "sbom" || b.Version != "1.2.3" || len(b.Checks) != 1 || len(b.Checks[0].Value) != 64 || !strings.Contains(b.Comment, "a note") {
		t.Fatalf("the binary's package %+v", b)
	}
	ids := map[string]bool{}
	for _, p := range doc.Packages {
		if ids[p.ID] || strings.ContainsAny(strings.TrimPrefix(p.ID, "SPDXRef-"), "/@_ ") {
			t.Errorf("id %q repeated or not an SPDX id", p.ID)
		}
		ids[p.ID] = true
	}
	var contains int
	for _, r := range doc.Relationships {
		if !ids[r.To] {
			t.Errorf("a relationship to %s, no package", r.To)
		}
		if r.Type == "CONTAINS" {
			contains++
		}
	}
	if contains != len(doc.Packages)-1 {
		t.Errorf("%d CONTAINS for %d modules", contains, len(doc.Packages)-1)
	}
	if _, err := build("x", "1", []string{"/nonexistent"}, time.Now(), nil); err == nil {
		t.Error("a missing binary gave an SBOM")
	}
	if _, err := build("x", "1", []string{"main.go"}, time.Now(), nil); err == nil {
		t.Error("a file that is no Go binary gave an SBOM")
	}
}
