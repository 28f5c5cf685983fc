package policysync

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"agentbox.dev/agentbox/internal/kubeapi"
	"agentbox.dev/agentbox/internal/policy"
)

// adminFile is a node admin's own policy file, beside the snapshot.
const adminFile = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: baseline}
spec: {}
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: baseline-everyone}
spec: {role: baseline, subjects: [{namespace: "*"}]}
`

func role(name string, gen int64, spec string) Object {
	return Object{Kind: kubeapi.KindRole, Name: name, Generation: gen, Spec: []byte(spec)}
}

func binding(name string, gen int64, spec string) Object {
	return Object{Kind: kubeapi.KindRoleBinding, Name: name, Generation: gen, Spec: []byte(spec)}
}

func nodeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "baseline.yaml"), []byte(adminFile), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

var good = []Object{
	role("coder", 1, `{"inherits":"baseline","network":{"egress":"allowlist","allow":[{"host":"api.github.com","ports":[443]}]}}`),
	binding("coders", 2, `{"role":"coder","subjects":[{"namespace":"agents"}]}`),
}

// TestApplySwapsAValidSet: a valid set becomes the node's snapshot, loads
// with the node's own files as the shim loads the directory, and says what
// changed; the same set again changes nothing.
func TestApplySwapsAValidSet(t *testing.T) {
	dir := nodeDir(t)
	s := Render(good)
	out, err := Apply(dir, s)
	if err != nil || !out.Applied || out.OldDigest != "" || len(out.ObjectProblems)+len(out.NodeProblems) != 0 {
		t.Fatalf("first apply: %+v %v", out, err)
	}
	set, err := policy.LoadPaths(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Roles["coder"]; !ok || len(set.Bindings) != 2 {
		t.Fatalf("the directory does not hold the snapshot: roles %v, %d bindings", set.Roles, len(set.Bindings))
	}
	if strings.Join(out.Changes, ",") != "added AgentRole/coder (generation 1),added AgentRoleBinding/coders (generation 2)" {
		t.Errorf("changes: %v", out.Changes)
	}
	again, err := Apply(dir, Render(good))
	if err != nil || again.Applied || !again.Unchanged || again.OldDigest != s.Digest {
		t.Fatalf("same set again: %+v %v", again, err)
	}
	// An edit: a new generation, a binding removed.
	edited := Render([]Object{role("coder", 2, `{"inherits":"baseline","limits":{"memory":"256Mi"}}`)})
	out, err = Apply(dir, edited)
	if err != nil || !out.Applied || out.OldDigest != s.Digest {
		t.Fatalf("edit: %+v %v", out, err)
	}
	if strings.Join(out.Changes, ",") != "changed AgentRole/coder (generation 1 -> 2),removed AgentRoleBinding/coders" {
		t.Errorf("changes: %v", out.Changes)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

// TestApplyKeepsTheLastGoodSnapshot: a set the loader refuses is never
// written, and each problem is laid at the object it is in, with the
// file, line and field as `agentbox policy validate` prints them.
func TestApplyKeepsTheLastGoodSnapshot(t *testing.T) {
	dir := nodeDir(t)
	if out, err := Apply(dir, Render(good)); err != nil || !out.Applied {
		t.Fatalf("%+v %v", out, err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, FileName))
	bad := Render([]Object{
		role("coder", 3, `{"inherits":"baseline","limits":{"memory":"lots"}}`),
		binding("coders", 2, `{"role":"coder","subjects":[{"namespace":"agents"}]}`),
		binding("ghost", 1, `{"role":"nobody","subjects":[{"namespace":"x"}]}`),
		role("future", 1, `{"gpu":{"count":1}}`),
	})
	out, err := Apply(dir, bad)
	if err != nil || out.Applied || out.Unchanged {
		t.Fatalf("an invalid set must not apply: %+v %v", out, err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, FileName))
	if string(before) != string(after) {
		t.Fatal("the snapshot changed although the set was refused")
	}
	for key, want := range map[string]string{
		"AgentRole/coder":         FileName + ":",
		"AgentRoleBinding/ghost":  `spec.role: role "nobody" is not defined`,
		"AgentRole/future":        `spec: unknown field "gpu"`,
		"AgentRoleBinding/coders": "",
	} {
		got := strings.Join(out.ObjectProblems[key], "\n")
		if want == "" {
			if got != "" {
				t.Errorf("%s has no problem of its own, got %q", key, got)
			}
			continue
		}
		if !strings.Contains(got, want) {
			t.Errorf("%s: want %q in %q", key, want, got)
		}
	}
	if got := strings.Join(out.ObjectProblems["AgentRole/coder"], ""); !strings.Contains(got, "spec.limits.memory") {
		t.Errorf("coder's problem must name the field: %q", got)
	}
	// The shim, loading the directory, still sees the last good set.
	if _, err := policy.LoadPaths(dir); err != nil {
		t.Fatalf("the node's directory no longer loads: %v", err)
	}
	// A pod claiming a refused role is told why, by role.
	base := errors.New(`role "future" is not defined`)
	if err := policy.WithClusterRefusal(dir, "future", base); !errors.Is(err, base) || !strings.Contains(err.Error(), `AgentRole future was refused on this node: spec: unknown field "gpu"`) {
		t.Errorf("future: %v", err)
	}
	if err := policy.WithClusterRefusal(dir, "nobody", base); !strings.Contains(err.Error(), "AgentRoleBinding of nobody was refused") {
		t.Errorf("nobody: %v", err)
	}
	if err := policy.WithClusterRefusal(dir, "baseline", base); err != base { //nolint:errorlint // the very error, unwrapped
		t.Errorf("a role with nothing refused: %v", err)
	}
	// Once a valid set applies, the note goes.
	if out, err := Apply(dir, Render(good)); err != nil || !out.Unchanged {
		t.Fatalf("%+v %v", out, err)
	}
	if err := policy.WithClusterRefusal(dir, "future", base); err != base { //nolint:errorlint // the very error, unwrapped
		t.Errorf("the note outlived the refusal: %v", err)
	}
}

// TestApplyCrashMidWrite: an agent that dies after writing the new
// snapshot but before the rename leaves the old one in force, and its
// half-written file is hidden from the loader and removed next time.
func TestApplyCrashMidWrite(t *testing.T) {
	dir := nodeDir(t)
	if out, err := Apply(dir, Render(good)); err != nil || !out.Applied {
		t.Fatalf("%+v %v", out, err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, FileName))
	// A crash leaves a half-written temporary file behind.
	os.WriteFile(filepath.Join(dir, tempPrefix+"123"), []byte("apiVersion: agentbox.dev/v1\nkind: Ro"), 0o644)
	beforeRename = func() error { return errors.New("crash") }
	defer func() { beforeRename = func() error { return nil } }()
	if _, err := Apply(dir, Render([]Object{role("coder", 9, `{"inherits":"baseline"}`)})); err == nil {
		t.Fatal("the injected crash did not happen")
	}
	after, _ := os.ReadFile(filepath.Join(dir, FileName))
	if string(before) != string(after) {
		t.Fatal("a crash before the rename changed the snapshot")
	}
	if set, err := policy.LoadPaths(dir); err != nil || set.Roles["coder"] == nil {
		t.Fatalf("the directory must load the old snapshot: %v", err)
	}
	beforeRename = func() error { return nil }
	if out, err := Apply(dir, Render(good)); err != nil || !out.Unchanged {
		t.Fatalf("after the crash: %+v %v", out, err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".*")); len(leftovers) != 0 {
		t.Errorf("half-written files left: %v", leftovers)
	}
}

// TestApplyNodeFilesBroken: when the node admin's own files do not load,
// no snapshot is applied and the problem is the node's, not an object's.
func TestApplyNodeFilesBroken(t *testing.T) {
	dir := nodeDir(t)
	os.WriteFile(filepath.Join(dir, "typo.yaml"), []byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: x}\nspec: {limits: {memroy: 1Gi}}\n"), 0o644)
	out, err := Apply(dir, Render(good))
	if err != nil || out.Applied || len(out.NodeProblems) == 0 || !strings.Contains(out.NodeProblems[0], "typo.yaml") || len(out.ObjectProblems) != 0 {
		t.Fatalf("%+v %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName)); !os.IsNotExist(err) {
		t.Fatal("a snapshot was written although the node's files do not load")
	}
}

// TestRenderCollidesWithNodeFiles: an object named like one of the node's
// own roles is refused, naming both places.
func TestRenderCollidesWithNodeFiles(t *testing.T) {
	dir := nodeDir(t)
	out, err := Apply(dir, Render([]Object{role("baseline", 1, `{}`)}))
	if err != nil || out.Applied || !strings.Contains(strings.Join(out.ObjectProblems["AgentRole/baseline"], ""), "already defined") {
		t.Fatalf("%+v %v", out, err)
	}
}

func TestNodeStatus(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	s := Render(good)
	st := NodeStatus(kubeapi.NodeStatus{}, Outcome{Applied: true}, s, nil, t0)
	if st.Digest != s.Digest || len(st.Objects) != 2 || st.Conditions[0].Status != metav1.ConditionTrue || st.AppliedAt == nil {
		t.Fatalf("%+v", st)
	}
	refused := NodeStatus(st, Outcome{ObjectProblems: map[string][]string{"AgentRole/coder": {"f:1: spec: bad"}}}, Render(nil), map[string]int64{"AgentRole/coder": 7}, t0)
	if refused.Digest != s.Digest || len(refused.Objects) != 2 || refused.Conditions[0].Status != metav1.ConditionFalse ||
		!strings.Contains(refused.Conditions[0].Message, "AgentRole/coder: f:1: spec: bad") {
		t.Fatalf("a refused set must keep the enforced snapshot in the report: %+v", refused)
	}
	// The node reports the refused object at the generation it tried, for
	// the broker; the next good set clears it.
	if len(refused.Refused) != 1 || refused.Refused[0].ObjectRef != (kubeapi.ObjectRef{Kind: kubeapi.KindRole, Name: "coder", Generation: 7}) || refused.Refused[0].Problems[0] != "f:1: spec: bad" {
		t.Fatalf("refused objects: %+v", refused.Refused)
	}
	if again := NodeStatus(refused, Outcome{Applied: true}, s, nil, t0); len(again.Refused) != 0 {
		t.Fatalf("a good set keeps the refusals: %+v", again.Refused)
	}
}
