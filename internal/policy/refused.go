package policy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ClusterRefusedFile is where the node agent (`agentbox sync`) notes, in
// the policy directory, the cluster objects of the newest set it could not
// apply (hidden: the loader never reads it as policy).
const ClusterRefusedFile = ".agentbox-cluster-refused.json"

// ClusterRefusals are the loader's findings on the cluster's newest set,
// by role name: the role's own (Roles) and its bindings' (Bindings).
type ClusterRefusals struct {
	Roles    map[string][]string `json:"roles,omitempty"`
	Bindings map[string][]string `json:"bindings,omitempty"`
}

// WithClusterRefusal adds to err, a refusal of a container claiming role,
// why the cluster's object for that role (or a binding of it) is not in
// force on this node, when the node agent noted one. Without a note, err is
// returned as it is.
func WithClusterRefusal(dir, role string, err error) error {
	if err == nil || role == "" {
		return err
	}
	data, rerr := os.ReadFile(filepath.Join(dir, ClusterRefusedFile))
	if rerr != nil || len(data) > MaxFileSize {
		return err
	}
	var r ClusterRefusals
	if json.Unmarshal(data, &r) != nil {
		return err
	}
	var why []string
	if ps := r.Roles[role]; len(ps) > 0 {
		why = append(why, fmt.Sprintf("the cluster's AgentRole %s was refused on this node: %s", role, strings.Join(ps, "; ")))
	}
	if ps := r.Bindings[role]; len(ps) > 0 {
		why = append(why, fmt.Sprintf("a cluster AgentRoleBinding of %s was refused on this node: %s", role, strings.Join(ps, "; ")))
	}
	if len(why) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(why, "; "))
}
