package policy

import (
	"encoding/json"
	"testing"

	"agentbox.dev/agentbox/internal/ocispec"
)

// BenchmarkCreatePipeline is the policy work the shim adds to each Create:
// the policy set from the cache (directory fingerprint only), role
// selection and binding check, compile, and the spec rewrite including the
// JSON decode and encode of config.json.
func BenchmarkCreatePipeline(b *testing.B) {
	var cache Cache
	dir := repoPolicies(&testing.T{})
	if _, err := cache.Load(dir); err != nil {
		b.Fatal(err)
	}
	specJSON, _ := json.Marshal(baseSpec())
	req := Request{PodNamespace: "agents", ContainerdNamespace: "k8s.io", DefaultRole: "baseline",
		Annotations: map[string]string{RoleAnnotation: "coder"}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		set, err := cache.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		p, err := set.Select(req)
		if err != nil {
			b.Fatal(err)
		}
		var s = baseSpec()
		if err := json.Unmarshal(specJSON, s); err != nil {
			b.Fatal(err)
		}
		s.Mounts = s.Mounts[:4] // no host volume: coder allows none
		if _, err := ocispec.Apply(s, p.SpecRewrites(nil, testEnv)...); err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadPolicies is a cold load of the shipped policies (a cache
// miss: the directory changed).
func BenchmarkLoadPolicies(b *testing.B) {
	dir := repoPolicies(&testing.T{})
	for i := 0; i < b.N; i++ {
		if _, err := LoadPaths(dir); err != nil {
			b.Fatal(err)
		}
	}
}
