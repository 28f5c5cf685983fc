package policysync

import (
	"os"
	"path/filepath"
	"testing"

	"agentbox.dev/agentbox/internal/policy"
)

func TestSecretRefs(t *testing.T) {
	set, err := policy.Parse("roles.yaml", []byte(`apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: parent}
spec:
  network:
    egress: allowlist
    allow: [{host: api.example, ports: [443]}, {host: b.example, ports: [443]}]
  credentials:
    secrets:
      - {secretRef: {namespace: keys, name: vendor, key: token}, inject: {host: api.example, header: x-api-key}}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: child}
spec:
  inherits: parent
  credentials:
    secrets:
      - {secretRef: {namespace: keys, name: vendor, key: token}, inject: {host: api.example, header: x-api-key}}
      - {secretRef: {namespace: keys, name: other, key: k}, inject: {host: b.example, header: authorization}}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: files}
spec:
  network:
    egress: allowlist
    allow: [{host: api.example, ports: [443]}]
  credentials:
    secrets: [{file: /etc/key, inject: {host: api.example, header: x-api-key}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	got := SecretRefs(set)
	want := []policy.SecretRef{{Namespace: "keys", Name: "other", Key: "k"}, {Namespace: "keys", Name: "vendor", Key: "token"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("SecretRefs: %+v, want %+v", got, want)
	}
}

func TestWriteSecretFile(t *testing.T) {
	dir := t.TempDir()
	p := policy.SecretRef{Namespace: "keys", Name: "vendor", Key: "token"}.Path(dir)
	for i, tc := range []struct {
		value   string
		changed bool
	}{{"v1", true}, {"v1", false}, {"v2", true}} {
		changed, err := writeSecretFile(p, []byte(tc.value))
		if err != nil || changed != tc.changed {
			t.Fatalf("write %d: changed %v, %v; want %v", i, changed, err, tc.changed)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != tc.value {
			t.Fatalf("write %d: %q %v", i, b, err)
		}
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Dir(p)); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("directory mode %v %v", st.Mode(), err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestEnsurePrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	if err := ensurePrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	if err := ensurePrivateDir(dir); err == nil {
		t.Fatal("a directory others may enter was accepted")
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if err := ensurePrivateDir(link); err == nil {
		t.Fatal("a symlink was accepted")
	}
}
