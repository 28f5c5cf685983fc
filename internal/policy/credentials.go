package policy

// A role's credentials: the environment that passes, and the secrets the
// agent holds or the gateway injects (from a node file, a Kubernetes
// Secret, or the key a SandboxClaim names at its claim).

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// compileCredentials fills the profile's credentials section, with its defaults.
func (p *Profile) compileCredentials(cr Credentials) []error {
	var errs []error
	p.Credentials.EnvAllow = DefaultEnvAllow
	if cr.Env != nil {
		p.Credentials.EnvAllow = nonNil(cr.Env.Allow)
	}
	for i, pat := range p.Credentials.EnvAllow {
		if !envPatRE.MatchString(pat) {
			errs = append(errs, ferr(fmt.Sprintf("credentials.env.allow[%d]", i), "%q is not a variable name or a prefix ending in '*'", pat))
		}
	}
	p.Credentials.Secrets = nonNil(cr.Secrets)
	seenEnv := map[string]bool{}
	seenInject := map[string]bool{}
	seenClaim := map[string]bool{}
	for i, sec := range p.Credentials.Secrets {
		ip := fmt.Sprintf("credentials.secrets[%d]", i)
		switch {
		case sec.Env == "" && sec.Inject == nil:
			errs = append(errs, ferr(ip, "names neither env (the agent holds the secret) nor inject (the gateway adds it to one host's requests)"))
		case sec.Env != "" && !envNameRE.MatchString(sec.Env):
			errs = append(errs, ferr(ip+".env", "%q is not an environment variable name", sec.Env))
		case sec.Env != "" && seenEnv[sec.Env]:
			errs = append(errs, ferr(ip+".env", "%q is injected twice", sec.Env))
		}
		if sec.Env != "" {
			seenEnv[sec.Env] = true
		}
		if sec.FromClaim != "" {
			switch {
			case sec.File != "" || sec.SecretRef != nil:
				errs = append(errs, ferr(ip, "names fromClaim and a file or secretRef: one source only"))
			case sec.Inject == nil:
				errs = append(errs, ferr(ip+".fromClaim", "only a secret the gateway injects may come from a claim (a warm pod's environment is set before its claim)"))
			case seenClaim[sec.FromClaim]:
				errs = append(errs, ferr(ip+".fromClaim", "%q is named twice", sec.FromClaim))
			}
			seenClaim[sec.FromClaim] = true
			if err := ValidClaimKey(sec.FromClaim); err != nil {
				errs = append(errs, ferr(ip+".fromClaim", "%v", err))
			}
		} else if r := sec.SecretRef; r != nil {
			switch {
			case sec.File != "":
				errs = append(errs, ferr(ip, "names both file and secretRef: one or the other"))
			case sec.Inject == nil:
				errs = append(errs, ferr(ip+".secretRef", "only a secret the gateway injects may come from a Kubernetes Secret (a pod takes a Secret into its environment itself)"))
			}
			errs = append(errs, checkSecretRef(ip+".secretRef", *r)...)
		} else if err := checkPath(ip+".file", sec.File); err != nil {
			errs = append(errs, err)
		}
		if in := sec.Inject; in != nil {
			errs = append(errs, checkInject(ip+".inject", *in)...)
			key := strings.ToLower(in.Host) + " " + http.CanonicalHeaderKey(in.Header)
			if seenInject[key] {
				errs = append(errs, ferr(ip+".inject", "header %s of %s is injected twice", in.Header, in.Host))
			}
			seenInject[key] = true
			if !p.hostAllowed(in.Host) {
				errs = append(errs, ferr(ip+".inject.host", "%q is not allowed by any host rule in network.allow: the secret would never be sent", in.Host))
			}
		}
	}
	p.Credentials.ServiceAccountToken = deref(cr.ServiceAccountToken, false)
	return errs
}

// dns1123 is a Kubernetes namespace's or Secret's name; secretKey a
// Secret's key.
var (
	dns1123   = lazy(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
	secretKey = lazy(`^[-._a-zA-Z0-9]+$`)
)

// checkSecretRef names what of r is not a Secret's key.
func checkSecretRef(path string, r SecretRef) []error {
	var errs []error
	if len(r.Namespace) > 63 || !dns1123.MatchString(r.Namespace) || strings.Contains(r.Namespace, ".") {
		errs = append(errs, ferr(path+".namespace", "%q is not a namespace's name", r.Namespace))
	}
	if len(r.Name) > 253 || !dns1123.MatchString(r.Name) {
		errs = append(errs, ferr(path+".name", "%q is not a Secret's name", r.Name))
	}
	if len(r.Key) > 253 || !secretKey.MatchString(r.Key) || r.Key == "." || r.Key == ".." {
		errs = append(errs, ferr(path+".key", "%q is not a Secret's key (letters, digits, '-', '_', '.')", r.Key))
	}
	return errs
}

// ValidateSecretRef says what of r is not a Secret's key (nil when it is
// one), so that a path made of it stays inside its directory.
func ValidateSecretRef(r SecretRef) error { return errors.Join(checkSecretRef("secretRef", r)...) }

// claimKeyRE is a claim key's name: it goes into an annotation's name
// (agentbox.dev/key.NAME).
var claimKeyRE = lazy(`^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$`)

// ValidClaimKey says what is wrong with a claim key's name.
func ValidClaimKey(name string) error {
	if !claimKeyRE.MatchString(name) {
		return fmt.Errorf("%q is not a claim key's name (1 to 40 of a-z, 0-9 and '-', starting and ending with a letter or digit)", name)
	}
	return nil
}
