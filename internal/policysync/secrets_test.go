package policysync

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/policy"
)

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
	// Another user's 0700 directory: its owner would read every key
	// written into it.
	if os.Geteuid() != 0 {
		return
	}
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := ensurePrivateDir(theirs); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("another user's directory: got %v", err)
	}
}

// The node keeps exactly the keys the broker gives it now: a key given is
// written, rotated when its value changes, and removed once not given; a
// broker that fails changes nothing on the node.
func TestSyncSecretsFromBroker(t *testing.T) {
	give := []broker.Key{{SecretRef: policy.SecretRef{Namespace: "keys", Name: "vendor", Key: "a"}, Value: []byte("v1")}}
	fail := false
	var unreadable []policy.SecretRef
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer node-token" || r.URL.Path != broker.PathKeys {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		if fail {
			http.Error(w, "the API server is away", http.StatusBadGateway)
			return
		}
		json.NewEncoder(w).Encode(broker.KeysResponse{Node: "n1", Keys: give, Unreadable: unreadable, Errors: errorsFor(unreadable)})
	}))
	defer srv.Close()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("node-token"), 0o600)
	a := &Agent{NodeName: "n1", SecretsDir: filepath.Join(dir, "secrets"), Log: logrus.NewEntry(logrus.New()),
		Broker: &broker.Client{URL: srv.URL, TokenFile: tok, HTTP: srv.Client()}}
	path := give[0].Path(a.SecretsDir)
	read := func() string { b, _ := os.ReadFile(path); return string(b) }
	sync := func() {
		if err := a.SyncSecrets(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	if read() != "v1" {
		t.Fatalf("given: %q", read())
	}
	give[0].Value = []byte("v2")
	sync()
	if read() != "v2" {
		t.Fatalf("rotated: %q", read())
	}
	fail = true
	sync()
	if read() != "v2" {
		t.Fatalf("a failing broker changed the node's key: %q", read())
	}
	// A key the broker may give and could not read stays as it was.
	fail, unreadable, give = false, []policy.SecretRef{give[0].SecretRef}, nil
	sync()
	if read() != "v2" {
		t.Fatalf("a key the broker could not read was removed or changed: %q", read())
	}
	unreadable = nil
	give = nil
	sync()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a key no longer given is still on the node: %v", err)
	}
	// A key whose name would leave the directory is never written.
	give = []broker.Key{{SecretRef: policy.SecretRef{Namespace: "..", Name: "x", Key: "y"}, Value: []byte("v")}}
	sync()
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatalf("a traversing name was written: %v", err)
	}
}

func errorsFor(refs []policy.SecretRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, "the Secret "+r.String()+": forbidden")
	}
	return out
}
