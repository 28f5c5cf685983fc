package checkpoint

// Envelope encryption for the shared store, after Kubernetes' KMS v2: each
// image is encrypted with a data key of its own (a DEK: 32 random bytes,
// AES-256-GCM), and the DEK travels beside the image wrapped by a
// key-encryption key (KEK). Who holds the KEK decides who can read an image:
//
//   - a PublicKEK (scheme rsa-oaep-sha256): the node holds only the public
//     half of the cluster broker's key. It can wrap a new image's DEK, and
//     never unwrap one: the broker unwraps it for a node only while a pod of
//     the image's Sandbox is bound to that node, and the node hands it to the
//     shim through a file in its keys directory (KeyDir).
//   - a SymmetricKEK (scheme aes-256-gcm): every node holds the same key and
//     unwraps for itself. One trust domain: for hosts outside Kubernetes.
//
// The wrap binds the checkpoint's name (the OAEP label, or the GCM
// associated data), so a wrapped DEK cannot be moved onto another image.

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// DataKeyFile is the wrapped DEK's file in an image's shared directory.
const DataKeyFile = "data-key.json"

// DataKeySize is a DEK's length in bytes.
const DataKeySize = 32

// Wrapping schemes.
const (
	SchemeRSAOAEP = "rsa-oaep-sha256"
	SchemeAESGCM  = "aes-256-gcm"
)

// WrappedKey is an image's DEK as it travels with the image.
type WrappedKey struct {
	Version    int    `json:"version"`
	Scheme     string `json:"scheme"`
	KeyID      string `json:"keyId"`
	Checkpoint string `json:"checkpoint"`
	Wrapped    []byte `json:"wrapped"`
}

// dataKeyLabel binds a wrapped DEK to its image's name.
func dataKeyLabel(name string) []byte {
	return []byte("agentbox checkpoint data key v1\n" + name)
}

// Wrapper wraps a new image's DEK.
type Wrapper interface {
	Wrap(name string, dek []byte) (*WrappedKey, error)
}

// Unwrapper gives an image's DEK back.
type Unwrapper interface {
	Unwrap(w *WrappedKey) ([]byte, error)
}

// ParseWrappedKey reads a data-key.json strictly.
func ParseWrappedKey(b []byte) (*WrappedKey, error) {
	var w WrappedKey
	if err := jsonStrict(b, &w); err != nil {
		return nil, fmt.Errorf("%s: %w", DataKeyFile, err)
	}
	switch {
	case w.Version != 1:
		return nil, fmt.Errorf("%s: version %d, want 1", DataKeyFile, w.Version)
	case w.Scheme != SchemeRSAOAEP && w.Scheme != SchemeAESGCM:
		return nil, fmt.Errorf("%s: scheme %q is neither %s nor %s", DataKeyFile, w.Scheme, SchemeRSAOAEP, SchemeAESGCM)
	case ValidName(w.Checkpoint) != nil:
		return nil, fmt.Errorf("%s: checkpoint %q is not a checkpoint's name", DataKeyFile, w.Checkpoint)
	case len(w.Wrapped) == 0 || len(w.Wrapped) > 4096:
		return nil, fmt.Errorf("%s: a wrapped key of %d bytes", DataKeyFile, len(w.Wrapped))
	}
	return &w, nil
}

// PublicKEK wraps with the public half of the broker's RSA key.
type PublicKEK struct {
	pub *rsa.PublicKey
	id  string
}

// PrivateKEK is the broker's RSA key: it unwraps.
type PrivateKEK struct {
	priv *rsa.PrivateKey
	id   string
}

// minRSABits is the smallest KEK accepted.
const minRSABits = 3072

func rsaKeyID(pub *rsa.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return "rsa:" + hex.EncodeToString(sum[:8]), nil
}

// ParsePublicKEK reads a PEM "PUBLIC KEY" (PKIX) of an RSA key of at least
// 3072 bits.
func ParsePublicKEK(b []byte) (*PublicKEK, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM PUBLIC KEY")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := k.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an RSA key", k)
	}
	if pub.N.BitLen() < minRSABits {
		return nil, fmt.Errorf("an RSA key of %d bits: at least %d", pub.N.BitLen(), minRSABits)
	}
	id, err := rsaKeyID(pub)
	if err != nil {
		return nil, err
	}
	return &PublicKEK{pub: pub, id: id}, nil
}

// ParsePrivateKEK reads a PEM RSA private key (PKCS#1 or PKCS#8) of at
// least 3072 bits.
func ParsePrivateKEK(b []byte) (*PrivateKEK, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("not PEM")
	}
	var priv *rsa.PrivateKey
	switch blk.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		priv = k
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		r, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("a %T, not an RSA key", k)
		}
		priv = r
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key", blk.Type)
	}
	if priv.N.BitLen() < minRSABits {
		return nil, fmt.Errorf("an RSA key of %d bits: at least %d", priv.N.BitLen(), minRSABits)
	}
	id, err := rsaKeyID(&priv.PublicKey)
	if err != nil {
		return nil, err
	}
	return &PrivateKEK{priv: priv, id: id}, nil
}

// ID names the key (a digest of its public half).
func (k *PublicKEK) ID() string { return k.id }

// ID names the key (a digest of its public half).
func (k *PrivateKEK) ID() string { return k.id }

// PublicPEM is the public half, as nodes are given it.
func (k *PrivateKEK) PublicPEM() []byte {
	der, _ := x509.MarshalPKIXPublicKey(&k.priv.PublicKey)
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// Wrap encrypts dek to the broker's key, labelled with the image's name.
func (k *PublicKEK) Wrap(name string, dek []byte) (*WrappedKey, error) {
	w, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, k.pub, dek, dataKeyLabel(name))
	if err != nil {
		return nil, err
	}
	return &WrappedKey{Version: 1, Scheme: SchemeRSAOAEP, KeyID: k.id, Checkpoint: name, Wrapped: w}, nil
}

// Unwrap decrypts a DEK wrapped for this key under w's checkpoint name.
func (k *PrivateKEK) Unwrap(w *WrappedKey) ([]byte, error) {
	if w.Scheme != SchemeRSAOAEP || w.KeyID != k.id {
		return nil, fmt.Errorf("the data key of %s is wrapped by %s key %s, not this broker's %s", w.Checkpoint, w.Scheme, w.KeyID, k.id)
	}
	dek, err := rsa.DecryptOAEP(sha256.New(), nil, k.priv, w.Wrapped, dataKeyLabel(w.Checkpoint))
	if err != nil || len(dek) != DataKeySize {
		return nil, fmt.Errorf("the data key of %s does not unwrap: altered, or another image's", w.Checkpoint)
	}
	return dek, nil
}

// SymmetricKEK is a 32-byte key every node holds (one trust domain).
type SymmetricKEK struct {
	aead cipher.AEAD
	id   string
}

// NewSymmetricKEK makes a KEK of a 32-byte key.
func NewSymmetricKEK(key []byte) (*SymmetricKEK, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("a key of %d bytes, want %d", len(key), KeySize)
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(append([]byte("agentbox kek id\n"), key...))
	return &SymmetricKEK{aead: aead, id: "aes:" + hex.EncodeToString(sum[:8])}, nil
}

// Wrap seals dek under the image's name.
func (k *SymmetricKEK) Wrap(name string, dek []byte) (*WrappedKey, error) {
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return &WrappedKey{Version: 1, Scheme: SchemeAESGCM, KeyID: k.id, Checkpoint: name,
		Wrapped: k.aead.Seal(nonce, nonce, dek, dataKeyLabel(name))}, nil
}

// Unwrap opens a DEK this key sealed under w's checkpoint name.
func (k *SymmetricKEK) Unwrap(w *WrappedKey) ([]byte, error) {
	if w.Scheme != SchemeAESGCM || w.KeyID != k.id {
		return nil, fmt.Errorf("the data key of %s is wrapped by %s key %s, not the cluster checkpoint key %s this node holds", w.Checkpoint, w.Scheme, w.KeyID, k.id)
	}
	n := k.aead.NonceSize()
	if len(w.Wrapped) < n {
		return nil, fmt.Errorf("the data key of %s is cut short", w.Checkpoint)
	}
	dek, err := k.aead.Open(nil, w.Wrapped[:n], w.Wrapped[n:], dataKeyLabel(w.Checkpoint))
	if err != nil || len(dek) != DataKeySize {
		return nil, fmt.Errorf("the data key of %s does not unwrap with the cluster's checkpoint key: altered, or another image's", w.Checkpoint)
	}
	return dek, nil
}

// KeyDir gives the DEKs the node agent placed in Dir (one file per image,
// named after it, 32 bytes, the runtime user's alone at 0600), having had
// the broker unwrap them. It waits up to Wait for the file: the node agent
// asks the broker once the pod is bound, as the kubelet starts it.
type KeyDir struct {
	Dir  string
	Wait time.Duration
}

// Path is where the DEK of checkpoint name goes.
func (d KeyDir) Path(name string) string { return filepath.Join(d.Dir, name) }

// Unwrap reads the DEK of w's image from the directory.
func (d KeyDir) Unwrap(w *WrappedKey) ([]byte, error) {
	if err := ValidName(w.Checkpoint); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(d.Wait)
	for {
		dek, err := readPrivateFile(d.Path(w.Checkpoint), DataKeySize)
		if err == nil {
			return dek, nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return nil, fmt.Errorf("the data key of %s is not in %s (%v): the cluster's broker gives it to the node agent only while a pod of its Sandbox is bound to this node", w.Checkpoint, d.Dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Remove deletes a DEK once its image is imported.
func (d KeyDir) Remove(name string) {
	if ValidName(name) == nil {
		os.Remove(d.Path(name))
	}
}

// readPrivateFile reads a regular file of exactly size bytes that is the
// runtime user's alone (mode 0600), without following a symlink.
func readPrivateFile(path string, size int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || !private(&st) {
		return nil, fmt.Errorf("%s: must be a regular file of uid %d with mode 0600", path, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(size)+1))
	if err != nil {
		return nil, err
	}
	if len(b) != size {
		return nil, fmt.Errorf("%s: %d bytes, want %d", path, len(b), size)
	}
	return b, nil
}

// WriteDataKey writes a DEK into the keys directory (0600, in a 0700
// directory, atomically).
func (d KeyDir) WriteDataKey(name string, dek []byte) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if len(dek) != DataKeySize {
		return fmt.Errorf("a data key of %d bytes", len(dek))
	}
	if err := ensureDir(d.Dir); err != nil {
		return err
	}
	tmp := d.Path(name) + ".tmp"
	os.Remove(tmp)
	if err := writeFileSync(tmp, dek); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, d.Path(name))
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
