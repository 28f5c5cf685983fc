package broker

import (
	"encoding/json"
	"testing"

	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/control"
	"agentbox.dev/agentbox/internal/policy"
)

// FuzzSandboxWrite: whatever a node sends, the broker's patch (when it
// makes one) touches only the checkpoint annotation and the pin, and only
// on the Sandbox whose own pod is on that node; a wrapped key it cannot
// read is refused, never a panic.
func FuzzSandboxWrite(f *testing.F) {
	f.Add([]byte(`{"op":"suspended","sandbox":{"namespace":"agents","name":"sb1","uid":"6A1F0C2E-0000-4000-8000-000000000001"},"checkpoint":"sb-6a1f0c2e-0000-4000-8000-000000000001-5","pin":true}`), "n1")
	f.Add([]byte(`{"op":"resumed","sandbox":{"namespace":"agents","name":"sb1","uid":"6A1F0C2E-0000-4000-8000-000000000001"},"checkpoint":"sb-6a1f0c2e-0000-4000-8000-000000000001-100"}`), "n1")
	f.Add([]byte(`{"pod":{"namespace":"agents","name":"sb1","uid":"pod-uid"},"wrapped":{"version":1,"scheme":"rsa-oaep-sha256","keyId":"x","checkpoint":"sb-1-1","wrapped":"AA=="}}`), "n2")
	f.Fuzz(func(t *testing.T, body []byte, node string) {
		sb := testSandbox()
		pods := []Pod{ownPod("n1")}
		var w SandboxWrite
		if decode(body, &w) == nil {
			if patch, err := SandboxPatch(node, "host-"+node, w, sb, pods, false); err == nil && patch != nil {
				if node != "n1" {
					t.Fatalf("a patch for node %q, whose node holds no pod of the Sandbox", node)
				}
				var m map[string]map[string]any
				if err := json.Unmarshal(patch, &m); err != nil {
					t.Fatalf("patch %s: %v", patch, err)
				}
				for k := range m {
					if k != "spec" && k != "metadata" {
						t.Fatalf("patch %s touches %s", patch, k)
					}
				}
				tmpl, _ := m["spec"]["podTemplate"].(map[string]any)
				if len(m["spec"]) != 1 || tmpl == nil || len(tmpl) > 2 {
					t.Fatalf("patch %s touches more of the spec than the template's annotation and node selector", patch)
				}
				if md, ok := m["metadata"]; ok {
					ann, _ := md["annotations"].(map[string]any)
					if _, pin := ann[PinnedAnnotation]; len(md) != 1 || len(ann) != 1 || !pin {
						t.Fatalf("patch %s touches more metadata than the pin", patch)
					}
				}
			}
		}
		var u UnwrapRequest
		if decode(body, &u) == nil && u.Wrapped != nil {
			if _, err := checkpoint.ParseWrappedKey(mustJSON(u.Wrapped)); err == nil {
				_ = MayUnwrap(node, u.Wrapped.Checkpoint, ownPod("n2"), &sb)
			}
		}
	})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// FuzzClaim: whatever a node asks and a claim's annotations say, a claim
// is given only to the node its pod is on, for that pod, and an identity
// given is printable text within bounds, never half of what was named.
func FuzzClaim(f *testing.F) {
	f.Add([]byte(`{"pod":{"namespace":"agents","name":"sb1","uid":"pod-uid"}}`), "n2", "agentbox.dev/task", "t1")
	f.Add([]byte(`{"pod":{"namespace":"agents","name":"sb1","uid":"pod-uid"}}`), "n1", "agentbox.dev/role", "admin")
	f.Add([]byte(`{"pod":{"namespace":"agents","name":"sb1","uid":"x"}}`), "n2", "agentbox.dev/subject", "a\nb")
	f.Add([]byte(`{"pod":{"namespace":"agents","name":"sb1","uid":"pod-uid"}}`), "n2", "agentbox.dev/key.vendor", "task-keys/token")
	f.Add([]byte(`{"pod":{"namespace":"agents","name":"sb1","uid":"pod-uid"}}`), "n2", "agentbox.dev/key.other", "../../etc/k")
	f.Fuzz(func(t *testing.T, body []byte, node, key, value string) {
		var req ClaimRequest
		if decode(body, &req) != nil {
			return
		}
		c := testClaim()
		c.Annotations[key] = value
		p := ownPod("n2")
		p.Role = "warm-agent"
		resp, err := ClaimOf(node, req.Pod, p, claimedSandbox(), c, testRoles())
		if err != nil {
			return
		}
		if node != "n2" || req.Pod.UID != "pod-uid" {
			t.Fatalf("node %q asking for %+v got the claim", node, req.Pod)
		}
		id := resp.Identity
		for _, v := range []string{id.Subject, id.Tenant, id.Task} {
			if v != "" && control.CheckClaimValue(v) != nil {
				t.Fatalf("an identity value that is not one: %q", v)
			}
		}
		want := Identity{Tenant: "acme", Task: "t1"}
		switch key {
		case SubjectAnnotation:
			want.Subject = value
		case TenantAnnotation:
			want.Tenant = value
		case TaskAnnotation:
			want.Task = value
		case policy.RoleAnnotation:
			want.Role = value
		}
		for _, k := range id.Keys {
			// A key given is one the role takes, of the claim's namespace.
			if k.Name != "vendor" || k.Secret.Namespace != "agents" || policy.ValidateSecretRef(k.Secret) != nil || key != KeyAnnotationPrefix+"vendor" {
				t.Fatalf("key %+v given from %q=%q", k, key, value)
			}
			want.Keys = id.Keys
		}
		if !id.Equal(&want) {
			t.Fatalf("identity %+v from %q=%q, want %+v", id, key, value, want)
		}
	})
}
