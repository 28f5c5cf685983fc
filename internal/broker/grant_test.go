package broker

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
)

func ref(ns, name, key string) policy.SecretRef {
	return policy.SecretRef{Namespace: ns, Name: name, Key: key}
}

func injected(r policy.SecretRef) policy.Secret {
	return policy.Secret{SecretRef: &r, Inject: &policy.Inject{Host: "api.example", Header: "x-api-key"}}
}

func fromClaim(name string) policy.Secret {
	return policy.Secret{FromClaim: name, Inject: &policy.Inject{Host: "vendor.example", Header: "x-api-key"}}
}

// Cluster roles: coding-agent injects two keys; child inherits them;
// override names its own; fromnode inherits a node file's role; unbound
// is bound to nobody; warm-agent takes a claim's vendor key.
func testRoles() Roles {
	k1, k2, k3 := ref("agent-keys", "vendor", "a"), ref("agent-keys", "vendor", "b"), ref("other", "s", "k")
	return Roles{
		Roles: map[string]policy.RoleSpec{
			"coding-agent": {Inherits: "coder", Credentials: &policy.Credentials{Secrets: []policy.Secret{injected(k1), injected(k2)}}},
			"child":        {Inherits: "coding-agent"},
			"override":     {Inherits: "coding-agent", Credentials: &policy.Credentials{Secrets: []policy.Secret{injected(k3)}}},
			"fromnode":     {Inherits: "coder"},
			"unbound":      {Credentials: &policy.Credentials{Secrets: []policy.Secret{injected(k3)}}},
			"loop":         {Inherits: "loop"},
			"warm-agent":   {Credentials: &policy.Credentials{Secrets: []policy.Secret{fromClaim("vendor"), injected(k1)}}},
		},
		Bindings: []policy.RoleBindingSpec{
			{Role: "coding-agent", Subjects: []policy.Subject{{Namespace: "agents"}}},
			{Role: "child", Subjects: []policy.Subject{{Namespace: "agents"}}},
			{Role: "override", Subjects: []policy.Subject{{RuntimeHandler: "agentbox-coder"}}},
			{Role: "fromnode", Subjects: []policy.Subject{{Namespace: "*"}}},
			{Role: "loop", Subjects: []policy.Subject{{Namespace: "*"}}},
			{Role: "warm-agent", Subjects: []policy.Subject{{Namespace: "agents"}}},
		},
	}
}

func TestKeysFor(t *testing.T) {
	rs := testRoles()
	pod := func(name, node, role string) Pod {
		return Pod{Ref: Ref{Namespace: "agents", Name: name}, Node: node, Role: role, Handler: "agentbox"}
	}
	done := pod("done", "n1", "coding-agent")
	done.Done = true
	other := pod("other-ns", "n1", "coding-agent")
	other.Namespace = "elsewhere"
	coder := pod("coder", "n1", "override")
	coder.Handler = "agentbox-coder"
	endedW := pod("w", "n1", "warm-agent")
	endedW.Done = true
	for _, tc := range []struct {
		name string
		pods []Pod
		want string
	}{
		{"a pod on the node", []Pod{pod("a", "n1", "coding-agent")}, "agent-keys/vendor[a]:agents/a agent-keys/vendor[b]:agents/a"},
		{"a pod on another node", []Pod{pod("a", "n2", "coding-agent")}, ""},
		{"a pod not yet bound", []Pod{pod("a", "", "coding-agent")}, ""},
		{"an ended pod", []Pod{done}, ""},
		{"a namespace not bound", []Pod{other}, ""},
		{"inherited", []Pod{pod("c", "n1", "child")}, "agent-keys/vendor[a]:agents/c agent-keys/vendor[b]:agents/c"},
		{"its own list replaces", []Pod{coder}, "other/s[k]:agents/coder"},
		{"bound by handler, another handler", []Pod{pod("x", "n1", "override")}, ""},
		{"a node file's parent", []Pod{pod("f", "n1", "fromnode")}, ""},
		{"an unbound role", []Pod{pod("u", "n1", "unbound")}, ""},
		{"no role", []Pod{pod("n", "n1", "")}, ""},
		{"a role the cluster lacks", []Pod{pod("n", "n1", "baseline")}, ""},
		{"an inheritance loop", []Pod{pod("l", "n1", "loop")}, ""},
		{"two pods share a key", []Pod{pod("a", "n1", "coding-agent"), pod("c", "n1", "child")},
			"agent-keys/vendor[a]:agents/a,agents/c agent-keys/vendor[b]:agents/a,agents/c"},
		{"a claimed pod", []Pod{pod("w", "n1", "warm-agent"), pod("v", "n1", "warm-agent")}, "agent-keys/vendor[a]:agents/v,agents/w agents/task-keys[token]:agents/w"},
		{"a claimed pod that ended", []Pod{endedW}, ""},
	} {
		var got []string
		claimed := map[string][]control.ClaimKey{"agents/w": {{Name: "vendor", Secret: ref("agents", "task-keys", "token")}}}
		for _, g := range KeysFor("n1", tc.pods, rs, claimed) {
			got = append(got, g.Ref.String()+":"+strings.Join(g.Pods, ","))
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, s, tc.want)
		}
	}
	if g := KeysFor("", []Pod{pod("a", "", "coding-agent")}, rs, nil); len(g) != 0 {
		t.Errorf("no node name: %v", g)
	}
}

const uid = "6A1F0C2E-0000-4000-8000-000000000001"

func ownPod(node string) Pod {
	return Pod{Ref: Ref{Namespace: "agents", Name: "sb1", UID: "pod-uid"}, Node: node,
		RestoreFrom: "sb-" + strings.ToLower(uid) + "-100", ControllerKind: "Sandbox", ControllerGroup: SandboxGroup,
		ControllerName: "sb1", ControllerUID: uid}
}

func testSandbox() Sandbox {
	return Sandbox{Ref: Ref{Namespace: "agents", Name: "sb1", UID: uid}, PodName: "sb1", RestoreFrom: "sb-" + strings.ToLower(uid) + "-100"}
}

func TestMayUnwrap(t *testing.T) {
	cp := "sb-" + strings.ToLower(uid) + "-100"
	sb := testSandbox()
	for _, tc := range []struct {
		name string
		node string
		cp   string
		pod  func(*Pod)
		sb   func(*Sandbox)
		want string
	}{
		{"its own pod on the node", "n2", cp, nil, nil, ""},
		{"the pod is on another node", "n1", cp, nil, nil, "not \"n1\""},
		{"the pod is ending", "n2", cp, func(p *Pod) { p.Deleting = true }, nil, "being deleted"},
		{"the pod asks for another image", "n2", "sb-" + strings.ToLower(uid) + "-99", nil, nil, "asks to be restored"},
		{"another Sandbox's image", "n2", "sb-0000-100", func(p *Pod) { p.RestoreFrom = "sb-0000-100" }, nil, "not a suspend image"},
		{"a pod claiming the Sandbox by name", "n2", cp, func(p *Pod) { p.ControllerUID = "other" }, nil, "not Sandbox"},
		{"a pod the Sandbox does not name", "n2", cp, func(p *Pod) { p.Name = "impostor" }, nil, "not Sandbox"},
		{"a Sandbox made again", "n2", cp, nil, func(s *Sandbox) { s.UID = "new-uid" }, "not Sandbox"},
		{"a name that is not a suspend's", "n2", "mycp", func(p *Pod) { p.RestoreFrom = "mycp" }, nil, "not a suspend image"},
	} {
		p, s := ownPod("n2"), sb
		if tc.pod != nil {
			tc.pod(&p)
		}
		if tc.sb != nil {
			tc.sb(&s)
		}
		err := MayUnwrap(tc.node, tc.cp, p, &s)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := MayUnwrap("n2", cp, Pod{Ref: Ref{Name: "bare"}, Node: "n2", RestoreFrom: cp}, nil); err == nil {
		t.Error("a pod of no Sandbox: unwrapped")
	}
}

func TestSandboxPatch(t *testing.T) {
	cp := "sb-" + strings.ToLower(uid) + "-200"
	suspending := ownPod("n1")
	// The controller deletes it, and the suspend has stopped it.
	suspending.Deleting, suspending.Done = true, true
	w := SandboxWrite{Op: OpSuspended, Sandbox: testSandbox().Ref, Checkpoint: cp}
	for _, tc := range []struct {
		name string
		node string
		w    func(*SandboxWrite)
		sb   func(*Sandbox)
		pods []Pod
		want string // the patch, or the error's words after "!"
	}{
		{"annotate its own Sandbox", "n1", nil, nil, []Pod{suspending},
			`{"spec":{"podTemplate":{"metadata":{"annotations":{"agentbox.dev/restore-from":"` + cp + `"}}}}}`},
		{"pin its own Sandbox", "n1", func(w *SandboxWrite) { w.Pin = true }, nil, []Pod{suspending},
			`{"metadata":{"annotations":{"agentbox.dev/pinned-to":"host-n1"}},"spec":{"podTemplate":{"metadata":{"annotations":{"agentbox.dev/restore-from":"` + cp + `"}},"spec":{"nodeSelector":{"kubernetes.io/hostname":"host-n1"}}}}}`},
		{"a template that selects a host already is not pinned", "n1", func(w *SandboxWrite) { w.Pin = true }, func(s *Sandbox) { s.Selector = "chosen" }, []Pod{suspending},
			`{"spec":{"podTemplate":{"metadata":{"annotations":{"agentbox.dev/restore-from":"` + cp + `"}}}}}`},
		{"another node's Sandbox", "n2", nil, nil, []Pod{suspending}, "!no pod of Sandbox"},
		{"a pod of it listed on another node", "n2", nil, nil, []Pod{ownPod("n1")}, "!no pod of Sandbox"},
		{"another Sandbox's image", "n1", func(w *SandboxWrite) { w.Checkpoint = "sb-0000-1" }, nil, []Pod{suspending}, "!not a suspend image"},
		{"a stale UID", "n1", func(w *SandboxWrite) { w.Sandbox.UID = "old" }, nil, []Pod{suspending}, "!has uid"},
		{"an impostor pod", "n1", nil, nil, []Pod{func() Pod { p := ownPod("n1"); p.Name = "x"; return p }()}, "!no pod of Sandbox"},
		{"an unknown op", "n1", func(w *SandboxWrite) { w.Op = "rewrite" }, nil, []Pod{suspending}, "!none of"},
		{"resumed on its node", "n1", func(w *SandboxWrite) { w.Op = OpResumed; w.Checkpoint = testSandbox().RestoreFrom }, func(s *Sandbox) { s.PinnedTo, s.Selector = "host-n1", "host-n1" },
			[]Pod{ownPod("n1")},
			`{"metadata":{"annotations":{"agentbox.dev/pinned-to":null}},"spec":{"podTemplate":{"metadata":{"annotations":{"agentbox.dev/restore-from":null}},"spec":{"nodeSelector":{"kubernetes.io/hostname":null}}}}}`},
		{"resumed, a selector that is not the pin stays", "n1", func(w *SandboxWrite) { w.Op = OpResumed; w.Checkpoint = testSandbox().RestoreFrom }, func(s *Sandbox) { s.PinnedTo, s.Selector = "host-n1", "chosen" },
			[]Pod{ownPod("n1")},
			`{"spec":{"podTemplate":{"metadata":{"annotations":{"agentbox.dev/restore-from":null}}}}}`},
		{"resumed, but the pod was not restored from it", "n1", func(w *SandboxWrite) { w.Op = OpResumed }, nil, []Pod{ownPod("n1")}, "!was not restored"},
		{"a fork's copy resumed from its fork image", "n1", func(w *SandboxWrite) { w.Op = OpResumed; w.Checkpoint = "fork-0000-9" },
			func(s *Sandbox) { s.ForkOf, s.RestoreFrom = "fork-0000-9", "fork-0000-9" },
			[]Pod{func() Pod { p := ownPod("n1"); p.RestoreFrom = "fork-0000-9"; return p }()},
			`{"spec":{"podTemplate":{"metadata":{"annotations":{"agentbox.dev/restore-from":null}}}}}`},
		{"another fork's image", "n1", func(w *SandboxWrite) { w.Op = OpResumed; w.Checkpoint = "fork-0000-9" },
			func(s *Sandbox) { s.ForkOf, s.RestoreFrom = "fork-0000-8", "fork-0000-9" },
			[]Pod{func() Pod { p := ownPod("n1"); p.RestoreFrom = "fork-0000-9"; return p }()}, "!not a suspend image"},
		{"a fork image names no suspend", "n1", func(w *SandboxWrite) { w.Checkpoint = "fork-0000-9" }, func(s *Sandbox) { s.ForkOf = "fork-0000-9" }, []Pod{suspending}, "!not a suspend image"},
	} {
		ww, sb := w, testSandbox()
		if tc.w != nil {
			tc.w(&ww)
		}
		if tc.sb != nil {
			tc.sb(&sb)
		}
		patch, err := SandboxPatch(tc.node, "host-"+tc.node, ww, sb, tc.pods, false)
		if msg, isErr := strings.CutPrefix(tc.want, "!"); isErr {
			if err == nil || !strings.Contains(err.Error(), msg) {
				t.Errorf("%s: %s, %v; want an error with %q", tc.name, patch, err, msg)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var a, b any
		json.Unmarshal(patch, &a)
		json.Unmarshal([]byte(tc.want), &b)
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, ja, jb)
		}
	}
}

func TestDecodeRefusesUnknownFields(t *testing.T) {
	if _, err := DecodeRole([]byte(`{"inherits":"coder","credentialz":{}}`)); err == nil {
		t.Error("a role with an unknown field decoded")
	}
	if _, err := DecodeBinding([]byte(`{"role":"r","subjects":[{"namespace":"a","serviceAccount":"x"}]}`)); err == nil {
		t.Error("a binding with an unknown field decoded")
	}
}

// A suspend's ticket: issued while the Sandbox's own pod is bound to the
// node, it lets the suspended write through once the pod is gone, for that
// node, Sandbox and checkpoint alone, until it expires.
func TestSuspendTicket(t *testing.T) {
	tk, err := NewTickets()
	if err != nil {
		t.Fatal(err)
	}
	sb := testSandbox()
	cp := "sb-" + strings.ToLower(uid) + "-300"
	w := SandboxWrite{Op: OpSuspending, Sandbox: sb.Ref, Checkpoint: cp}
	if patch, err := SandboxPatch("n1", "h", w, sb, []Pod{ownPod("n1")}, false); err != nil || patch != nil {
		t.Fatalf("suspending, its pod bound here: %s %v", patch, err)
	}
	if _, err := SandboxPatch("n2", "h", w, sb, []Pod{ownPod("n1")}, false); err == nil {
		t.Fatal("suspending on another node's Sandbox: no error")
	}
	now := time.Now()
	ticket := tk.Issue("n1", w, now)
	done := w
	done.Op = OpSuspended
	for _, tc := range []struct {
		name   string
		node   string
		mutate func(*SandboxWrite)
		at     time.Time
		ok     bool
	}{
		{"its own, in time", "n1", nil, now.Add(time.Minute), true},
		{"another node", "n2", nil, now.Add(time.Minute), false},
		{"another checkpoint", "n1", func(w *SandboxWrite) { w.Checkpoint = "sb-" + strings.ToLower(uid) + "-301" }, now, false},
		{"another Sandbox", "n1", func(w *SandboxWrite) { w.Sandbox.Name = "other" }, now, false},
		{"expired", "n1", nil, now.Add(TicketTTL + time.Minute), false},
	} {
		ww := done
		if tc.mutate != nil {
			tc.mutate(&ww)
		}
		if got := tk.Valid(tc.node, ticket, ww, tc.at); got != tc.ok {
			t.Errorf("%s: valid %v, want %v", tc.name, got, tc.ok)
		}
	}
	other, _ := NewTickets()
	if other.Valid("n1", ticket, done, now) || tk.Valid("n1", "garbage", done, now) || (*Tickets)(nil).Valid("n1", ticket, done, now) {
		t.Error("a ticket of another key, a malformed one, or no key: valid")
	}
	// The pod gone: the write goes through with the ticket alone, and only
	// as suspended.
	if patch, err := SandboxPatch("n1", "h", done, sb, nil, true); err != nil || !strings.Contains(string(patch), cp) {
		t.Fatalf("suspended with a ticket, the pod gone: %s %v", patch, err)
	}
	if _, err := SandboxPatch("n1", "h", done, sb, nil, false); err == nil {
		t.Fatal("suspended without a ticket, the pod gone: no error")
	}
	resumed := done
	resumed.Op = OpResumed
	if _, err := SandboxPatch("n1", "h", resumed, sb, nil, true); err == nil {
		t.Fatal("a ticket let a resumed write through")
	}
}
