package shim

// What a sandbox needs when its gateway inspects rules: the CA the agent
// trusts, the upstream roots, the secrets the gateway injects and the
// placeholders the sandbox holds instead.

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"time"

	"agentbox.dev/agentbox/internal/bundle"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/dnsproxy"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// inspection makes what the gateway needs for the plan's inspected rules:
// a CA of the sandbox's own (name-constrained to those rules), the roots
// it verifies upstreams with, and the injected secrets read from the node.
func inspection(cfg *config.Config, sb *sandboxState, pl *netpolicy.Plan) (*egressgw.CA, *x509.CertPool, []egressgw.Secret, error) {
	if !pl.Inspected() {
		return nil, nil, nil, nil
	}
	var names []string
	for _, r := range pl.Hosts() {
		if r.Inspect {
			names = append(names, r.Host)
		}
	}
	ca, err := egressgw.NewCA(sb.id, names, caTTL(sb.profile))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("egress gateway CA: %w", err)
	}
	roots, err := cfg.Egress.UpstreamRoots()
	if err != nil {
		return nil, nil, nil, err
	}
	awaitSecretRefs(sb, pl, secretRefWait)
	secrets, err := injectedSecrets(sb, sb.injectsNow(pl))
	if err != nil {
		return nil, nil, nil, err
	}
	return ca, roots, secrets, nil
}

// secretRefWait bounds how long a sandbox's start waits for the keys of its
// Kubernetes Secrets: the node agent asks the broker for them once the pod
// is bound to this node, as the kubelet starts it.
const secretRefWait = 30 * time.Second

// awaitSecretRefs waits, up to wait, until every Kubernetes Secret key the
// gateway injects has its file (a role's own files are the node admin's:
// they are there or not).
func awaitSecretRefs(sb *sandboxState, pl *netpolicy.Plan, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for _, in := range pl.Injects {
		for in.Ref != nil && time.Now().Before(deadline) {
			if _, err := os.Lstat(in.Path(sb.cfg.Policy.SecretsDir)); !errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// placeholder is what the sandbox holds in env instead of a secret the
// gateway injects: random, the same for every container of the sandbox.
func (sb *sandboxState) placeholder(env string) string {
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	if sb.placeholders == nil {
		sb.placeholders = map[string]string{}
	}
	if p, ok := sb.placeholders[env]; ok {
		return p
	}
	b := make([]byte, 16)
	rand.Read(b)
	p := "agentbox-placeholder-" + hex.EncodeToString(b)
	sb.placeholders[env] = p
	return p
}

// placeholdersNow is a copy of the placeholders the sandbox holds.
func (sb *sandboxState) placeholdersNow() map[string]string {
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	return maps.Clone(sb.placeholders)
}

// gatewayCA is the sandbox's gateway CA, nil when nothing is inspected.
func (sb *sandboxState) gatewayCA() *egressgw.CA {
	if sb == nil {
		return nil
	}
	sb.egressMu.Lock()
	defer sb.egressMu.Unlock()
	return sb.ca
}

// gatewayNames are the exact names (no pattern) of the host rules the
// sandbox's gateway serves now (its live plan), for its containers'
// /etc/hosts; nil without a gateway.
func (sb *sandboxState) gatewayNames() []string {
	if sb == nil {
		return nil
	}
	sb.egressMu.Lock()
	gw := sb.gateway
	sb.egressMu.Unlock()
	pl := sb.live.Load()
	if gw == nil || pl == nil {
		return nil
	}
	return dnsproxy.PlainNames(pl.HostNames())
}

// secretsFor reads a sandbox's secrets for its containers' environment: a
// variable's value from its node file, or, for a secret the gateway
// injects, the sandbox's placeholder. Values never reach a log or an error.
func secretsFor(sb *sandboxState) func(*policy.Profile) (map[string]string, error) {
	return func(p *policy.Profile) (map[string]string, error) {
		out := map[string]string{}
		for _, sec := range p.Credentials.Secrets {
			if sec.Inject != nil {
				if sec.Env != "" {
					if sb == nil {
						return nil, fmt.Errorf("secret %s of role %q: no sandbox holds its placeholder", sec.Env, p.Role)
					}
					out[sec.Env] = sb.placeholder(sec.Env)
				}
				continue
			}
			v, err := readSecret(sec.File)
			if err != nil {
				return nil, fmt.Errorf("secret %s of role %q: %w", sec.Env, p.Role, err)
			}
			out[sec.Env] = v
		}
		return out, nil
	}
}

// readSecret reads a secret's node file, without its trailing newlines.
func readSecret(file string) (string, error) {
	b, err := bundle.ReadSmallFile(file, 64<<10)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// injectedSecrets reads the secrets the gateway injects. A secret that
// cannot be a header value (a control character) refuses the sandbox,
// naming its file, never its content.
func injectedSecrets(sb *sandboxState, injects []netpolicy.Inject) ([]egressgw.Secret, error) {
	var out []egressgw.Secret
	for _, in := range injects {
		v, err := readSecret(in.Path(sb.cfg.Policy.SecretsDir))
		if err != nil {
			if in.Ref != nil {
				err = fmt.Errorf("%w (the node agent keeps there the Kubernetes Secrets' keys the cluster's broker gives this node: is agentbox sync running with --broker-url, and is %s named by a cluster AgentRole bound to this pod?)", err, in.Ref)
			}
			return nil, fmt.Errorf("secret injected toward %s: %w", in.Host, err)
		}
		if v == "" {
			return nil, fmt.Errorf("secret injected toward %s: %s is empty", in.Host, in.Source())
		}
		for _, c := range v {
			if c < 0x20 || c == 0x7f {
				return nil, fmt.Errorf("secret injected toward %s: %s holds a control character: it cannot be sent as header %s", in.Host, in.Source(), in.Header)
			}
		}
		s := egressgw.Secret{Host: in.Host, Header: in.Header, Value: strings.Replace(in.Format, policy.SecretToken, v, 1), Secret: v}
		if in.Env != "" {
			s.Placeholder = sb.placeholder(in.Env)
		}
		out = append(out, s)
	}
	return out, nil
}

// caTTL is how long a sandbox's CA is valid: its wall clock and a day, or
// 30 days when it has none.
func caTTL(p *policy.Profile) time.Duration {
	if p.Limits.WallClock > 0 {
		return p.Limits.WallClock + 24*time.Hour
	}
	return 30 * 24 * time.Hour
}
