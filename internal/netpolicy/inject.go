package netpolicy

import "agentbox.dev/agentbox/internal/policy"

// Inject is a secret the gateway adds to one host's requests (its value is
// read by the shim, never held in a plan).
type Inject struct {
	// Host is the exact name, lower case.
	Host string
	// Header is canonical ("Authorization").
	Header string
	// Format holds policy.SecretToken where the secret goes.
	Format string
	// Env is the variable holding the placeholder ("" for none); File is
	// the node file of the secret, or Ref the Kubernetes Secret's key the
	// node agent keeps on the node, or FromClaim the name of the key a
	// SandboxClaim gives the sandbox's task (Ref is set when it is bound).
	Env, File string
	Ref       *policy.SecretRef
	FromClaim string
}

// Source says where an injected secret's value comes from.
func (in Inject) Source() string {
	if in.FromClaim != "" && in.Ref == nil {
		return "the claim's key " + in.FromClaim + " (not bound)"
	}
	if in.Ref != nil {
		return "Secret " + in.Ref.String()
	}
	return in.File
}

// Path is the node file holding the secret's value (secretsDir: where the
// node agent keeps Kubernetes Secrets); "" for a claim's key not bound.
func (in Inject) Path(secretsDir string) string {
	if in.Ref != nil {
		return in.Ref.Path(secretsDir)
	}
	return in.File
}

// Same says whether in and o inject the same source the same way (a
// Kubernetes Secret's key compared by name, not by pointer: two compiles
// of one role are the same).
func (in Inject) Same(o Inject) bool {
	a, b := in, o
	a.Ref, b.Ref = nil, nil
	return a == b && (in.Ref == nil) == (o.Ref == nil) && (in.Ref == nil || *in.Ref == *o.Ref)
}

// Bound says whether the secret has a source now: a claim's key has none
// until its claim.
func (in Inject) Bound() bool { return in.FromClaim == "" || in.Ref != nil }
