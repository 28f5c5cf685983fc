package naming

import (
	"math/rand"
	"regexp"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "0": true, "warm-python.v2_1": true, strings.Repeat("a", 63): true,
		"": false, strings.Repeat("a", 64): false, "-a": false, ".a": false, "_a": false,
		"A": false, "a/b": false, "a..b": false, "..": false, "a b": false, "é": false, "a\x00": false,
	} {
		if err := Valid(name); (err == nil) != ok {
			t.Errorf("Valid(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

// TestPlainNameIsTheExpression: the loop accepts exactly what the regular
// expression it replaced did.
func TestPlainNameIsTheExpression(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	alphabet := "az09._-A/ \x00\xff"
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.Intn(66))
		for j := range b {
			b[j] = alphabet[r.Intn(len(alphabet))]
		}
		if i%2 == 0 && len(b) > 0 { // mostly valid, to reach the length bound
			for j := range b {
				b[j] = "az09._-"[r.Intn(7)]
			}
			b[0] = 'a'
		}
		if s := string(b); plainName(s) != re.MatchString(s) {
			t.Fatalf("%q: loop %v, expression %v", s, plainName(s), re.MatchString(s))
		}
	}
}
