package policy

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the loader. It must never panic or
// hang, and whatever it accepts must compile and select cleanly.
//
//	go test ./internal/policy -run '^$' -fuzz FuzzParse -fuzztime 60s
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(repoPoliciesDir(), "*.yaml"))
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(family))
	f.Add([]byte(goldenRoles))
	f.Add([]byte(roleHead + "spec: {inherits: r}\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: x}\nspec:\n  limits: {memory: 99999999999999999Ti}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Parse("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		for name := range set.Roles {
			p, err := set.Profile(name)
			if err != nil {
				t.Fatalf("accepted role %q does not compile: %v", name, err)
			}
			if p.Digest == "" {
				t.Fatal("profile without digest")
			}
			_, _ = set.Select(Request{Annotations: map[string]string{RoleAnnotation: name}, PodNamespace: "ns", ContainerdNamespace: "k8s.io"})
		}
	})
}

func repoPoliciesDir() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..", "policies")
}
