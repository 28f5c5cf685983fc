package policysync

// Shared checkpoints' data keys: an image in the shared store is encrypted
// with a data key of its own, wrapped by the cluster broker's key, which no
// node holds. When a pod bound to this node asks to be restored from such
// an image (agentbox.dev/restore-from) and the node's own store lacks it,
// the agent asks the broker to unwrap the key for that pod, and places it
// in the keys directory, where the shim's restore reads it (and removes
// it). The broker unwraps only for a node that the image's Sandbox's own
// pod is bound to; the key never reaches a log or the trail.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/checkpoint"
)

// dataKeyRetry is how soon a refused or failed unwrap is asked again.
const dataKeyRetry = 5 * time.Second

// placeDataKeys asks the broker for the data key of each shared image a pod
// of this node is to be restored from.
func (a *Agent) placeDataKeys(ctx context.Context) {
	if a.Broker == nil || a.SharedDir == "" || a.KeysDir == "" || a.podInf == nil {
		return
	}
	if a.dataKeys == nil {
		a.dataKeys, a.dataKeyAsked = map[string]string{}, map[string]time.Time{}
	}
	keys := checkpoint.KeyDir{Dir: a.KeysDir}
	for _, item := range a.podInf.GetStore().List() {
		pod, ok := item.(*unstructured.Unstructured)
		if !ok || pod.GetDeletionTimestamp() != nil {
			continue
		}
		name := pod.GetAnnotations()[restoreAnnotation]
		if name == "" || checkpoint.ValidName(name) != nil {
			continue
		}
		if _, err := os.Lstat(filepath.Join(a.CheckpointDir, name)); err == nil {
			continue // the node's own store has it
		}
		if _, err := os.Lstat(keys.Path(name)); err == nil {
			continue
		}
		if at, ok := a.dataKeyAsked[name]; ok && time.Since(at) < dataKeyRetry {
			continue
		}
		a.dataKeyAsked[name] = time.Now()
		err := a.placeDataKey(ctx, keys, pod, name)
		state := "ok"
		if err != nil {
			state = err.Error()
		}
		if a.dataKeys[name] == state {
			continue
		}
		a.dataKeys[name] = state
		pr := pod.GetNamespace() + "/" + pod.GetName()
		d := map[string]string{"checkpoint": name, "pod": pr, "node": a.NodeName, "direction": "data key"}
		if err != nil {
			a.Log.WithError(err).WithField("checkpoint", name).Warn("the data key of a shared image")
			if a.Trail != nil {
				a.Trail.Emit(audit.TypeCheckpointShared.New("Failure", fmt.Sprintf("the data key of checkpoint %s, for pod %s: %v", name, pr, err), d), true)
			}
			continue
		}
		a.Log.WithField("checkpoint", name).Infof("the broker unwrapped the data key of checkpoint %s for pod %s", name, pr)
		if a.Trail != nil {
			a.Trail.Emit(audit.TypeCheckpointShared.New("Success", fmt.Sprintf("the broker unwrapped the data key of checkpoint %s for pod %s, bound to this node", name, pr), d), true)
		}
	}
	for name := range a.dataKeyAsked {
		if time.Since(a.dataKeyAsked[name]) > time.Hour {
			delete(a.dataKeyAsked, name)
			delete(a.dataKeys, name)
		}
	}
}

// placeDataKey has one image's data key unwrapped for pod and places it.
func (a *Agent) placeDataKey(ctx context.Context, keys checkpoint.KeyDir, pod *unstructured.Unstructured, name string) error {
	raw, err := os.ReadFile(filepath.Join(a.SharedDir, name, checkpoint.DataKeyFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("checkpoint %s is not in the shared store %s", name, a.SharedDir)
		}
		return err
	}
	w, err := checkpoint.ParseWrappedKey(raw)
	if err != nil {
		return err
	}
	if w.Checkpoint != name {
		return fmt.Errorf("the shared store's data key of %s names %s", name, w.Checkpoint)
	}
	dek, err := a.Broker.Unwrap(ctx, broker.Ref{Namespace: pod.GetNamespace(), Name: pod.GetName(), UID: string(pod.GetUID())}, w)
	if err != nil {
		return err
	}
	return keys.WriteDataKey(name, dek)
}

// syncBrokerKey keeps the broker's public key where the shim wraps with it,
// recording a change or a failure once.
func (a *Agent) syncBrokerKey(ctx context.Context) {
	if a.Broker == nil || a.PublicKeyFile == "" {
		return
	}
	pem, err := a.Broker.PublicKey(ctx)
	var changed bool
	if err == nil {
		changed, err = writeSecretFile(a.PublicKeyFile, pem)
	}
	state := "ok"
	if err != nil {
		state = err.Error()
	}
	if state == a.pubState && !changed {
		return
	}
	a.pubState = state
	if a.Trail == nil {
		return
	}
	d := map[string]string{"node": a.NodeName, "source": "the broker's public key"}
	if err != nil {
		a.Trail.Emit(audit.TypeSecretRotated.New("Failure", fmt.Sprintf("the broker's public key (which wraps shared checkpoints' data keys) is not kept: %v", err), d), true)
		return
	}
	a.Trail.Emit(audit.TypeSecretRotated.New("Success", fmt.Sprintf("the broker's public key is kept in %s: shared checkpoints' data keys are wrapped with it", a.PublicKeyFile), d), true)
}
