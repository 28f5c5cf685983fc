package policysync

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"agentbox.dev/agentbox/internal/kubeapi"
	"agentbox.dev/agentbox/internal/policy"
)

// Outcome is what trying a snapshot on a node came to.
type Outcome struct {
	// Applied: the snapshot is now the node's (it was valid and differed).
	Applied bool
	// Unchanged: the node already enforces exactly this snapshot.
	Unchanged bool
	// OldDigest is the digest of the snapshot the node enforced before
	// ("" when it had none); NewDigest the one tried.
	OldDigest, NewDigest string
	// ObjectProblems are the loader's findings, by object key
	// ("AgentRole/name"), as `agentbox policy validate` prints them.
	ObjectProblems map[string][]string
	// NodeProblems are findings in the node's own files, which make
	// every snapshot fail until an admin fixes them.
	NodeProblems []string
	// Changes says what differs from the old snapshot, object by object.
	Changes []string
}

// tempPrefix names a snapshot being written: hidden, so neither the shim
// nor the loader ever reads a half-written one.
const tempPrefix = "." + FileName + ".new-"

// beforeRename is a test hook: a crash between writing the new snapshot
// and renaming it into place.
var beforeRename = func() error { return nil }

// Apply validates s with the shim's loader, together with the node's own
// policy files in dir, and if the whole set loads, makes it the node's
// snapshot: written to a hidden file, synced, then renamed over FileName
// (an atomic swap: the shim reads the old file or the new one, never a
// mix). An invalid set is never written: the node keeps its last good
// snapshot, and the outcome says why, object by object.
func Apply(dir string, s *Snapshot) (Outcome, error) {
	out := Outcome{NewDigest: s.Digest, ObjectProblems: map[string][]string{}}
	path := filepath.Join(dir, FileName)
	old, err := os.ReadFile(path)
	switch {
	case err == nil:
		out.OldDigest = digest(old)
	case !errors.Is(err, os.ErrNotExist):
		return out, fmt.Errorf("read the current snapshot: %w", err)
	}
	out.Changes = changes(parseObjects(old), s.Objects)
	removeStale(dir)

	for key, msg := range s.Invalid {
		out.ObjectProblems[key] = append(out.ObjectProblems[key], msg)
	}
	tmp, err := writeTemp(dir, s.Data)
	if err != nil {
		return out, fmt.Errorf("write the new snapshot: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			os.Remove(tmp)
		}
	}()

	files, err := adminFiles(dir)
	if err != nil {
		return out, err
	}
	if _, err := policy.LoadPaths(append(files, tmp)...); err != nil {
		// A problem is an object's when the first place it names in the
		// new snapshot is that object's document: a problem in it, or one
		// in the node's own file because of it (a role defined in both).
		at := regexp.MustCompile(regexp.QuoteMeta(tmp) + `:([0-9]+)`)
		for _, e := range policy.Errors(err) {
			msg, key := e.Error(), ""
			if m := at.FindStringSubmatch(msg); m != nil {
				line, _ := strconv.Atoi(m[1])
				key = s.objectAt(line)
			}
			msg = strings.ReplaceAll(msg, tmp, FileName)
			if key == "" {
				out.NodeProblems = append(out.NodeProblems, msg)
				continue
			}
			out.ObjectProblems[key] = append(out.ObjectProblems[key], msg)
		}
	}
	if len(out.ObjectProblems) > 0 || len(out.NodeProblems) > 0 {
		// The shim adds these to the refusal of a pod claiming a role
		// whose cluster object is not in force.
		if err := writeRefusals(dir, s, out); err != nil {
			return out, err
		}
		return out, nil
	}
	if err := os.Remove(filepath.Join(dir, policy.ClusterRefusedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return out, fmt.Errorf("remove the refusal note: %w", err)
	}
	if out.OldDigest == s.Digest {
		out.Unchanged = true
		return out, nil
	}
	if err := beforeRename(); err != nil {
		return out, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return out, fmt.Errorf("swap in the new snapshot: %w", err)
	}
	committed = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	out.Applied = true
	return out, nil
}

// adminFiles are the node admin's policy files in dir: every policy file
// but the agent's own.
func adminFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("policy directory: %w", err)
	}
	var files []string
	for _, e := range entries {
		if e.Name() != FileName && !e.IsDir() && policy.PolicyFileName(e.Name()) {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	return files, nil
}

// removeStale removes snapshots a crashed agent left half-written.
func removeStale(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

var headerRE = regexp.MustCompile(`(?m)^# (AgentRole|AgentRoleBinding) ([a-z0-9-]+) generation ([0-9]+)$`)

// parseObjects reads the objects a snapshot holds from its headers.
func parseObjects(data []byte) []kubeapi.ObjectRef {
	var out []kubeapi.ObjectRef
	for _, m := range headerRE.FindAllSubmatch(data, -1) {
		g, _ := strconv.ParseInt(string(m[3]), 10, 64)
		out = append(out, kubeapi.ObjectRef{Kind: string(m[1]), Name: string(m[2]), Generation: g})
	}
	return out
}

// changes lists what differs between two snapshots' objects.
func changes(old, new []kubeapi.ObjectRef) []string {
	before := map[string]int64{}
	for _, o := range old {
		before[o.Kind+"/"+o.Name] = o.Generation
	}
	var out []string
	for _, o := range new {
		key := o.Kind + "/" + o.Name
		g, ok := before[key]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("added %s (generation %d)", key, o.Generation))
		case g != o.Generation:
			out = append(out, fmt.Sprintf("changed %s (generation %d -> %d)", key, g, o.Generation))
		}
		delete(before, key)
	}
	for key := range before {
		out = append(out, "removed "+key)
	}
	sort.Strings(out)
	return out
}

// writeRefusals notes, by role, why the newest set was refused
// (policy.ClusterRefusedFile), atomically.
func writeRefusals(dir string, s *Snapshot, out Outcome) error {
	r := policy.ClusterRefusals{Roles: map[string][]string{}, Bindings: map[string][]string{}}
	for key, ps := range out.ObjectProblems {
		role := s.roleOf[key]
		if role == "" {
			continue
		}
		if strings.HasPrefix(key, kubeapi.KindRoleBinding+"/") {
			r.Bindings[role] = append(r.Bindings[role], ps...)
		} else {
			r.Roles[role] = append(r.Roles[role], ps...)
		}
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := writeTemp(dir, data)
	if err != nil {
		return fmt.Errorf("write the refusal note: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, policy.ClusterRefusedFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write the refusal note: %w", err)
	}
	return nil
}

// writeTemp writes data to a new hidden file in dir (tempPrefix: neither
// the loader nor the shim reads it) and syncs it, ready to be renamed into
// place. It returns the file's path; on error nothing is left.
func writeTemp(dir string, data []byte) (string, error) {
	f, err := os.CreateTemp(dir, tempPrefix)
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}
