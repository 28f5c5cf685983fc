package policysync

// The node's checkpoint stores, kept clean: a suspend image goes with its
// Sandbox, a fork image when no Sandbox names it.

import (
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/checkpoint"
)

// forkKeep is how long a fork image stays at least: its copies are made
// after it, and the node's view of them lags the API.
const forkKeep = 2 * time.Minute

// gcEvery is how often the node agent looks for the images of Sandboxes
// that are gone.
const gcEvery = 30 * time.Second

// gcCheckpoints removes the suspend images of Sandboxes the API no longer
// has (deleted while suspended) and the fork images no Sandbox names, and
// records each in the node's trail.
func (a *Agent) gcCheckpoints() {
	inf := a.sandboxInf.Load()
	if a.CheckpointDir == "" && a.SharedDir == "" || inf == nil || time.Since(a.lastGC) < gcEvery {
		return
	}
	a.lastGC = time.Now()
	live, named := map[string]bool{}, map[string]bool{}
	for _, item := range (*inf).GetStore().List() {
		if u, ok := item.(*unstructured.Unstructured); ok {
			live[strings.ToLower(string(u.GetUID()))] = true
			if r, _, _ := unstructured.NestedString(u.Object, "spec", "podTemplate", "metadata", "annotations", restoreAnnotation); r != "" {
				named[r] = true
			}
		}
	}
	a.removeStale(a.CheckpointDir, "the node's store", (&checkpoint.Store{Dir: a.CheckpointDir}).Remove, live, named)
	a.removeStale(a.SharedDir, "the shared store", func(name string) error { return checkpoint.RemoveShared(a.SharedDir, name) }, live, named)
}

// removeStale removes the images in the store at dir (none: "") whose
// time is over (staleImage), and records each in the node's trail.
func (a *Agent) removeStale(dir, what string, remove func(name string) error, live, named map[string]bool) {
	if dir == "" {
		return
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		why, detail := staleImage(e, live, named)
		if why == "" {
			continue
		}
		if err := remove(e.Name()); err != nil {
			a.Log.WithError(err).Warn("removing checkpoint " + e.Name() + " from " + what)
			continue
		}
		a.Log.Infof("checkpoint %s removed from %s: %s", e.Name(), what, why)
		if a.Trail != nil {
			detail["checkpoint"], detail["node"], detail["removed"] = e.Name(), a.NodeName, "true"
			a.Trail.Emit(audit.TypeCheckpointed.New("Success", fmt.Sprintf("checkpoint %s removed from %s: %s", e.Name(), what, why), detail), true)
		}
	}
}

// staleImage says why a store's image may go ("": it stays): a suspend
// image of a Sandbox the API no longer has (live: the Sandboxes' UIDs),
// or a fork image no Sandbox names (named: the Sandboxes' restore-from)
// once older than forkKeep.
func staleImage(e os.DirEntry, live, named map[string]bool) (string, map[string]string) {
	if !e.IsDir() {
		return "", nil
	}
	if uid, ok := suspendUID(e.Name()); ok && !live[uid] {
		return fmt.Sprintf("its Sandbox (uid %s) was deleted", uid), map[string]string{"sandbox_uid": uid}
	}
	if broker.ForkImage(e.Name()) && !named[e.Name()] {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) >= forkKeep {
			return "no Sandbox names it (a fork image)", map[string]string{}
		}
	}
	return "", nil
}
