package broker

// The node agent's side of the broker's API.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/checkpoint"
)

// Client calls the broker as this node's agent.
type Client struct {
	URL string
	// TokenFile holds the node agent's token for the broker's audience (a
	// projected service-account token: read again at every call, since the
	// kubelet rotates it).
	TokenFile string
	HTTP      *http.Client
}

// NewClient is a client of the broker at url (https), trusting the CA in
// caFile.
func NewClient(url, caFile, tokenFile string) (*Client, error) {
	if !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("broker URL %q: want https://", url)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("broker CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("broker CA %s: no certificate", caFile)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Proxy: nil}
	return &Client{URL: strings.TrimRight(url, "/"), TokenFile: tokenFile, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}, nil
}

// Error is the broker's answer to a request it did not serve.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("the broker answered %d: %s", e.Status, e.Msg) }

// Refused says whether the broker decided against the node (not a fault).
func (e *Error) Refused() bool { return e.Status == http.StatusForbidden }

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	token, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return fmt.Errorf("the node agent's broker token: %w", err)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("the broker: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("the broker: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return &Error{Status: resp.StatusCode, Msg: strings.TrimSpace(string(b))}
	}
	return json.Unmarshal(b, out)
}

// Keys are the Secret keys this node may hold now.
func (c *Client) Keys(ctx context.Context) (*KeysResponse, error) {
	var out KeysResponse
	return &out, c.call(ctx, http.MethodGet, PathKeys, nil, &out)
}

// Unwrap asks for an image's data key, for the pod that restores it.
func (c *Client) Unwrap(ctx context.Context, pod Ref, w *checkpoint.WrappedKey) ([]byte, error) {
	var out UnwrapResponse
	if err := c.call(ctx, http.MethodPost, PathUnwrap, UnwrapRequest{Pod: pod, Wrapped: w}, &out); err != nil {
		return nil, err
	}
	if len(out.DataKey) != checkpoint.DataKeySize {
		return nil, fmt.Errorf("the broker gave a data key of %d bytes", len(out.DataKey))
	}
	return out.DataKey, nil
}

// PublicKey is the broker's public key (PEM), checked.
func (c *Client) PublicKey(ctx context.Context) ([]byte, error) {
	var out struct {
		KeyID string `json:"keyId"`
		PEM   string `json:"pem"`
	}
	if err := c.call(ctx, http.MethodGet, PathPublicKey, nil, &out); err != nil {
		return nil, err
	}
	k, err := checkpoint.ParsePublicKEK([]byte(out.PEM))
	if err != nil || k.ID() != out.KeyID {
		return nil, fmt.Errorf("the broker's public key does not check out (%v)", err)
	}
	return []byte(out.PEM), nil
}

// WriteSandbox asks the broker to write a checkpoint on a Sandbox.
func (c *Client) WriteSandbox(ctx context.Context, w SandboxWrite) (*SandboxResponse, error) {
	var out SandboxResponse
	return &out, c.call(ctx, http.MethodPost, PathSandbox, w, &out)
}

// Claim asks for a pod's SandboxClaim and its task's identity.
func (c *Client) Claim(ctx context.Context, pod Ref) (*ClaimResponse, error) {
	var out ClaimResponse
	return &out, c.call(ctx, http.MethodPost, PathClaim, ClaimRequest{Pod: pod}, &out)
}
