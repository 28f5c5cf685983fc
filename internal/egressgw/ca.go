package egressgw

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// CA is one sandbox's certificate authority for the host rules the gateway
// inspects. Its key lives only in the shim's memory and is gone with the
// sandbox. The certificate is name-constrained to the inspected rules'
// names, so even a leaked key vouches for nothing else.
type CA struct {
	cert *x509.Certificate
	der  []byte
	key  crypto.Signer
	// names are the permitted patterns ("api.github.com", "*.example.com").
	names []string
	ttl   time.Duration

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// maxLeaves bounds the leaf cache (one per name the agent asks for).
const maxLeaves = 256

// NewCA makes a CA that may sign for names (host rule patterns), valid for
// ttl from now (and an hour before, for clocks that lag).
func NewCA(sandbox string, names []string, ttl time.Duration) (*CA, error) {
	if len(names) == 0 {
		return nil, errors.New("a CA for no names")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	var permitted []string
	for _, n := range names {
		// x509 name constraints: "example.com" permits it and the names
		// below it; ".example.com" only those below.
		if suffix, wild := strings.CutPrefix(n, "*"); wild {
			permitted = append(permitted, suffix)
		} else {
			permitted = append(permitted, n)
		}
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{Organization: []string{"agentbox"}, CommonName: "agentbox egress gateway CA for sandbox " + clip(sandbox, 24)},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(ttl),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, der: der, key: key, names: names, ttl: ttl, leaves: map[string]*tls.Certificate{}}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// PEM is the CA's certificate, for the sandbox to trust.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Certificate is the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Leaf is a certificate for name (a name the gateway decided to inspect),
// signed by the CA; made once per name, at most maxLeaves.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok {
		return c, nil
	}
	if len(ca.leaves) >= maxLeaves {
		// A wildcard rule lets the agent ask for many names: start over
		// rather than grow.
		ca.leaves = map[string]*tls.Certificate{}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign a certificate for %s: %w", name, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: key}
	ca.leaves[name] = c
	return c, nil
}

// Fingerprint is the SHA-256 of the CA's certificate, for the trail.
func (ca *CA) Fingerprint() string {
	sum := sha256.Sum256(ca.der)
	return "sha256:" + hex.EncodeToString(sum[:])
}
