// Package policysync is the node agent's core (`agentbox sync`): it turns
// the cluster's AgentRole and AgentRoleBinding objects into one policy
// file, validates it with the shim's own loader together with the node's
// other policy files, and swaps it in atomically, or keeps the last good
// one and says why. The pure parts (rendering, validation, status
// shaping) are here; watch.go holds the Kubernetes side.
package policysync

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"agentbox.dev/agentbox/internal/kubeapi"
	"agentbox.dev/agentbox/internal/policy"
)

// FileName is the snapshot's file in the node's policy directory. The
// agent owns it; every other file there is the node admin's.
const FileName = "agentbox-cluster.yaml"

// Object is a role or binding as the API server holds it.
type Object struct {
	Kind       string // kubeapi.KindRole or kubeapi.KindRoleBinding
	Name       string
	Generation int64
	// Spec is the object's spec as JSON.
	Spec json.RawMessage
}

// Key names an object.
func (o Object) Key() string { return o.Kind + "/" + o.Name }

// Snapshot is the cluster's objects rendered as one policy file.
type Snapshot struct {
	Data    []byte
	Digest  string
	Objects []kubeapi.ObjectRef
	// spans are the lines of each object's document in Data.
	spans []span
	// Invalid are objects that could not be rendered (a field the loader
	// does not know), by key: they are left out and refuse the snapshot.
	Invalid map[string]string
	// roleOf is the role each object is about: a role's own name, a
	// binding's spec.role.
	roleOf map[string]string
}

type span struct {
	key         string
	first, last int
}

// Render writes the objects, sorted by kind and name, as one policy file.
// A spec with a field the policy types do not have is not rendered: it is
// reported in Invalid, since skipping the field could loosen a role.
func Render(objs []Object) *Snapshot {
	sorted := append([]Object(nil), objs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Key() < sorted[j].Key() })
	var b bytes.Buffer
	b.WriteString("# Written by agentbox sync from the cluster's AgentRole and AgentRoleBinding\n# objects: do not edit (the next change replaces it).\n")
	line := 3
	s := &Snapshot{Invalid: map[string]string{}, Objects: []kubeapi.ObjectRef{}, roleOf: map[string]string{}}
	for _, o := range sorted {
		doc, role, err := renderObject(o)
		s.roleOf[o.Key()] = role
		if err != nil {
			s.Invalid[o.Key()] = err.Error()
			continue
		}
		s.spans = append(s.spans, span{key: o.Key(), first: line, last: line + strings.Count(doc, "\n") - 1})
		b.WriteString(doc)
		line += strings.Count(doc, "\n")
		s.Objects = append(s.Objects, kubeapi.ObjectRef{Kind: o.Kind, Name: o.Name, Generation: o.Generation})
	}
	s.Data = b.Bytes()
	s.Digest = digest(s.Data)
	return s
}

// digest names a snapshot's content, as the node reports it.
func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// renderObject writes one object as a policy document, and says which
// role it is about.
func renderObject(o Object) (string, string, error) {
	var kind, role string
	var spec any
	switch o.Kind {
	case kubeapi.KindRole:
		kind, role, spec = policy.KindRole, o.Name, &policy.RoleSpec{}
	case kubeapi.KindRoleBinding:
		kind, spec = policy.KindRoleBinding, &policy.RoleBindingSpec{}
	default:
		return "", "", fmt.Errorf("kind %q is not %s or %s", o.Kind, kubeapi.KindRole, kubeapi.KindRoleBinding)
	}
	dec := json.NewDecoder(bytes.NewReader(o.Spec))
	dec.DisallowUnknownFields()
	if err := dec.Decode(spec); err != nil {
		return "", role, fmt.Errorf("spec: %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	if b, ok := spec.(*policy.RoleBindingSpec); ok {
		role = b.Role
	}
	body, err := yaml.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return "", role, err
	}
	return fmt.Sprintf("---\n# %s %s generation %d\napiVersion: %s\nkind: %s\nmetadata:\n  name: %s\n%s",
		o.Kind, o.Name, o.Generation, policy.APIVersion, kind, o.Name, body), role, nil
}

// objectAt returns the key of the object whose document holds line.
func (s *Snapshot) objectAt(line int) string {
	for _, sp := range s.spans {
		if line >= sp.first && line <= sp.last {
			return sp.key
		}
	}
	return ""
}
