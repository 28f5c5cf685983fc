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
	patterns   []*regexp.Regexp
}

// NewScrubber compiles the default redactions and extra ones.
func NewScrubber(envAllowed func(string) bool, extra []string) (*RoleScrubber, error) {
	s := &RoleScrubber{EnvAllowed: envAllowed}
	for _, p := range append(append([]string(nil), DefaultRedactions...), extra...) {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("redaction pattern %q: %w", p, err)
		}
		s.patterns = append(s.patterns, re)
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
	for _, re := range s.patterns {
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
