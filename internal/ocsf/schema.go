// Package ocsf reads the OCSF schema from its source files (the
// ocsf/ocsf-schema repository, copied under schema/ with its SOURCE and
// LICENSE) and validates events against it: classes compiled through their
// "extends" chains, "$include"d profiles and the dictionary, then each
// event checked for its class and category, its type_uid, required
// attributes, types, enums and their captions, object constraints, and
// attributes the class does not define. It is the reference the audit
// trail is tested against; nothing in it was written to fit agentbox's
// records.
package ocsf

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
)

// Files is the schema this package was built with.
//
//go:embed all:schema
var files embed.FS

// Embedded is the schema copied under schema/.
func Embedded() (*Schema, error) {
	sub, err := fs.Sub(files, "schema")
	if err != nil {
		return nil, err
	}
	return Load(sub)
}

// Attr is one attribute of a compiled class or object.
type Attr struct {
	Name        string
	Type        string // a dictionary type (string_t...) or an object name
	Array       bool
	Requirement string // required, recommended, optional
	// Profile is the profile that brings the attribute; an event may carry
	// it only when its metadata.profiles names that profile.
	Profile string
	Enum    map[string]string // value -> caption
	Sibling string
}

// Object is a compiled object or class: its attributes and constraints.
type Object struct {
	Name       string
	Caption    string
	Attrs      map[string]*Attr
	AtLeastOne []string
	JustOne    []string

	raw map[string]rawAttr // merged fields, for the items that extend it
}

// Class is a compiled event class.
type Class struct {
	Object
	UID          int
	CategoryUID  int
	CategoryName string
}

type baseType struct {
	base   string // string_t, integer_t, long_t, float_t, boolean_t, json_t, object
	regex  *regexp.Regexp
	maxLen int
	rng    []int64
}

// Schema is a compiled OCSF schema.
type Schema struct {
	Version  string
	Classes  map[int]*Class
	Profiles map[string]bool
	objects  map[string]*Object
	types    map[string]baseType
	dict     map[string]rawAttr

	fsys      fs.FS
	rawObj    map[string]rawItem
	rawClass  map[string]rawItem
	compiling map[string]bool
	cats      map[string]category
}

type category struct {
	UID     int    `json:"uid"`
	Caption string `json:"caption"`
}

// rawAttr is an attribute as a file writes it: only the fields present.
type rawAttr map[string]json.RawMessage

type rawItem struct {
	file        string
	Name        string                     `json:"name"`
	Caption     string                     `json:"caption"`
	Extends     string                     `json:"extends"`
	Category    string                     `json:"category"`
	UID         *int                       `json:"uid"`
	Meta        string                     `json:"meta"`
	Attributes  map[string]json.RawMessage `json:"attributes"`
	Constraints struct {
		AtLeastOne []string `json:"at_least_one"`
		JustOne    []string `json:"just_one"`
	} `json:"constraints"`
}

// Load compiles the schema in fsys (the repository's layout: version.json,
// categories.json, dictionary.json, objects/, events/, profiles/).
func Load(fsys fs.FS) (*Schema, error) {
	s := &Schema{
		Classes: map[int]*Class{}, Profiles: map[string]bool{}, objects: map[string]*Object{},
		types: map[string]baseType{}, fsys: fsys, rawObj: map[string]rawItem{}, rawClass: map[string]rawItem{},
		compiling: map[string]bool{},
	}
	var ver struct {
		Version string `json:"version"`
	}
	if err := s.readJSON("version.json", &ver); err != nil {
		return nil, err
	}
	s.Version = ver.Version
	var cats struct {
		Attributes map[string]category `json:"attributes"`
	}
	if err := s.readJSON("categories.json", &cats); err != nil {
		return nil, err
	}
	s.cats = cats.Attributes
	var dict struct {
		Attributes map[string]rawAttr `json:"attributes"`
		Types      struct {
			Attributes map[string]struct {
				Type   string  `json:"type"`
				Regex  string  `json:"regex"`
				MaxLen int     `json:"max_len"`
				Range  []int64 `json:"range"`
			} `json:"attributes"`
		} `json:"types"`
	}
	if err := s.readJSON("dictionary.json", &dict); err != nil {
		return nil, err
	}
	s.dict = dict.Attributes
	for name, t := range dict.Types.Attributes {
		bt := baseType{base: name, maxLen: t.MaxLen, rng: t.Range}
		if t.Type != "" {
			bt.base = t.Type
		}
		if t.Regex != "" {
			re, err := regexp.Compile(t.Regex)
			if err != nil {
				return nil, fmt.Errorf("dictionary type %s: regex: %w", name, err)
			}
			bt.regex = re
		}
		s.types[name] = bt
	}
	s.types["object"] = baseType{base: "object"}
	// timestamp_t is long_t, whose base is itself.
	for name, t := range s.types {
		for i := 0; i < 4; i++ {
			if nt, ok := s.types[t.base]; ok && nt.base != t.base {
				t.base = nt.base
			}
		}
		s.types[name] = t
	}
	profiles, _ := fs.Glob(fsys, "profiles/*.json")
	for _, p := range profiles {
		s.Profiles[strings.TrimSuffix(path.Base(p), ".json")] = true
	}
	for _, dir := range []string{"objects", "events"} {
		err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".json") {
				return err
			}
			var it rawItem
			if err := s.readJSON(p, &it); err != nil {
				return err
			}
			it.file = p
			if dir == "objects" {
				s.rawObj[it.Name] = it
			} else {
				s.rawClass[it.Name] = it
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for name := range s.rawObj {
		if _, err := s.object(name); err != nil {
			return nil, err
		}
	}
	for name, it := range s.rawClass {
		o, cat, uid, err := s.compile(it, s.rawClass, "class")
		if err != nil {
			return nil, err
		}
		if uid == nil && name == "base_event" {
			uid = new(int) // Base Event is class 0 of no category
		}
		if uid == nil {
			continue // an abstract category class (system, network...)
		}
		c, ok := s.cats[cat]
		if !ok && cat != "other" {
			return nil, fmt.Errorf("class %s: unknown category %q", name, cat)
		}
		cls := &Class{Object: *o, CategoryUID: c.UID, CategoryName: c.Caption, UID: c.UID*1000 + *uid}
		if prev, dup := s.Classes[cls.UID]; dup {
			return nil, fmt.Errorf("class uid %d: both %s and %s", cls.UID, prev.Name, name)
		}
		s.Classes[cls.UID] = cls
	}
	return s, nil
}

func (s *Schema) readJSON(p string, v any) error {
	b, err := fs.ReadFile(s.fsys, p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// Object is the compiled object of that name, or nil.
func (s *Schema) Object(name string) *Object { return s.objects[name] }

func (s *Schema) object(name string) (*Object, error) {
	if o, ok := s.objects[name]; ok {
		return o, nil
	}
	it, ok := s.rawObj[name]
	if !ok {
		return nil, fmt.Errorf("unknown object %q", name)
	}
	o, _, _, err := s.compile(it, s.rawObj, "object")
	if err != nil {
		return nil, err
	}
	s.objects[name] = o
	return o, nil
}

// compile resolves an item's extends chain and includes into merged raw
// attributes, then types each from the dictionary. It returns the
// category and uid found along the chain (for classes).
func (s *Schema) compile(it rawItem, all map[string]rawItem, kind string) (*Object, string, *int, error) {
	key := kind + ":" + it.Name
	if s.compiling[key] {
		return nil, "", nil, fmt.Errorf("%s %s extends itself", kind, it.Name)
	}
	s.compiling[key] = true
	defer delete(s.compiling, key)

	merged := map[string]rawAttr{}
	var atLeast, justOne []string
	cat, uid := it.Category, it.UID
	if it.Extends != "" {
		parent, ok := all[it.Extends]
		if !ok {
			return nil, "", nil, fmt.Errorf("%s %s extends unknown %q", kind, it.Name, it.Extends)
		}
		po, pcat, _, err := s.compile(parent, all, kind)
		if err != nil {
			return nil, "", nil, err
		}
		for n, a := range po.raw {
			merged[n] = copyRaw(a)
		}
		atLeast, justOne = po.AtLeastOne, po.JustOne
		if cat == "" {
			cat = pcat
		}
	}
	if inc, ok := it.Attributes["$include"]; ok {
		var paths []string
		if err := json.Unmarshal(inc, &paths); err != nil {
			var one string
			if err := json.Unmarshal(inc, &one); err != nil {
				return nil, "", nil, fmt.Errorf("%s: $include: %w", it.file, err)
			}
			paths = []string{one}
		}
		for _, p := range paths {
			var inc rawItem
			if err := s.readJSON(p, &inc); err != nil {
				return nil, "", nil, fmt.Errorf("%s: $include: %w", it.file, err)
			}
			for n, raw := range inc.Attributes {
				var a rawAttr
				if err := json.Unmarshal(raw, &a); err != nil {
					return nil, "", nil, fmt.Errorf("%s: %s: %w", p, n, err)
				}
				if _, set := a["profile"]; !set && inc.Meta == "profile" {
					a["profile"] = json.RawMessage(`"` + inc.Name + `"`)
				}
				merged[n] = mergeRaw(merged[n], a)
			}
		}
	}
	for n, raw := range it.Attributes {
		if n == "$include" {
			continue
		}
		var a rawAttr
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, "", nil, fmt.Errorf("%s: %s: %w", it.file, n, err)
		}
		merged[n] = mergeRaw(merged[n], a)
	}
	if len(it.Constraints.AtLeastOne) > 0 {
		atLeast = it.Constraints.AtLeastOne
	}
	if len(it.Constraints.JustOne) > 0 {
		justOne = it.Constraints.JustOne
	}
	o := &Object{Name: it.Name, Caption: it.Caption, Attrs: map[string]*Attr{}, AtLeastOne: atLeast, JustOne: justOne, raw: merged}
	for n, a := range merged {
		at, err := s.typeAttr(n, a)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%s: %w", it.file, err)
		}
		o.Attrs[n] = at
	}
	return o, cat, uid, nil
}

// typeAttr joins an attribute's merged fields with its dictionary entry.
func (s *Schema) typeAttr(name string, a rawAttr) (*Attr, error) {
	d, ok := s.dict[name]
	if !ok {
		return nil, fmt.Errorf("attribute %s is not in the dictionary", name)
	}
	full := mergeRaw(copyRaw(d), a)
	at := &Attr{Name: name, Enum: map[string]string{}}
	str := func(k string) string {
		var v string
		if raw, ok := full[k]; ok {
			_ = json.Unmarshal(raw, &v) // null or absent: ""
		}
		return v
	}
	at.Type, at.Requirement, at.Profile, at.Sibling = str("type"), str("requirement"), str("profile"), str("sibling")
	if raw, ok := full["is_array"]; ok {
		_ = json.Unmarshal(raw, &at.Array)
	}
	if raw, ok := full["enum"]; ok {
		var enum map[string]struct {
			Caption string `json:"caption"`
		}
		if err := json.Unmarshal(raw, &enum); err != nil {
			return nil, fmt.Errorf("attribute %s: enum: %w", name, err)
		}
		for k, v := range enum {
			at.Enum[k] = v.Caption
		}
	}
	if _, prim := s.types[at.Type]; !prim {
		if _, obj := s.rawObj[at.Type]; !obj {
			return nil, fmt.Errorf("attribute %s: unknown type %q", name, at.Type)
		}
	}
	return at, nil
}

// mergeRaw lays b's fields over a's; enums are merged value by value, as
// a class adds its activities to its parent's Unknown and Other.
func mergeRaw(a, b rawAttr) rawAttr {
	if a == nil {
		a = rawAttr{}
	}
	for k, v := range b {
		if k == "enum" {
			if old, ok := a[k]; ok {
				var m1, m2 map[string]json.RawMessage
				if json.Unmarshal(old, &m1) == nil && json.Unmarshal(v, &m2) == nil {
					for ek, ev := range m2 {
						m1[ek] = ev
					}
					v, _ = json.Marshal(m1)
				}
			}
		}
		a[k] = v
	}
	return a
}

func copyRaw(a rawAttr) rawAttr {
	c := make(rawAttr, len(a))
	for k, v := range a {
		c[k] = v
	}
	return c
}

// ClassByName finds a class by its name (file_activity...).
func (s *Schema) ClassByName(name string) *Class {
	for _, c := range s.Classes {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Required lists an object's required attributes, sorted.
func (o *Object) Required() []string {
	var out []string
	for n, a := range o.Attrs {
		if a.Requirement == "required" {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
