package audit

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultRedactions are argv patterns redacted in every record, in addition
// to the shim config's.
var DefaultRedactions = []string{
	`(?i)((?:password|passwd|secret|token|api[_-]?key|access[_-]?key|credential)s?[=:])\S+`,
	`(?i)(authorization:\s*bearer\s+)\S+`,
	`(?i)(bearer\s+)[A-Za-z0-9._~+/-]+=*`,
	`\bAKIA[0-9A-Z]{16}\b`,
	`\bgh[pousr]_[A-Za-z0-9]{20,}\b`,
	`(://[^/\s:@]+:)[^/\s@]+(@)`,
}

// Redacted replaces what a redaction matched.
const Redacted = "<redacted>"

// EnvDropped replaces the value of an environment variable the role does
// not allow.
const EnvDropped = "<dropped>"

// RoleScrubber keeps the environment values a role allows, drops the rest
// (names stay), and redacts secrets that patterns find in argv.
type RoleScrubber struct {
	// EnvAllowed reports whether the role lets a variable through.
	EnvAllowed func(name string) bool
	patterns   []redaction
}

// redaction is a pattern and a cheap test that it could match at all.
type redaction struct {
	re       *regexp.Regexp
	mayMatch func(string) bool
}

// defaultHints are prefilters for DefaultRedactions, in order: a regexp
// runs only on values that could match it.
var defaultHints = []func(string) bool{
	func(s string) bool { return strings.ContainsAny(s, "=:") },
	func(s string) bool { return containsFold(s, "bearer") },
	func(s string) bool { return containsFold(s, "bearer") },
	func(s string) bool { return strings.Contains(s, "AKIA") },
	func(s string) bool { return strings.Contains(s, "gh") },
	func(s string) bool { return strings.Contains(s, "://") },
}

// NewScrubber compiles the default redactions and extra ones.
func NewScrubber(envAllowed func(string) bool, extra []string) (*RoleScrubber, error) {
	s := &RoleScrubber{EnvAllowed: envAllowed}
	for i, p := range append(append([]string(nil), DefaultRedactions...), extra...) {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("redaction pattern %q: %w", p, err)
		}
		hint := func(string) bool { return true }
		if i < len(defaultHints) {
			hint = defaultHints[i]
		}
		s.patterns = append(s.patterns, redaction{re: re, mayMatch: hint})
	}
	return s, nil
}

// Env implements Scrubber.
func (s *RoleScrubber) Env(env []string) []string {
	if len(env) == 0 {
		return nil
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if s.EnvAllowed != nil && s.EnvAllowed(name) {
			out = append(out, s.redact(kv))
		} else {
			out = append(out, name+"="+EnvDropped)
		}
	}
	return out
}

// Args implements Scrubber.
func (s *RoleScrubber) Args(argv []string) []string {
	if len(argv) == 0 {
		return nil
	}
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = s.redact(a)
	}
	return out
}

func (s *RoleScrubber) redact(v string) string {
	for _, p := range s.patterns {
		if !p.mayMatch(v) {
			continue
		}
		re := p.re
		if re.NumSubexp() == 0 {
			v = re.ReplaceAllString(v, Redacted)
			continue
		}
		v = re.ReplaceAllStringFunc(v, func(m string) string {
			sub := re.FindStringSubmatch(m)
			out := sub[1] + Redacted
			if len(sub) > 2 {
				out += sub[2]
			}
			return out
		})
	}
	return v
}

// containsFold is a case-insensitive strings.Contains for an ASCII
// lower-case needle, without allocating.
func containsFold(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		j := 0
		for ; j < len(lower); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != lower[j] {
				break
			}
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}
