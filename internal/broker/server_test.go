package broker

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/policy"
)

const nodeAgent = "system:serviceaccount:kube-system:agentbox-sync"

// fakeAPI is a cluster in memory: tokens name their callers.
type fakeAPI struct {
	callers   map[string]Caller
	pods      []Pod
	sandboxes map[string]Sandbox
	patched   []string
	rolesDown bool
	claims    map[string]Claim
	objects   map[string]*unstructured.Unstructured
	created   []string
}

func (f *fakeAPI) Review(_ context.Context, token, audience string) (Caller, error) {
	if audience != Audience {
		return Caller{}, errors.New("audience")
	}
	c, ok := f.callers[token]
	if !ok {
		return Caller{}, errors.New("the token is not valid")
	}
	return c, nil
}

func (f *fakeAPI) PodsOn(_ context.Context, node string) ([]Pod, error) {
	var out []Pod
	for _, p := range f.pods {
		if p.Node == node {
			out = append(out, p)
		}
	}
	return out, nil
}

func (f *fakeAPI) Pod(_ context.Context, ns, name string) (Pod, error) {
	for _, p := range f.pods {
		if p.Namespace == ns && p.Name == name {
			return p, nil
		}
	}
	return Pod{}, errors.New("not found")
}

func (f *fakeAPI) Roles(context.Context) (Roles, error) {
	if f.rolesDown {
		return Roles{}, errors.New("listing AgentRoles: the API server is away")
	}
	return testRoles(), nil
}

func (f *fakeAPI) SecretValue(_ context.Context, r policy.SecretRef) ([]byte, error) {
	return []byte("value-of-" + r.String()), nil
}

func (f *fakeAPI) Sandbox(_ context.Context, ns, name string) (Sandbox, error) {
	sb, ok := f.sandboxes[ns+"/"+name]
	if !ok {
		return Sandbox{}, errors.New("not found")
	}
	return sb, nil
}

func (f *fakeAPI) PatchSandbox(_ context.Context, sb Sandbox, patch []byte) error {
	f.patched = append(f.patched, sb.String()+" "+string(patch))
	return nil
}

func (f *fakeAPI) Hostname(_ context.Context, node string) string { return node }

func (f *fakeAPI) SandboxObject(_ context.Context, ns, name string) (*unstructured.Unstructured, error) {
	o, ok := f.objects[ns+"/"+name]
	if !ok {
		return nil, errors.New("not found")
	}
	return o.DeepCopy(), nil
}

func (f *fakeAPI) CreateSandbox(_ context.Context, obj *unstructured.Unstructured) (string, error) {
	f.created = append(f.created, obj.GetNamespace()+"/"+obj.GetName())
	return fmt.Sprintf("copy-uid-%d", len(f.created)), nil
}

func (f *fakeAPI) Claim(_ context.Context, ns, name string) (Claim, error) {
	c, ok := f.claims[ns+"/"+name]
	if !ok {
		return Claim{}, errors.New("not found")
	}
	return c, nil
}

func testServer(t *testing.T) (*fakeAPI, *httptest.Server, *checkpoint.PrivateKEK) {
	k, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	kek, err := checkpoint.ParsePrivateKEK(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
	if err != nil {
		t.Fatal(err)
	}
	agentPod := Pod{Ref: Ref{Namespace: "agents", Name: "agent", UID: "u1"}, Node: "n1", Role: "coding-agent", Handler: "agentbox"}
	f := &fakeAPI{
		callers: map[string]Caller{
			"n1":       {User: nodeAgent, Node: "n1", Pod: "agentbox-installer-a"},
			"n2":       {User: nodeAgent, Node: "n2", Pod: "agentbox-installer-b"},
			"unbound":  {User: nodeAgent},
			"somebody": {User: "system:serviceaccount:agents:default", Node: "n1"},
		},
		pods:      []Pod{agentPod, ownPod("n2")},
		sandboxes: map[string]Sandbox{"agents/sb1": testSandbox()},
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	tickets, err := NewTickets()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{API: f, KEK: kek, Audience: Audience, NodeAgent: nodeAgent, Log: logrus.NewEntry(log), Tickets: tickets}
	srv := httptest.NewTLSServer(s.Handler())
	t.Cleanup(srv.Close)
	return f, srv, kek
}

func clientAs(t *testing.T, srv *httptest.Server, token string) *Client {
	dir := t.TempDir()
	tf := filepath.Join(dir, "token")
	os.WriteFile(tf, []byte(token+"\n"), 0o600)
	return &Client{URL: srv.URL, TokenFile: tf, HTTP: srv.Client()}
}

func status(err error) int {
	var be *Error
	if errors.As(err, &be) {
		return be.Status
	}
	return 0
}

// Only the node agent, with a token bound to a pod on a node, is served.
func TestServerAuthenticates(t *testing.T) {
	_, srv, _ := testServer(t)
	for token, want := range map[string]int{"": 401, "forged": 401, "unbound": 401, "somebody": 401, "n1": 200} {
		_, err := clientAs(t, srv, token).Keys(context.Background())
		if got := status(err); (want == 200 && err != nil) || (want != 200 && got != want) {
			t.Errorf("token %q: %v, want %d", token, err, want)
		}
	}
}

// A node gets the keys of its own pods, and none of another node's.
func TestServerKeys(t *testing.T) {
	_, srv, _ := testServer(t)
	got, err := clientAs(t, srv, "n1").Keys(context.Background())
	if err != nil || len(got.Keys) != 2 || string(got.Keys[0].Value) != "value-of-agent-keys/vendor[a]" {
		t.Fatalf("node 1's keys: %+v %v", got, err)
	}
	got, err = clientAs(t, srv, "n2").Keys(context.Background())
	if err != nil || len(got.Keys) != 0 {
		t.Fatalf("node 2 (no agent pod of that role) got keys: %+v %v", got, err)
	}
}

// Roles that cannot be listed are an error, never an empty answer (which
// would have the node drop the keys its pods use).
func TestServerKeysRolesDown(t *testing.T) {
	f, srv, _ := testServer(t)
	f.rolesDown = true
	if got, err := clientAs(t, srv, "n1").Keys(context.Background()); status(err) != http.StatusBadGateway {
		t.Fatalf("roles down: %+v %v", got, err)
	}
}

// The data key of an image goes to the node its Sandbox's pod is bound
// to, and to no other; a forged request is refused with the reason.
func TestServerUnwrap(t *testing.T) {
	_, srv, kek := testServer(t)
	pub, _ := checkpoint.ParsePublicKEK(kek.PublicPEM())
	cp := ownPod("n2").RestoreFrom
	dek := make([]byte, checkpoint.DataKeySize)
	rand.Read(dek)
	w, err := pub.Wrap(cp, dek)
	if err != nil {
		t.Fatal(err)
	}
	pod := ownPod("n2").Ref
	if _, err := clientAs(t, srv, "n1").Unwrap(context.Background(), pod, w); status(err) != http.StatusForbidden || !strings.Contains(err.Error(), "not \\\"n1\\\"") && !strings.Contains(err.Error(), `not "n1"`) {
		t.Fatalf("node 1 unwrapping node 2's image: %v", err)
	}
	got, err := clientAs(t, srv, "n2").Unwrap(context.Background(), pod, w)
	if err != nil || string(got) != string(dek) {
		t.Fatalf("node 2: %v", err)
	}
	stale := pod
	stale.UID = "old"
	if _, err := clientAs(t, srv, "n2").Unwrap(context.Background(), stale, w); status(err) != http.StatusForbidden {
		t.Fatalf("a stale pod UID: %v", err)
	}
	// The public key, as a node keeps it.
	pemb, err := clientAs(t, srv, "n1").PublicKey(context.Background())
	if err != nil || string(pemb) != string(kek.PublicPEM()) {
		t.Fatalf("public key: %v", err)
	}
}

// A node writes a checkpoint on its own Sandbox; on another node's, the
// broker refuses and writes nothing.
func TestServerSandbox(t *testing.T) {
	f, srv, _ := testServer(t)
	w := SandboxWrite{Op: OpSuspended, Sandbox: testSandbox().Ref, Checkpoint: "sb-" + strings.ToLower(uid) + "-300", Pin: true}
	if _, err := clientAs(t, srv, "n1").WriteSandbox(context.Background(), w); status(err) != http.StatusForbidden {
		t.Fatalf("node 1 on node 2's Sandbox: %v", err)
	}
	if len(f.patched) != 0 {
		t.Fatalf("patched: %v", f.patched)
	}
	// The ticket first, while the pod is bound; then the suspend's write
	// goes through with it though the pod is gone meanwhile.
	begin := w
	begin.Op = OpSuspending
	if _, err := clientAs(t, srv, "n1").WriteSandbox(context.Background(), begin); status(err) != http.StatusForbidden {
		t.Fatalf("node 1's ticket for node 2's Sandbox: %v", err)
	}
	tr, err := clientAs(t, srv, "n2").WriteSandbox(context.Background(), begin)
	if err != nil || tr.Ticket == "" || len(f.patched) != 0 {
		t.Fatalf("node 2's ticket: %+v %v %v", tr, err, f.patched)
	}
	f.pods = f.pods[:1] // the suspended pod is gone
	w.Ticket = tr.Ticket
	if _, err := clientAs(t, srv, "n1").WriteSandbox(context.Background(), w); status(err) != http.StatusForbidden {
		t.Fatalf("node 1 with node 2's ticket: %v", err)
	}
	resp, err := clientAs(t, srv, "n2").WriteSandbox(context.Background(), w)
	if err != nil || resp.Pinned != "n2" || len(f.patched) != 1 {
		t.Fatalf("node 2 on its own, with its ticket: %+v %v %v", resp, err, f.patched)
	}
	var bad struct{ Op string }
	b, _ := json.Marshal(bad)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+PathSandbox, strings.NewReader(string(b)+`{"x":1}`))
	req.Header.Set("Authorization", "Bearer n2")
	r, err := srv.Client().Do(req)
	if err != nil || r.StatusCode != http.StatusBadRequest {
		t.Fatalf("a malformed body: %v %v", r, err)
	}
}

// A fork's copies are made for the node its source's pod runs on, and for
// no other.
func TestServerFork(t *testing.T) {
	f, srv, _ := testServer(t)
	f.objects = map[string]*unstructured.Unstructured{"agents/sb1": forkSource("2")}
	w := SandboxWrite{Op: OpForked, Sandbox: testSandbox().Ref, Checkpoint: ForkName(uid, time180()), Copies: 2}
	if _, err := clientAs(t, srv, "n1").WriteSandbox(context.Background(), w); status(err) != http.StatusForbidden || len(f.created) != 0 {
		t.Fatalf("node 1 forking node 2's Sandbox: %v, created %v", err, f.created)
	}
	resp, err := clientAs(t, srv, "n2").WriteSandbox(context.Background(), w)
	if err != nil || strings.Join(resp.Copies, " ") != "sb1-fork-180-1 sb1-fork-180-2" || len(f.created) != 2 || len(f.patched) != 1 {
		t.Fatalf("node 2's fork: %+v %v, created %v, patched %v", resp, err, f.created, f.patched)
	}
	if want := w.Checkpoint + `: sb1-fork-180-1=copy-uid-1, sb1-fork-180-2=copy-uid-2"`; !strings.Contains(f.patched[0], want) || !strings.Contains(f.patched[0], `"agentbox.dev/fork":null`) {
		t.Errorf("the source's answer: %s", f.patched[0])
	}
}
