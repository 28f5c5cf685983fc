package checkpoint

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	brokerOnce sync.Once
	brokerKey  *PrivateKEK
)

// testBrokerKEK is one 3072-bit key for the package's tests (making one
// takes a second).
func testBrokerKEK(t *testing.T) *PrivateKEK {
	t.Helper()
	brokerOnce.Do(func() {
		k, err := rsa.GenerateKey(rand.Reader, 3072)
		if err != nil {
			t.Fatal(err)
		}
		brokerKey, err = ParsePrivateKEK(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
		if err != nil {
			t.Fatal(err)
		}
	})
	return brokerKey
}

// With the broker's key, a node wraps with the public half alone and can
// never unwrap: the image imports on another node only once its data key
// was placed in the keys directory (as the node agent does with what the
// broker unwrapped), and the key is bound to the image's name.
func TestSharedWithBrokerKey(t *testing.T) {
	priv := testBrokerKEK(t)
	pub, err := ParsePublicKEK(priv.PublicPEM())
	if err != nil || pub.ID() != priv.ID() {
		t.Fatalf("public half: %v (%s, %s)", err, pub.ID(), priv.ID())
	}
	a, _ := newStore(t)
	b, _ := newStore(t)
	dir := t.TempDir()
	keys := KeyDir{Dir: filepath.Join(dir, "keys"), Wait: 300 * time.Millisecond}
	sh, err := OpenShared(filepath.Join(dir, "shared"), pub, keys)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, a, "sb-1234-1", map[string]string{"pages.img": "memory s3cr3t"})
	commit(t, a, "sb-1234-2", map[string]string{"pages.img": "memory s3cr3t"})
	for _, n := range []string{"sb-1234-1", "sb-1234-2"} {
		if _, err := a.Export(n, sh); err != nil {
			t.Fatal(err)
		}
	}
	// No key placed: refused, after the wait, naming the broker.
	start := time.Now()
	if err := b.Import("sb-1234-1", sh); err == nil || !strings.Contains(err.Error(), "broker") || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("import without its data key: %v after %v", err, time.Since(start))
	}
	raw, _ := os.ReadFile(filepath.Join(sh.Dir, "sb-1234-1", DataKeyFile))
	w, err := ParseWrappedKey(raw)
	if err != nil || w.Scheme != SchemeRSAOAEP || w.KeyID != pub.ID() {
		t.Fatalf("wrapped: %+v %v", w, err)
	}
	// Another image's wrapped key under this name does not unwrap.
	raw2, _ := os.ReadFile(filepath.Join(sh.Dir, "sb-1234-2", DataKeyFile))
	w2, _ := ParseWrappedKey(raw2)
	w2.Checkpoint = "sb-1234-1"
	if _, err := priv.Unwrap(w2); err == nil {
		t.Fatal("another image's data key unwrapped under this image's name")
	}
	// The node cannot unwrap with what it holds.
	if _, err := (KeyDir{Dir: t.TempDir()}).Unwrap(w); err == nil {
		t.Fatal("unwrapped with no key placed")
	}
	dek, err := priv.Unwrap(w)
	if err != nil {
		t.Fatal(err)
	}
	// A wrong key placed: refused.
	wrong := make([]byte, DataKeySize)
	if err := keys.WriteDataKey("sb-1234-1", wrong); err != nil {
		t.Fatal(err)
	}
	if err := b.Import("sb-1234-1", sh); err == nil || !strings.Contains(err.Error(), "does not decrypt") {
		t.Fatalf("a wrong data key: %v", err)
	}
	// The right one, placed late: the import waits for it.
	os.Remove(keys.Path("sb-1234-1"))
	go func() {
		time.Sleep(100 * time.Millisecond)
		keys.WriteDataKey("sb-1234-1", dek)
	}()
	if err := b.Import("sb-1234-1", sh); err != nil {
		t.Fatal(err)
	}
	img, err := b.Open("sb-1234-1")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(img.Dir, "pages.img"))
	if string(got) != "memory s3cr3t" {
		t.Fatalf("imported: %q", got)
	}
}

// Keys the KEK parsers refuse, each with its reason.
func TestKEKParsing(t *testing.T) {
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	smallPub, _ := x509.MarshalPKIXPublicKey(&small.PublicKey)
	for name, tc := range map[string]struct {
		pem  []byte
		pub  bool
		want string
	}{
		"not PEM":         {[]byte("hello"), true, "not a PEM"},
		"a small key":     {pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: smallPub}), true, "at least 3072"},
		"a small private": {pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(small)}), false, "at least 3072"},
		"a certificate":   {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), false, "not a private key"},
	} {
		var err error
		if tc.pub {
			_, err = ParsePublicKEK(tc.pem)
		} else {
			_, err = ParsePrivateKEK(tc.pem)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	for name, b := range map[string]string{
		"unknown field": `{"version":1,"scheme":"aes-256-gcm","keyId":"x","checkpoint":"cp","wrapped":"AA==","extra":1}`,
		"version":       `{"version":2,"scheme":"aes-256-gcm","keyId":"x","checkpoint":"cp","wrapped":"AA=="}`,
		"scheme":        `{"version":1,"scheme":"rot13","keyId":"x","checkpoint":"cp","wrapped":"AA=="}`,
		"a path":        `{"version":1,"scheme":"aes-256-gcm","keyId":"x","checkpoint":"../cp","wrapped":"AA=="}`,
		"empty":         `{"version":1,"scheme":"aes-256-gcm","keyId":"x","checkpoint":"cp","wrapped":""}`,
	} {
		if _, err := ParseWrappedKey([]byte(b)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
