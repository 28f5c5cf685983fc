package shim

// Rotation: the secrets a sandbox's gateway injects are read from node
// files (a role's file, or the file the node agent keeps for a Kubernetes
// Secret). When one changes, the gateway's next requests carry the new
// value, without restarting the pod; the trail says so, never the value.

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/egressgw"
	"agentbox.dev/agentbox/internal/netpolicy"
)

// rotateEvery is how often the shim looks at the secrets' files.
const rotateEvery = 2 * time.Second

// fileStamp is what tells a rewritten file: an atomic rename gives a new
// inode, an edit in place a new mtime or size.
type fileStamp struct {
	ino, size int64
	mtime     time.Time
	missing   bool
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{missing: true}
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(sys.Ino)
	}
	return st
}

// watchSecrets re-reads the injected secrets when a file of theirs
// changes, until the gateway closes. A file that cannot be read (a Secret
// deleted, a file half-written) is recorded once, and the gateway keeps
// the values it has. The files are those of the secrets injected now: a
// claim's keys from its binding on (claimkeys.go).
func watchSecrets(sb *sandboxState, pl *netpolicy.Plan, gw *egressgw.Gateway) {
	if len(pl.Injects) == 0 {
		return
	}
	dir := sb.cfg.Policy.SecretsDir
	stamps := map[string]fileStamp{}
	for _, in := range sb.injectsNow(pl) {
		stamps[in.Path(dir)] = stampOf(in.Path(dir))
	}
	failing := ""
	t := time.NewTicker(rotateEvery)
	defer t.Stop()
	for {
		select {
		case <-gw.Done():
			return
		case <-t.C:
		}
		failing = rotateOnce(sb, pl, gw, stamps, failing)
	}
}

// rotateOnce hands the gateway the secrets whose files changed since
// stamps, and says what fails now ("" nothing).
func rotateOnce(sb *sandboxState, pl *netpolicy.Plan, gw *egressgw.Gateway, stamps map[string]fileStamp, failing string) string {
	dir := sb.cfg.Policy.SecretsDir
	// Held from reading the sources to handing them over: a claim's
	// binding does not interleave.
	sb.secretsMu.Lock()
	defer sb.secretsMu.Unlock()
	injects := sb.injectsNow(pl)
	var changed []netpolicy.Inject
	for _, in := range injects {
		path := in.Path(dir)
		if st := stampOf(path); st != stamps[path] {
			stamps[path] = st
			changed = append(changed, in)
		}
	}
	if len(changed) == 0 {
		return failing
	}
	secrets, err := injectedSecrets(sb, injects)
	if err != nil {
		if err.Error() != failing {
			sb.audit.trail.Emit(audit.TypeSecretRotated.New("Failure", fmt.Sprintf("an injected secret's source changed and cannot be read (%v): the gateway keeps the value it had", err), nil), true)
		}
		return err.Error()
	}
	gw.SetSecrets(secrets)
	for _, in := range changed {
		sb.audit.trail.Emit(audit.TypeSecretRotated.New("Success", fmt.Sprintf("the secret injected as %s toward %s changed (%s): the gateway's next requests carry the new value", in.Header, in.Host, in.Source()),
			map[string]string{"host": in.Host, "header": in.Header, "source": in.Source()}), true)
	}
	return ""
}
