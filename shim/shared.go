package shim

// The cluster's shared checkpoint store: a suspend's image written to it,
// and taken from it into the node's store for a restore.

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/control"
)

// restoreKeyWait bounds how long a restore waits for the node agent to
// place its image's data key (it asks the broker once the pod is bound).
const restoreKeyWait = 60 * time.Second

// sharedOf is the cluster's shared store (nil when the config names none):
// with the broker's public key, this node wraps and the node agent places
// what the broker unwrapped; with a key file, the node does both.
func sharedOf(cfg *config.Config) (*checkpoint.Shared, error) {
	c := cfg.Checkpoint
	if c.SharedDir == "" {
		return nil, nil
	}
	if c.SharedKeyFile != "" {
		kek, err := checkpoint.LoadSymmetricKEK(c.SharedKeyFile)
		if err != nil {
			return nil, err
		}
		return checkpoint.OpenShared(c.SharedDir, kek, kek)
	}
	pub, err := checkpoint.LoadPublicKEK(c.SharedPublicKey)
	if err != nil {
		return nil, err
	}
	return checkpoint.OpenShared(c.SharedDir, pub, checkpoint.KeyDir{Dir: c.KeysDir, Wait: restoreKeyWait})
}

// shareImage writes a suspend's image to the cluster's shared store,
// encrypted, so that the sandbox can resume on another node. A failure is
// recorded; the image stays on this node.
func shareImage(sb *sandboxState, store *checkpoint.Store, cp *control.Checkpointed) {
	sh, err := sharedOf(sb.cfg)
	if sh == nil && err == nil {
		return
	}
	start := time.Now()
	var n int64
	if err == nil {
		n, err = store.Export(cp.Name, sh)
	}
	took := time.Since(start)
	if err != nil {
		sb.audit.trail.Emit(audit.TypeCheckpointShared.New("Failure", fmt.Sprintf("checkpoint %s not written to the shared store (%v): it resumes only on this node", cp.Name, err),
			map[string]string{"checkpoint": cp.Name, "error": err.Error()}), true)
		return
	}
	cp.SharedBytes, cp.SharedMillis = n, took.Milliseconds()
	sb.audit.trail.Emit(audit.TypeCheckpointShared.New("Success", fmt.Sprintf("checkpoint %s written to the shared store %s, encrypted: %d bytes in %v", cp.Name, sh.Dir, n, took.Round(time.Millisecond)),
		map[string]string{"checkpoint": cp.Name, "store": sh.Dir, "bytes": fmt.Sprint(n), "took": took.Round(time.Millisecond).String(), "direction": "export"}), true)
}

// importShared takes checkpoint name from the shared store into the
// node's when the node's lacks it, and says what it did ("" : nothing).
func importShared(cfg *config.Config, store *checkpoint.Store, name string) (string, error) {
	if _, err := os.Lstat(filepath.Join(store.Dir, name)); err == nil || checkpoint.ValidName(name) != nil {
		return "", nil
	}
	sh, err := sharedOf(cfg)
	if sh == nil || err != nil || !sh.Has(name) {
		return "", err
	}
	start := time.Now()
	err = store.Import(name, sh)
	// The image's data key has served: it goes, imported or not.
	checkpoint.KeyDir{Dir: cfg.Checkpoint.KeysDir}.Remove(name)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("taken from the shared store %s in %v", sh.Dir, time.Since(start).Round(time.Millisecond)), nil
}
