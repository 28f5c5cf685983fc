package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds one policy file.
const MaxFileSize = 1 << 20

// Problem is one thing wrong with a policy, located by file, line and field
// path.
type Problem struct {
	File string
	Line int
	Path string
	Msg  string
}

func (p Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	if p.Path != "" {
		b.WriteString(": " + p.Path)
	}
	b.WriteString(": " + p.Msg)
	return b.String()
}

// Set is a loaded, validated set of roles and bindings.
type Set struct {
	Roles    map[string]*Role
	Bindings []*RoleBinding
	// Files are the files the set was loaded from, in load order.
	Files []string
}

// PolicyFileName reports whether a directory entry is a policy file: a
// name ending in .yaml or .yml that is not hidden or an editor's artifact
// (a leading "." or "#", a trailing "~": .#x.yaml lock files, backups,
// Kubernetes' ..data links in a mounted ConfigMap). Symlinks among them are
// followed; a dangling one is an error, not a skip.
func PolicyFileName(name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "#") || strings.HasSuffix(name, "~") {
		return false
	}
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// LoadPaths loads every policy file (PolicyFileName) named, or found
// directly in a named directory, as one set. All problems in all files are reported
// together; a set with any problem is not returned.
func LoadPaths(paths ...string) (*Set, error) {
	return readInput(paths...).load()
}

// input is what a load parses: the policy files named by its paths, in
// order, with their bytes as read, and what could not be read.
type input struct {
	files    []string
	data     [][]byte
	problems []error
}

// readInput lists and reads the policy files of paths. What is parsed, and
// what a stored set is keyed by, is these bytes: never a second read.
func readInput(paths ...string) *input {
	in := &input{}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			in.problems = append(in.problems, Problem{File: p, Msg: errMsg(err)})
			continue
		}
		if !st.IsDir() {
			in.files = append(in.files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			in.problems = append(in.problems, Problem{File: p, Msg: errMsg(err)})
			continue
		}
		n := 0
		for _, e := range entries {
			if !e.IsDir() && PolicyFileName(e.Name()) {
				in.files = append(in.files, filepath.Join(p, e.Name()))
				n++
			}
		}
		if n == 0 {
			in.problems = append(in.problems, Problem{File: p, Msg: "policy directory holds no *.yaml or *.yml file"})
		}
	}
	sort.Strings(in.files)
	in.data = make([][]byte, len(in.files))
	for i, f := range in.files {
		data, err := readLimited(f)
		if err != nil {
			in.problems = append(in.problems, Problem{File: f, Msg: errMsg(err)})
			continue
		}
		in.data[i] = data
	}
	return in
}

// load parses, checks and assembles the input's files as one set.
func (in *input) load() (*Set, error) {
	problems := in.problems
	var docs []parsed
	for _, r := range parseFiles(in.files, in.data) {
		docs = append(docs, r.docs...)
		problems = append(problems, r.problems...)
	}
	set, errs := assemble(docs)
	problems = append(problems, errs...)
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	set.Files = in.files
	return set, nil
}

// fileResult is one file's objects and problems.
type fileResult struct {
	docs     []parsed
	problems []error
}

// parseFiles parses each file's bytes (nil: it could not be read, and that
// problem is the input's), on as many cores as there are (the files are
// independent until assemble), and gives their results in the files'
// order.
func parseFiles(files []string, data [][]byte) []fileResult {
	out := make([]fileResult, len(files))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := min(runtime.GOMAXPROCS(0), len(files)); w > 0; w-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if data[i] != nil {
					out[i].docs, out[i].problems = parseFile(files[i], data[i])
				}
			}
		}()
	}
	for i := range files {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// Parse loads one file's content as a set on its own.
func Parse(name string, data []byte) (*Set, error) {
	docs, problems := parseFile(name, data)
	set, errs := assemble(docs)
	if problems = append(problems, errs...); len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	set.Files = []string{name}
	return set, nil
}

func errMsg(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileSize)
	}
	return data, nil
}

// parsed is one decoded object with the lines of its fields.
type parsed struct {
	role    *Role
	binding *RoleBinding
	file    string
	lines   lineIndex
}

// lineIndex maps a field path ("spec.limits.memory") to its line.
type lineIndex map[string]int

// lineOf returns the line of path, or of its nearest ancestor.
func (l lineIndex) lineOf(path string) int {
	for p := path; ; {
		if n, ok := l[p]; ok {
			return n
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			return l[""]
		}
		p = p[:i]
	}
}

func parseFile(file string, data []byte) ([]parsed, []error) {
	var out []parsed
	var problems []error
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			problems = append(problems, yamlProblem(file, err))
			break // the decoder cannot resume after a syntax error
		}
		if len(doc.Content) == 0 {
			continue
		}
		root := doc.Content[0]
		if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
			continue // an empty document between separators
		}
		p, errs := parseObject(file, root)
		problems = append(problems, errs...)
		if p != nil {
			out = append(out, *p)
		}
	}
	return out, problems
}

func yamlProblem(file string, err error) Problem {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var line int
	if n, _ := fmt.Sscanf(msg, "line %d:", &line); n == 1 {
		msg = strings.TrimSpace(msg[strings.Index(msg, ":")+1:])
	}
	return Problem{File: file, Line: line, Msg: msg}
}

func parseObject(file string, root *yaml.Node) (*parsed, []error) {
	if root.Kind != yaml.MappingNode {
		return nil, []error{Problem{File: file, Line: root.Line, Msg: "a policy object must be a mapping with apiVersion, kind, metadata and spec"}}
	}
	var h header
	kindLine := root.Line
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "kind" {
			h.Kind = root.Content[i+1].Value
			kindLine = root.Content[i+1].Line
		}
	}
	p := &parsed{file: file, lines: lineIndex{"": root.Line}}
	var target any
	// AgentRole and AgentRoleBinding are the cluster's names for them
	// (the CRDs, which agentbox sync writes to nodes as Role and
	// RoleBinding): a file meant for kubectl validates as it is.
	switch h.Kind {
	case KindRole, "AgentRole":
		p.role = &Role{}
		target = p.role
	case KindRoleBinding, "AgentRoleBinding":
		p.binding = &RoleBinding{}
		target = p.binding
	case "":
		return nil, []error{Problem{File: file, Line: root.Line, Path: "kind", Msg: "missing; want Role or RoleBinding"}}
	default:
		return nil, []error{Problem{File: file, Line: kindLine, Path: "kind", Msg: fmt.Sprintf("%q is not Role or RoleBinding (or the cluster's AgentRole, AgentRoleBinding)", h.Kind)}}
	}
	var problems []error
	checkFields(file, root, reflect.TypeOf(target).Elem(), "", p.lines, &problems)
	if len(problems) > 0 {
		return nil, problems
	}
	if err := root.Decode(target); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			for _, e := range te.Errors {
				problems = append(problems, yamlProblem(file, errors.New(e)))
			}
		} else {
			problems = append(problems, yamlProblem(file, err))
		}
		return nil, problems
	}
	src := fmt.Sprintf("%s:%d", file, root.Line)
	var fe []fieldError
	if p.role != nil {
		p.role.Source = src
		fe = validateRole(p.role)
	} else {
		p.binding.Source = src
		fe = validateBinding(p.binding)
	}
	for _, e := range fe {
		problems = append(problems, Problem{File: file, Line: p.lines.lineOf(e.path), Path: e.path, Msg: e.msg})
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return p, nil
}

// checkFields walks node against Go type t, reporting unknown and duplicate
// keys with their lines, and records the line of every field path.
func checkFields(file string, n *yaml.Node, t reflect.Type, path string, lines lineIndex, problems *[]error) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	lines[path] = n.Line
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // the decoder reports the type mismatch
		}
		fields := yamlFields(t)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			fp := joinPath(path, k.Value)
			if seen[k.Value] {
				*problems = append(*problems, Problem{File: file, Line: k.Line, Path: fp, Msg: "duplicate field"})
				continue
			}
			seen[k.Value] = true
			ft, ok := fields[k.Value]
			if !ok {
				*problems = append(*problems, Problem{File: file, Line: k.Line, Path: fp, Msg: fmt.Sprintf("unknown field (known: %s)", strings.Join(sortedNames(fields), ", "))})
				continue
			}
			lines[fp] = k.Line
			checkFields(file, v, ft, fp, lines, problems)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, item := range n.Content {
			checkFields(file, item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), lines, problems)
		}
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func yamlFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldsOf.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := fieldsByTag(t)
	fieldsOf.Store(t, m)
	return m
}

// fieldsOf memoizes fieldsByTag by type: checkFields asks it for every
// mapping of every policy object, and each shim process loads the whole
// directory (read only once made).
var fieldsOf sync.Map

func fieldsByTag(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		m[tag] = f.Type
	}
	return m
}

func sortedNames(m map[string]reflect.Type) []string {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// assemble checks what spans objects: unique names, bindings that name
// roles, parents that exist, no inheritance cycles, and that every role
// compiles once its parents are applied.
func assemble(docs []parsed) (*Set, []error) {
	set := &Set{Roles: map[string]*Role{}}
	var problems []error
	at := func(d parsed, path, msg string) {
		problems = append(problems, Problem{File: d.file, Line: d.lines.lineOf(path), Path: path, Msg: msg})
	}
	bindingNames := map[string]string{}
	for _, d := range docs {
		switch {
		case d.role != nil:
			if prev, ok := set.Roles[d.role.Metadata.Name]; ok {
				at(d, "metadata.name", fmt.Sprintf("role %q is already defined at %s", d.role.Metadata.Name, prev.Source))
				continue
			}
			set.Roles[d.role.Metadata.Name] = d.role
		case d.binding != nil:
			if prev, ok := bindingNames[d.binding.Metadata.Name]; ok {
				at(d, "metadata.name", fmt.Sprintf("role binding %q is already defined at %s", d.binding.Metadata.Name, prev))
				continue
			}
			bindingNames[d.binding.Metadata.Name] = d.binding.Source
			set.Bindings = append(set.Bindings, d.binding)
		}
	}
	for _, d := range docs {
		switch {
		case d.binding != nil:
			if _, ok := set.Roles[d.binding.Spec.Role]; !ok {
				at(d, "spec.role", fmt.Sprintf("role %q is not defined", d.binding.Spec.Role))
			}
		case d.role != nil && set.Roles[d.role.Metadata.Name] == d.role:
			if p := d.role.Spec.Inherits; p != "" {
				if _, ok := set.Roles[p]; !ok {
					at(d, "spec.inherits", fmt.Sprintf("parent role %q is not defined", p))
					continue
				}
			}
			spec, err := set.resolve(d.role.Metadata.Name)
			if err != nil {
				at(d, "spec.inherits", err.Error())
				continue
			}
			// What Profile would refuse; not its digest, which only a
			// role a pod selects needs.
			if _, err := compileSpec(spec); err != nil {
				for _, e := range Errors(err) {
					var fe fieldError
					if errors.As(e, &fe) {
						at(d, "spec."+fe.path, fe.msg+" (after inheritance)")
					} else {
						at(d, "spec", e.Error())
					}
				}
			}
		}
	}
	return set, problems
}

// Errors lists the problems in an error returned by this package: the
// errors joined in it, recursively, or the error itself.
func Errors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Errors(e)...)
		}
		return out
	}
	return []error{err}
}
