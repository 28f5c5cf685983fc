package policy

import "testing"

// TestLazyExpressionsCompile: each expression compiles (compiled at init,
// a bad one failed every test; compiled lazily, only its first use would).
func TestLazyExpressionsCompile(t *testing.T) {
	for _, r := range []*lazyRE{dns1123, secretKey, claimKeyRE, cpuThrottle, bytesRE, nameRE, envNameRE, envPatRE, syscallRE, subjectRE, hostRE, headerRE, methodRE, toolRE} {
		if r.get() == nil {
			t.Errorf("%q did not compile", r.expr)
		}
	}
	if !hostRE.MatchString("api.example.com") || hostRE.MatchString("bad host") {
		t.Error("hostRE")
	}
}
