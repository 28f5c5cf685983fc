package config

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/golden"
)

var update = flag.Bool("update", false, "rewrite docs/reference/shim-config-keys.md")

// keyDoc is a config key: its TOML path, Go type, default and comment.
type keyDoc struct {
	path, typ, def, doc string
}

// fieldDocs reads each struct field's comment from the package's source.
func fieldDocs(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return true
		}
		for _, fl := range st.Fields.List {
			for _, name := range fl.Names {
				docs[ts.Name.Name+"."+name.Name] = strings.Join(strings.Fields(fl.Doc.Text()), " ")
			}
		}
		return true
	})
	return docs
}

// keys walks a config type by its TOML tags.
func keys(prefix string, t reflect.Type, v reflect.Value, docs map[string]string, out *[]keyDoc) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		path := tag
		if prefix != "" {
			path = prefix + "." + tag
		}
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct {
			keys(path, f.Type, fv, docs, out)
			continue
		}
		def := ""
		if !fv.IsZero() && !(fv.Kind() == reflect.Map && fv.Len() == 0) {
			def = fmt.Sprintf("`%v`", fv.Interface())
		}
		*out = append(*out, keyDoc{path, f.Type.String(), def, docs[t.Name()+"."+f.Name]})
	}
}

// TestShimConfigReference: docs/reference/shim-config-keys.md is every key
// of the shim config, from its Go types and their comments, with the
// built-in defaults; and the shipped config file names every key.
func TestShimConfigReference(t *testing.T) {
	var ks []keyDoc
	keys("", reflect.TypeOf(Config{}), reflect.ValueOf(*Default()), fieldDocs(t), &ks)
	sort.SliceStable(ks, func(i, j int) bool { return ks[i].path < ks[j].path })
	var b strings.Builder
	b.WriteString("<!-- Generated from internal/config's types: go test ./internal/config -run TestShimConfigReference -update. Do not edit. -->\n\n")
	b.WriteString("# Shim configuration keys\n\nEvery key of the shim's TOML config, with its built-in default (blank: empty or zero).\n")
	b.WriteString("How the file is found, and what refuses it: [shim-config.md](shim-config.md). A commented file:\n")
	b.WriteString("[runsc-config/config.toml](../../runsc-config/config.toml).\n\n| key | type | default | what |\n| --- | --- | --- | --- |\n")
	shipped, err := os.ReadFile("../../runsc-config/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		if k.doc == "" {
			t.Errorf("%s has no comment in config.go", k.path)
		}
		section, key := "", k.path
		if i := strings.LastIndex(k.path, "."); i >= 0 {
			section, key = k.path[:i], k.path[i+1:]
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.path, k.typ, strings.ReplaceAll(k.def, "|", "\\|"), strings.ReplaceAll(k.doc, "|", "\\|"))
		if !strings.Contains(string(shipped), key) || section != "" && !strings.Contains(string(shipped), "["+section+"]") && !strings.Contains(string(shipped), "["+section+".") {
			t.Errorf("runsc-config/config.toml does not document %s", k.path)
		}
	}
	page := b.String()
	golden.Check(t, "../../docs/reference/shim-config-keys.md", page, *update, "go test ./internal/config -run TestShimConfigReference -update")
}
