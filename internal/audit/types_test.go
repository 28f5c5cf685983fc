package audit

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Every record type is unique and listed in docs/audit.md, where SIEM
// rule writers look for them.
func TestCatalogDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../docs/audit.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, rt := range Catalog {
		if seen[rt.Name] {
			t.Errorf("%s is defined twice", rt.Name)
		}
		seen[rt.Name] = true
		if rt.About == "" {
			t.Errorf("%s says not when it is written (About)", rt.Name)
		}
		row := fmt.Sprintf("| `%s` | %s (%d) | %s | %s |", rt.Name, classes[rt.Class].name, rt.Class, rt.Activity, strings.ReplaceAll(rt.About, "|", `\|`))
		if !strings.Contains(string(readme), row) {
			t.Errorf("%s is not in docs/audit.md's record types", row)
		}
	}
}
