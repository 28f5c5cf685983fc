package netpolicy

// What two host rules' HTTP restrictions (methods, paths) both allow: a
// live tightening narrows a rule's paths and methods, and a rule that
// lists fewer restricts less (it loosens). A list that is empty allows
// any.

import (
	"slices"
	"strings"

	"agentbox.dev/agentbox/internal/mcp"
)

// intersectHTTP is what both rules' methods and paths allow; false when
// nothing is left.
func intersectHTTP(c, n Rule) (methods, paths []string, ok bool) {
	if methods, ok = intersectList(c.Methods, n.Methods, func(p, q string) bool { return p == q }); !ok {
		return nil, nil, false
	}
	paths, ok = intersectList(c.Paths, n.Paths, pathWithin)
	return methods, paths, ok
}

// pathWithin says whether every path pattern p allows, q allows too (a
// pattern is an exact path, or a prefix ending in '*').
func pathWithin(p, q string) bool {
	if prefix, ok := strings.CutSuffix(q, "*"); ok {
		return strings.HasPrefix(strings.TrimSuffix(p, "*"), prefix)
	}
	return p == q
}

// intersectList is the entries of each list that the other allows whole
// (within(p, q): q allows all p does), sorted; false when none is left.
// An empty list allows any.
func intersectList(a, b []string, within func(p, q string) bool) ([]string, bool) {
	switch {
	case len(a) == 0:
		return slices.Clone(b), true
	case len(b) == 0:
		return slices.Clone(a), true
	}
	var out []string
	for _, pair := range [][2][]string{{b, a}, {a, b}} {
		for _, p := range pair[0] {
			for _, q := range pair[1] {
				if within(p, q) && !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		}
	}
	slices.Sort(out)
	return out, len(out) > 0
}

// sorted is a sorted copy of l (nil for none).
func sorted(l []string) []string {
	if len(l) == 0 {
		return nil
	}
	out := slices.Clone(l)
	slices.Sort(out)
	return out
}

// sameHTTP says whether two rules restrict the same methods and paths,
// and the same MCP tools.
func sameHTTP(a, b Rule) bool {
	return slices.Equal(a.Methods, b.Methods) && slices.Equal(a.Paths, b.Paths) && sameTools(a.Tools, b.Tools)
}

// sameTools says whether two MCP rules allow the same tools. A running
// sandbox keeps its rule's tools: a version that changes them applies to
// new sandboxes (tool patterns do not narrow by parts).
func sameTools(a, b *mcp.Tools) bool {
	return (a == nil) == (b == nil) && (a == nil || slices.Equal(a.Allow, b.Allow) && slices.Equal(a.Deny, b.Deny))
}
