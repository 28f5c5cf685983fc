package policysync

// Keys from Kubernetes Secrets: a role's injected secret may name a
// Secret's key (secretRef) instead of a node file. The node agent reads
// only the Secrets the node's roles name, one GET each (RBAC can scope its
// service account to those names), and keeps each key's value in a file of
// its own under the secrets directory (root's alone), which the shim reads
// as it reads a role's file. A rotated Secret is rewritten there, and the
// shim's watch hands it to the gateway; the value never reaches a pod, an
// annotation, a log or the trail.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/policy"
)

// SecretsGVR is the core Secret resource.
var SecretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// maxSecret bounds a key's value (the shim reads at most 64 KiB).
const maxSecret = 64 << 10

// SecretRefs are the Secrets' keys the roles of a policy set name, each
// once, sorted (inherited ones too: they are read from each role's
// profile). Pure but for the set.
func SecretRefs(set *policy.Set) []policy.SecretRef {
	seen := map[policy.SecretRef]bool{}
	var out []policy.SecretRef
	names := make([]string, 0, len(set.Roles))
	for n := range set.Roles {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p, err := set.Profile(n)
		if err != nil {
			continue
		}
		for _, s := range p.Credentials.Secrets {
			if s.SecretRef != nil && !seen[*s.SecretRef] {
				seen[*s.SecretRef] = true
				out = append(out, *s.SecretRef)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// SyncSecrets writes the value of every Secret key the node's roles name
// into the secrets directory, when it changed, and removes the files of
// keys no role names any more. A Secret that cannot be read keeps the file
// it had (the gateway keeps injecting the last value) and is recorded.
func (a *Agent) SyncSecrets(ctx context.Context) error {
	a.syncCheckpointKey(ctx)
	if a.SecretsDir == "" {
		return nil
	}
	set, err := policy.LoadPaths(a.PolicyDir)
	if err != nil {
		return nil // Sync reports a set that does not load
	}
	refs := SecretRefs(set)
	if len(refs) == 0 && a.secretState == nil {
		return nil
	}
	if err := ensurePrivateDir(a.SecretsDir); err != nil {
		return err
	}
	if a.secretState == nil {
		a.secretState = map[policy.SecretRef]string{}
	}
	named := map[policy.SecretRef]bool{}
	for _, r := range refs {
		named[r] = true
		value, err := a.readSecret(ctx, r)
		state := "ok"
		if err != nil {
			state = err.Error()
		} else {
			var changed bool
			changed, err = writeSecretFile(r.Path(a.SecretsDir), value)
			switch {
			case err != nil:
				state = err.Error()
			case changed:
				what := "written"
				if a.secretState[r] == "ok" {
					what = "rotated"
				}
				a.Log.WithField("secret", r.String()).Infof("Secret %s: its value %s to the node", r, what)
				a.recordSecret("Success", fmt.Sprintf("Secret %s: its value %s to the node (%s)", r, what, r.Path(a.SecretsDir)), r)
			}
		}
		if state != "ok" && a.secretState[r] != state {
			a.Log.WithField("secret", r.String()).Warn(state)
			a.recordSecret("Failure", fmt.Sprintf("Secret %s: %s; the node keeps the value it had", r, state), r)
		}
		a.secretState[r] = state
	}
	for r := range a.secretState {
		if named[r] {
			continue
		}
		delete(a.secretState, r)
		if err := os.Remove(r.Path(a.SecretsDir)); err == nil {
			os.Remove(filepath.Dir(r.Path(a.SecretsDir)))
			os.Remove(filepath.Dir(filepath.Dir(r.Path(a.SecretsDir))))
			a.recordSecret("Success", fmt.Sprintf("Secret %s: no role names it now: removed from the node", r), r)
		}
	}
	return nil
}

// recordSecret is a node trail record of a Secret kept on the node: its
// name and path, never its value.
func (a *Agent) recordSecret(status, msg string, r policy.SecretRef) {
	if a.Trail == nil {
		return
	}
	a.Trail.Emit(audit.TypeSecretRotated.New(status, msg, map[string]string{"source": "Secret " + r.String(), "node": a.NodeName}), true)
}

// readSecret is one key's value, read with a GET of its Secret.
func (a *Agent) readSecret(ctx context.Context, r policy.SecretRef) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u, err := a.Client.Resource(SecretsGVR).Namespace(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("cannot read it (%v): may agentbox sync get it? (docs/agent-sandbox.md: a Role with its resourceNames)", err)
	}
	data, _, _ := unstructured.NestedStringMap(u.Object, "data")
	enc, ok := data[r.Key]
	if !ok {
		return nil, fmt.Errorf("it has no key %q", r.Key)
	}
	v, err := base64.StdEncoding.DecodeString(enc)
	switch {
	case err != nil:
		return nil, fmt.Errorf("key %q: %v", r.Key, err)
	case len(v) == 0:
		return nil, fmt.Errorf("key %q is empty", r.Key)
	case len(v) > maxSecret:
		return nil, fmt.Errorf("key %q: %d bytes, more than %d", r.Key, len(v), maxSecret)
	}
	return v, nil
}

// ensurePrivateDir makes dir root's alone (0700), refusing one that is a
// symlink or that others may enter.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("secrets directory %s: %v: it must be a directory of mode 0700", dir, st.Mode())
	}
	return nil
}

// writeSecretFile writes value to path (0600, in directories of 0700,
// atomically) unless it holds it already; it says whether it wrote.
func writeSecretFile(path string, value []byte) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && slices.Equal(old, value) {
		return false, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return false, err
	}
	tmp := f.Name()
	_, err = f.Write(value)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return false, errors.Join(fmt.Errorf("writing %s", path), err)
	}
	return true, nil
}

// syncCheckpointKey keeps the cluster's checkpoint key (the shared store's)
// from its Secret in its file, recording what cannot be read.
func (a *Agent) syncCheckpointKey(ctx context.Context) {
	r := a.CheckpointKey
	if r == nil || a.CheckpointKeyFile == "" {
		return
	}
	value, err := a.readSecret(ctx, *r)
	if err == nil && len(value) != 32 {
		err = fmt.Errorf("key %q: %d bytes, want 32", r.Key, len(value))
	}
	var changed bool
	if err == nil {
		changed, err = writeSecretFile(a.CheckpointKeyFile, value)
	}
	state := "ok"
	if err != nil {
		state = err.Error()
	}
	if a.keyState != state {
		status, msg := "Success", fmt.Sprintf("the cluster's checkpoint key: Secret %s kept in %s", r, a.CheckpointKeyFile)
		if err != nil {
			status, msg = "Failure", fmt.Sprintf("the cluster's checkpoint key: Secret %s: %v", r, err)
		}
		if err != nil || changed {
			a.recordSecret(status, msg, *r)
		}
		a.keyState = state
	}
}
