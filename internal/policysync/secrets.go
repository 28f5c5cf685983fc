package policysync

// Keys from Kubernetes Secrets: a role's injected secret may name a
// Secret's key (secretRef) instead of a node file. The node agent reads no
// Secret itself: it asks the cluster's broker (internal/broker), which
// gives it the keys the cluster roles of the agentbox pods bound to this
// node inject, and nothing else, for as long as such a pod is bound here.
// It keeps each key's value in a file of its own under the secrets
// directory (root's alone), which the shim reads as it reads a role's
// file, and removes the files of keys no pod here needs any more. A
// rotated Secret is rewritten there, and the shim's watch hands it to the
// gateway; the value never reaches a pod, an annotation, a log or the
// trail.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/policy"
	"agentbox.dev/agentbox/internal/privdir"
)

// SyncSecrets writes the value of every key the broker gives this node
// into the secrets directory, when it changed, and removes the files of
// keys it no longer gives. A key the broker could not read keeps the file
// it had (the gateway keeps injecting the last value) and is recorded; a
// broker that cannot be reached changes nothing.
func (a *Agent) SyncSecrets(ctx context.Context) error {
	a.syncBrokerKey(ctx)
	if a.SecretsDir == "" || a.Broker == nil {
		return nil
	}
	resp, err := a.Broker.Keys(ctx)
	if err != nil {
		if state := err.Error(); a.keysState != state {
			a.keysState = state
			a.Log.WithError(err).Warn("the broker's keys for this node")
			a.recordSecret("Failure", fmt.Sprintf("the broker did not give this node's keys (%v): the node keeps the ones it has", err), "")
		}
		return nil
	}
	a.keysState = ""
	if err := ensurePrivateDir(a.SecretsDir); err != nil {
		return err
	}
	if a.secretState == nil {
		a.secretState = map[policy.SecretRef]string{}
	}
	given := map[policy.SecretRef]bool{}
	for _, k := range resp.Keys {
		r := k.SecretRef
		if policy.ValidateSecretRef(r) != nil {
			continue
		}
		given[r] = true
		state := "ok"
		changed, err := writeSecretFile(r.Path(a.SecretsDir), k.Value)
		switch {
		case err != nil:
			state = err.Error()
		case changed:
			what := "written"
			if a.secretState[r] == "ok" {
				what = "rotated"
			}
			a.Log.WithField("secret", r.String()).Infof("Secret %s: its value %s to the node", r, what)
			a.recordSecret("Success", fmt.Sprintf("Secret %s: its value %s to the node (%s), for a pod bound here", r, what, r.Path(a.SecretsDir)), r.String())
		}
		if state != "ok" && a.secretState[r] != state {
			a.Log.WithField("secret", r.String()).Warn(state)
			a.recordSecret("Failure", fmt.Sprintf("Secret %s: %s; the node keeps the value it had", r, state), r.String())
		}
		a.secretState[r] = state
	}
	if e := strings.Join(resp.Errors, "; "); e != a.keysErrors {
		if e != "" {
			a.Log.Warn("the broker could not read some of this node's keys: " + e)
			a.recordSecret("Failure", "the broker could not read some of this node's keys (the node keeps the values it had): "+e, "")
		}
		a.keysErrors = e
	}
	for r := range a.secretState {
		if given[r] || slices.Contains(resp.Unreadable, r) {
			continue
		}
		delete(a.secretState, r)
		if err := os.Remove(r.Path(a.SecretsDir)); err == nil {
			os.Remove(filepath.Dir(r.Path(a.SecretsDir)))
			os.Remove(filepath.Dir(filepath.Dir(r.Path(a.SecretsDir))))
			a.recordSecret("Success", fmt.Sprintf("Secret %s: no pod bound to this node needs it now: removed from the node", r), r.String())
		}
	}
	return nil
}

// recordSecret is a node trail record of a Secret kept on the node: its
// name and path, never its value.
func (a *Agent) recordSecret(status, msg, source string) {
	if a.Trail == nil {
		return
	}
	d := map[string]string{"node": a.NodeName}
	if source != "" {
		d["source"] = "Secret " + source
	}
	a.Trail.Emit(audit.TypeSecretRotated.New(status, msg, d), true)
}

// errNoBroker is what a node without a broker cannot do.
var errNoBroker = errors.New("no broker is configured (agentbox sync --broker-url)")

// ensurePrivateDir makes dir root's alone (0700), refusing one that is a
// symlink, that another user owns or that others may enter.
func ensurePrivateDir(dir string) error {
	if err := privdir.Ensure(dir, privdir.Private); err != nil {
		return fmt.Errorf("secrets directory: %w: it must be a directory of mode 0700, uid %d's", err, os.Geteuid())
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
