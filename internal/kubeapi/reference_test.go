package kubeapi

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"agentbox.dev/agentbox/internal/golden"
)

var update = flag.Bool("update", false, "rewrite docs/reference/role.md")

// schema is the part of an OpenAPI v3 schema the reference shows.
type schema struct {
	Description string             `yaml:"description"`
	Type        string             `yaml:"type"`
	Enum        []any              `yaml:"enum"`
	Pattern     string             `yaml:"pattern"`
	Minimum     *float64           `yaml:"minimum"`
	Maximum     *float64           `yaml:"maximum"`
	Required    []string           `yaml:"required"`
	Properties  map[string]*schema `yaml:"properties"`
	Items       *schema            `yaml:"items"`
}

// rows renders s's fields under prefix, one table row each, in name
// order, nested objects and list items after their field.
func rows(prefix string, s *schema, out *strings.Builder) {
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := s.Properties[n]
		path := prefix + n
		typ := f.Type
		inner := f
		if f.Type == "array" && f.Items != nil {
			typ = "list of " + f.Items.Type
			inner = f.Items
			path += "[]"
		}
		var notes []string
		if len(inner.Enum) > 0 {
			var vs []string
			for _, v := range inner.Enum {
				vs = append(vs, fmt.Sprintf("`%v`", v))
			}
			notes = append(notes, "one of "+strings.Join(vs, ", "))
		}
		if inner.Pattern != "" {
			notes = append(notes, "matches `"+inner.Pattern+"`")
		}
		if inner.Minimum != nil {
			notes = append(notes, fmt.Sprintf("≥ %v", *inner.Minimum))
		}
		if inner.Maximum != nil {
			notes = append(notes, fmt.Sprintf("≤ %v", *inner.Maximum))
		}
		for _, r := range s.Required {
			if r == n {
				notes = append(notes, "required")
			}
		}
		desc := strings.Join(strings.Fields(f.Description), " ")
		if len(notes) > 0 {
			desc = strings.TrimSpace(desc + " (" + strings.Join(notes, "; ") + ")")
		}
		fmt.Fprintf(out, "| `%s` | %s | %s |\n", path, typ, strings.ReplaceAll(desc, "|", "\\|"))
		if len(inner.Properties) > 0 {
			rows(path+".", inner, out)
		}
	}
}

// reference renders the spec of each CRD file as a table.
func reference(crds []string) (string, error) {
	var b strings.Builder
	b.WriteString("<!-- Generated from examples/kubernetes/crds (hack/crds.sh, from internal/policy's types): go test ./internal/kubeapi -run TestRoleReference -update. Do not edit. -->\n\n")
	b.WriteString("# Role and binding reference\n\n")
	b.WriteString("Every field of a role and a binding, as the policy loader and the CRDs take them. A node's\n")
	b.WriteString("policy files write `kind: Role` and `kind: RoleBinding` with the same `spec`; the cluster's\n")
	b.WriteString("objects are `AgentRole` and `AgentRoleBinding`. The guide is [policies/README.md](../../policies/README.md).\n")
	for _, file := range crds {
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		var crd struct {
			Spec struct {
				Names    struct{ Kind string } `yaml:"names"`
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema schema `yaml:"openAPIV3Schema"`
					} `yaml:"schema"`
				} `yaml:"versions"`
			} `yaml:"spec"`
		}
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		if len(crd.Spec.Versions) != 1 {
			return "", fmt.Errorf("%s: %d versions", file, len(crd.Spec.Versions))
		}
		top := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
		spec := top.Properties["spec"]
		if spec == nil {
			return "", fmt.Errorf("%s: no spec", file)
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n| field | type | what |\n| --- | --- | --- |\n", crd.Spec.Names.Kind, strings.Join(strings.Fields(top.Description), " "))
		rows("spec.", spec, &b)
	}
	return b.String(), nil
}

// TestRoleReference: docs/reference/role.md is the CRDs' schema, which
// the Go types generate (make check runs this test).
func TestRoleReference(t *testing.T) {
	page, err := reference([]string{"../../examples/kubernetes/crds/agentbox.dev_agentroles.yaml", "../../examples/kubernetes/crds/agentbox.dev_agentrolebindings.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "../../docs/reference/role.md", page, *update, "go test ./internal/kubeapi -run TestRoleReference -update")
	if !strings.Contains(page, "| `spec.limits.model.tokens` |") || !strings.Contains(page, "| `spec.subjects[].namespace` |") {
		t.Fatalf("the reference lacks fields it must have:\n%s", page)
	}
}
