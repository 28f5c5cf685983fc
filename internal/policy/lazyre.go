package policy

import (
	"regexp"
	"sync"
)

// lazyRE is a regular expression compiled when first used. This package is
// in every shim process, and most of them (the `shim start` that finds or
// starts a pod's daemon) validate nothing: compiled at init, its
// expressions cost each of them about a millisecond of CPU and 0.6 MiB.
type lazyRE struct {
	expr string
	once sync.Once
	re   *regexp.Regexp
}

func lazy(expr string) *lazyRE { return &lazyRE{expr: expr} }

func (l *lazyRE) get() *regexp.Regexp {
	l.once.Do(func() { l.re = regexp.MustCompile(l.expr) })
	return l.re
}

// MatchString is regexp.Regexp's.
func (l *lazyRE) MatchString(s string) bool { return l.get().MatchString(s) }

// FindStringSubmatch is regexp.Regexp's.
func (l *lazyRE) FindStringSubmatch(s string) []string { return l.get().FindStringSubmatch(s) }
