package ocsf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Problem is one way an event fails the schema, at a JSON path.
type Problem struct {
	Path string
	Msg  string
}

func (p Problem) Error() string {
	if p.Path == "" {
		return p.Msg
	}
	return p.Path + ": " + p.Msg
}

// ValidateJSON checks one event, given as JSON.
func (s *Schema) ValidateJSON(b []byte) []Problem {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var ev map[string]any
	if err := d.Decode(&ev); err != nil {
		return []Problem{{Msg: "not a JSON object: " + err.Error()}}
	}
	if d.More() {
		return []Problem{{Msg: "more than one JSON value"}}
	}
	return s.Validate(ev)
}

// Validate checks one event (decoded with UseNumber).
func (s *Schema) Validate(ev map[string]any) []Problem {
	v := &validator{s: s, profiles: map[string]bool{}}
	classUID, ok := intOf(ev["class_uid"])
	if !ok {
		return []Problem{{Path: "class_uid", Msg: "missing or not an integer"}}
	}
	cls := s.Classes[int(classUID)]
	if cls == nil {
		return []Problem{{Path: "class_uid", Msg: fmt.Sprintf("%d is not a class of OCSF %s", classUID, s.Version)}}
	}
	if md, ok := ev["metadata"].(map[string]any); ok {
		if ps, ok := md["profiles"].([]any); ok {
			for i, p := range ps {
				name, _ := p.(string)
				if !s.Profiles[name] {
					v.add(fmt.Sprintf("metadata.profiles[%d]", i), "%q is not a profile of OCSF %s", p, s.Version)
					continue
				}
				v.profiles[name] = true
			}
		}
		if ver, ok := md["version"].(string); ok && ver != s.Version {
			v.add("metadata.version", "%q, but the schema is %s", ver, s.Version)
		}
	}
	if cat, ok := intOf(ev["category_uid"]); ok && int(cat) != cls.CategoryUID {
		v.add("category_uid", "%d, but class %d (%s) is in category %d", cat, cls.UID, cls.Caption, cls.CategoryUID)
	}
	if act, ok := intOf(ev["activity_id"]); ok {
		if tu, ok := intOf(ev["type_uid"]); ok && tu != int64(cls.UID)*100+act {
			v.add("type_uid", "%d, but class_uid*100+activity_id is %d", tu, int64(cls.UID)*100+act)
		}
	}
	if n, ok := ev["class_name"].(string); ok && n != cls.Caption {
		v.add("class_name", "%q, but class %d is %q", n, cls.UID, cls.Caption)
	}
	if n, ok := ev["category_name"].(string); ok && n != cls.CategoryName {
		v.add("category_name", "%q, but category %d is %q", n, cls.CategoryUID, cls.CategoryName)
	}
	v.object("", &cls.Object, ev, 0)
	sort.Slice(v.out, func(i, j int) bool { return v.out[i].Path < v.out[j].Path })
	return v.out
}

type validator struct {
	s        *Schema
	profiles map[string]bool
	out      []Problem
}

func (v *validator) add(path, format string, args ...any) {
	v.out = append(v.out, Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

const maxDepth = 32

func (v *validator) object(path string, o *Object, m map[string]any, depth int) {
	if depth > maxDepth {
		v.add(path, "nested deeper than %d objects", maxDepth)
		return
	}
	for name, val := range m {
		a, ok := o.Attrs[name]
		if !ok && v.profiles["datetime"] {
			// The datetime profile gives every timestamp_t attribute an
			// RFC 3339 sibling, name_dt.
			if ts, isTS := o.Attrs[strings.TrimSuffix(name, "_dt")]; isTS && strings.HasSuffix(name, "_dt") && ts.Type == "timestamp_t" {
				a, ok = &Attr{Name: name, Type: "datetime_t", Array: ts.Array}, true
			}
		}
		if !ok {
			v.add(join(path, name), "not an attribute of %s", o.Name)
			continue
		}
		if a.Profile != "" && !v.profiles[a.Profile] {
			v.add(join(path, name), "belongs to profile %q, which metadata.profiles does not name", a.Profile)
		}
		if val == nil {
			v.add(join(path, name), "null")
			continue
		}
		v.value(join(path, name), a, val, m, depth)
	}
	for name, a := range o.Attrs {
		if a.Requirement != "required" {
			continue
		}
		if a.Profile != "" && !v.profiles[a.Profile] {
			continue
		}
		if _, ok := m[name]; !ok {
			v.add(join(path, name), "required by %s, missing", o.Name)
		}
	}
	if len(o.AtLeastOne) > 0 && countPresent(m, o.AtLeastOne) == 0 {
		v.add(path, "%s needs at least one of %s", o.Name, strings.Join(o.AtLeastOne, ", "))
	}
	if len(o.JustOne) > 0 && countPresent(m, o.JustOne) != 1 {
		v.add(path, "%s needs exactly one of %s", o.Name, strings.Join(o.JustOne, ", "))
	}
}

func countPresent(m map[string]any, names []string) int {
	n := 0
	for _, k := range names {
		if _, ok := m[k]; ok {
			n++
		}
	}
	return n
}

func (v *validator) value(path string, a *Attr, val any, parent map[string]any, depth int) {
	if a.Array {
		arr, ok := val.([]any)
		if !ok {
			v.add(path, "must be an array of %s", a.Type)
			return
		}
		for i, e := range arr {
			v.scalar(fmt.Sprintf("%s[%d]", path, i), a, e, nil, depth)
		}
		return
	}
	v.scalar(path, a, val, parent, depth)
}

func (v *validator) scalar(path string, a *Attr, val any, parent map[string]any, depth int) {
	if a.Type == "object" {
		// The generic object (unmapped): any keys, any values.
		if _, ok := val.(map[string]any); !ok {
			v.add(path, "must be an object")
		}
		return
	}
	if o := v.s.objects[a.Type]; o != nil {
		m, ok := val.(map[string]any)
		if !ok {
			v.add(path, "must be a %s object", a.Type)
			return
		}
		v.object(path, o, m, depth+1)
		return
	}
	t := v.s.types[a.Type]
	switch t.base {
	case "object":
		if _, ok := val.(map[string]any); !ok {
			v.add(path, "must be an object")
		}
		return
	case "json_t":
		return
	case "string_t":
		str, ok := val.(string)
		if !ok {
			v.add(path, "must be a string (%s)", a.Type)
			return
		}
		if t.maxLen > 0 && len(str) > t.maxLen {
			v.add(path, "longer than %d (%s)", t.maxLen, a.Type)
		}
		if t.regex != nil && !t.regex.MatchString(str) {
			v.add(path, "%q is not a %s", str, a.Type)
		}
		if len(a.Enum) > 0 {
			if _, ok := a.Enum[str]; !ok {
				v.add(path, "%q is not one of its enum values", str)
			}
		}
	case "integer_t", "long_t":
		n, ok := intOf(val)
		if !ok {
			v.add(path, "must be an integer (%s)", a.Type)
			return
		}
		if a.Type == "integer_t" && (n > math.MaxInt32 || n < math.MinInt32) {
			v.add(path, "%d does not fit integer_t (32 bits)", n)
		}
		if len(t.rng) == 2 && (n < t.rng[0] || n > t.rng[1]) {
			v.add(path, "%d outside %s's range %d..%d", n, a.Type, t.rng[0], t.rng[1])
		}
		// class_uid, category_uid and type_uid are checked against the
		// class itself (Validate): their enums are the base event's.
		if len(a.Enum) > 0 && !(depth == 0 && classifiers[a.Name]) {
			caption, ok := a.Enum[strconv.FormatInt(n, 10)]
			if !ok {
				v.add(path, "%d is not one of its enum values", n)
				return
			}
			// The sibling carries the caption, except for Other (99),
			// where it carries the source's own label.
			if a.Sibling != "" && parent != nil && n != 99 {
				if sib, ok := parent[a.Sibling].(string); ok && sib != caption {
					v.add(join(strings.TrimSuffix(strings.TrimSuffix(path, a.Name), "."), a.Sibling), "%q, but %s %d is %q", sib, a.Name, n, caption)
				}
			}
		}
	case "float_t":
		if _, ok := val.(json.Number); !ok {
			v.add(path, "must be a number")
		}
	case "boolean_t":
		if _, ok := val.(bool); !ok {
			v.add(path, "must be a boolean")
		}
	default:
		v.add(path, "type %q unknown", a.Type)
	}
}

var classifiers = map[string]bool{"class_uid": true, "category_uid": true, "type_uid": true}

func intOf(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}
