package broker

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"agentbox.dev/agentbox/internal/control"
)

func TestIdentityOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want Identity
		err  string
	}{
		{"none", nil, Identity{}, ""},
		{"others' annotations are not ours", map[string]string{"team.example/owner": "x", "kubectl.kubernetes.io/last-applied-configuration": "{}"}, Identity{}, ""},
		{"all three", map[string]string{SubjectAnnotation: "alice@example.com", TenantAnnotation: "acme", TaskAnnotation: "T-42 fix the build"},
			Identity{Subject: "alice@example.com", Tenant: "acme", Task: "T-42 fix the build"}, ""},
		{"one", map[string]string{TaskAnnotation: "t1"}, Identity{Task: "t1"}, ""},
		{"unknown agentbox annotation", map[string]string{TaskAnnotation: "t1", "agentbox.dev/restore-from": "x"}, Identity{}, "agentbox.dev/restore-from: not understood"},
		{"a role", map[string]string{TaskAnnotation: "t1", "agentbox.dev/role": "task-reader"}, Identity{Task: "t1", Role: "task-reader"}, ""},
		{"a role's name", map[string]string{"agentbox.dev/role": "../admin"}, Identity{}, `"../admin" is not a role's name`},
		{"a typo", map[string]string{"agentbox.dev/tenat": "acme"}, Identity{}, "agentbox.dev/tenat: not understood"},
		{"empty", map[string]string{SubjectAnnotation: ""}, Identity{}, "agentbox.dev/subject: empty"},
		{"too long", map[string]string{TenantAnnotation: strings.Repeat("a", control.MaxClaimValue+1)}, Identity{}, "more than 256"},
		{"a newline forges a line", map[string]string{SubjectAnnotation: "alice\nrole: admin"}, Identity{}, "not printable (U+000A)"},
		{"an escape", map[string]string{TaskAnnotation: "t\x1b[31m"}, Identity{}, "not printable"},
		{"not UTF-8", map[string]string{TaskAnnotation: "t\xff"}, Identity{}, "not UTF-8"},
		{"a key", map[string]string{KeyAnnotationPrefix + "vendor": "task-keys/token", TaskAnnotation: "t1"},
			Identity{Task: "t1", Keys: []control.ClaimKey{{Name: "vendor", Secret: ref("agents", "task-keys", "token")}}}, ""},
		{"a key of another namespace", map[string]string{KeyAnnotationPrefix + "vendor": "other/task-keys/token"}, Identity{}, `"task-keys/token" is not a Secret's key`},
		{"a key with no Secret", map[string]string{KeyAnnotationPrefix + "vendor": "token"}, Identity{}, `"token" is not SECRET/KEY`},
		{"a key's name", map[string]string{KeyAnnotationPrefix + "Vendor_1": "s/k"}, Identity{}, `"Vendor_1" is not a claim key's name`},
		{"a key's path", map[string]string{KeyAnnotationPrefix + "vendor": "../k"}, Identity{}, `".." is not a Secret's name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := IdentityOf("agents", tc.ann)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "nothing of the claim is bound") {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if !got.Equal(&Identity{}) || got.Keys != nil {
					t.Fatalf("a refused identity is half bound: %+v", got)
				}
				return
			}
			if err != nil || !got.Equal(&tc.want) {
				t.Fatalf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

func claimedSandbox() Sandbox {
	sb := testSandbox()
	sb.ControllerKind, sb.ControllerGroup, sb.ControllerName, sb.ControllerUID = "SandboxClaim", SandboxExtensionsGroup, "task-1", "claim-uid"
	return sb
}

func testClaim() Claim {
	return Claim{Ref: Ref{Namespace: "agents", Name: "task-1", UID: "claim-uid"}, Annotations: map[string]string{TaskAnnotation: "t1", TenantAnnotation: "acme"}}
}

func giveKey(name string) func(*Claim) {
	return func(c *Claim) { c.Annotations[KeyAnnotationPrefix+name] = "task-keys/token" }
}

func TestClaimOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		node  string
		req   func(*Ref)
		pod   func(*Pod)
		sb    func(*Sandbox)
		claim func(*Claim)
		err   string
		keys  int
	}{
		{name: "its own node", node: "n2"},
		{name: "another node", node: "n1", err: `bound to node "n2", not n1`},
		{name: "no node", node: "", err: "bound to node"},
		{name: "a stale pod uid", node: "n2", req: func(r *Ref) { r.UID = "old" }, err: "has uid pod-uid, not old"},
		{name: "not the Sandbox's pod", node: "n2", pod: func(p *Pod) { p.ControllerUID = "other" }, err: "not Sandbox agents/sb1's own"},
		{name: "warm", node: "n2", sb: func(s *Sandbox) { s.ControllerKind, s.ControllerName = "SandboxWarmPool", "agents" }, err: "not held by a SandboxClaim"},
		{name: "a claim of another group", node: "n2", sb: func(s *Sandbox) { s.ControllerGroup = "evil.example" }, err: "not held by a SandboxClaim"},
		{name: "a claim of that name, recreated", node: "n2", claim: func(c *Claim) { c.UID = "new" }, err: "not agents/task-1 (uid new)"},
		{name: "an identity not understood", node: "n2", claim: func(c *Claim) { c.Annotations["agentbox.dev/secrets"] = "x" }, err: "agentbox.dev/secrets: not understood"},
		{name: "a key its role takes", node: "n2", pod: func(p *Pod) { p.Role = "warm-agent" }, claim: giveKey("vendor"), keys: 1},
		{name: "a key its role does not take", node: "n2", pod: func(p *Pod) { p.Role = "warm-agent" }, claim: giveKey("other"), err: `role "warm-agent" has no secret with fromClaim: other`},
		{name: "a key for a node's role", node: "n2", pod: func(p *Pod) { p.Role = "baseline" }, claim: giveKey("vendor"), err: `role "baseline" is not a cluster AgentRole bound to namespace agents`},
		{name: "a key for a role not bound here", node: "n2", pod: func(p *Pod) { p.Role, p.Namespace = "warm-agent", "elsewhere" }, claim: giveKey("vendor"), err: "not Sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sb, c := ownPod("n2"), claimedSandbox(), testClaim()
			req := p.Ref
			if tc.req != nil {
				tc.req(&req)
			}
			if tc.pod != nil {
				tc.pod(&p)
			}
			if tc.sb != nil {
				tc.sb(&sb)
			}
			if tc.claim != nil {
				tc.claim(&c)
			}
			got, err := ClaimOf(tc.node, req, p, sb, c, testRoles())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got.Claim != c.Ref || got.Identity.Tenant != "acme" || got.Identity.Task != "t1" || len(got.Identity.Keys) != tc.keys {
				t.Fatalf("got %+v %v", got, err)
			}
		})
	}
}

// A node learns its own pod's claim through the API; another node asking
// for it is refused (403) with the reason.
func TestServerClaim(t *testing.T) {
	f, srv, _ := testServer(t)
	f.sandboxes["agents/sb1"] = claimedSandbox()
	f.claims = map[string]Claim{"agents/task-1": testClaim()}
	pod := ownPod("n2").Ref
	if _, err := clientAs(t, srv, "n1").Claim(context.Background(), pod); status(err) != http.StatusForbidden || !strings.Contains(err.Error(), "not n1") {
		t.Fatalf("node 1 asking for node 2's claim: %v", err)
	}
	got, err := clientAs(t, srv, "n2").Claim(context.Background(), pod)
	if err != nil || got.Claim.UID != "claim-uid" || got.Identity.Tenant != "acme" || got.Identity.Task != "t1" {
		t.Fatalf("node 2: %+v %v", got, err)
	}
	delete(f.claims, "agents/task-1")
	if _, err := clientAs(t, srv, "n2").Claim(context.Background(), pod); status(err) != http.StatusForbidden {
		t.Fatalf("a claim that is gone: %v", err)
	}
	f.sandboxes["agents/sb1"] = testSandbox()
	if _, err := clientAs(t, srv, "n2").Claim(context.Background(), pod); status(err) != http.StatusForbidden || !strings.Contains(err.Error(), "not held by a SandboxClaim") {
		t.Fatalf("an unclaimed Sandbox: %v", err)
	}
}

// A claim's key reaches the node of its pod, in the claim's answer and in
// every keys round while the claim holds the pod; before the claim (a warm
// pod), and on another node, it does not.
func TestServerClaimKeys(t *testing.T) {
	f, srv, _ := testServer(t)
	f.pods[1].Role = "warm-agent"
	pod := f.pods[1].Ref
	task := ref("agents", "task-keys", "token")
	hasKey := func(keys []Key) bool {
		for _, k := range keys {
			if k.SecretRef == task {
				return string(k.Value) == "value-of-"+task.String()
			}
		}
		return false
	}
	keys, err := clientAs(t, srv, "n2").Keys(context.Background())
	if err != nil || hasKey(keys.Keys) {
		t.Fatalf("a warm pod's node holds the task's key: %+v %v", keys, err)
	}
	f.sandboxes["agents/sb1"] = claimedSandbox()
	c := testClaim()
	giveKey("vendor")(&c)
	f.claims = map[string]Claim{"agents/task-1": c}
	got, err := clientAs(t, srv, "n2").Claim(context.Background(), pod)
	if err != nil || len(got.Identity.Keys) != 1 || !hasKey(got.Values) {
		t.Fatalf("the claim's answer: %+v %v", got, err)
	}
	if keys, err = clientAs(t, srv, "n2").Keys(context.Background()); err != nil || !hasKey(keys.Keys) {
		t.Fatalf("the keys round of the claimed pod's node: %+v %v", keys, err)
	}
	if keys, err = clientAs(t, srv, "n1").Keys(context.Background()); err != nil || hasKey(keys.Keys) {
		t.Fatalf("another node: %+v %v", keys, err)
	}
	giveKey("other")(&c)
	if _, err := clientAs(t, srv, "n2").Claim(context.Background(), pod); status(err) != http.StatusForbidden || !strings.Contains(err.Error(), "fromClaim: other") {
		t.Fatalf("a key the role does not take: %v", err)
	}
	if keys, err = clientAs(t, srv, "n2").Keys(context.Background()); err != nil || hasKey(keys.Keys) {
		t.Fatalf("a refused claim's key given in a keys round: %+v %v", keys, err)
	}
}
