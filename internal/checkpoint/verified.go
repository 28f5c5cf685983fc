package checkpoint

// The cache of verified images: a file's digest is computed once, and
// trusted again while its size, times and inode are unchanged.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// verifiedDir remembers, per checkpoint, each file's identity (device,
// inode, size, modification and change times) as it was when its digest
// last matched the manifest: a file with the same identity is not hashed
// again (a template is restored by every new pod of its role). Any write
// to a file changes its change time, which no one but root can set; the
// record is under the node key too.
const verifiedDir = ".verified"

type fileStamp struct {
	Name  string `json:"name"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
}

type verifiedRecord struct {
	Digest string      `json:"digest"`
	Files  []fileStamp `json:"files"`
	MAC    string      `json:"mac"`
}

// verifiedContext separates a verification record's MAC from a manifest's.
const verifiedContext = "agentbox checkpoint verified v1\n"

// verifiedSigned is what a verification record's MAC covers.
func (v *verifiedRecord) verifiedSigned() any {
	return struct {
		D string
		F []fileStamp
	}{v.Digest, v.Files}
}

// loadVerified is what an earlier Open of the checkpoint (with the
// manifest of digest) found to match, by file name (none if anything is
// off).
func (s *Store) loadVerified(name, digest string) map[string]fileStamp {
	dfd, err := unix.Open(filepath.Join(s.Dir, verifiedDir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(dfd)
	if ownedDir(dfd, verifiedDir) != nil {
		return nil
	}
	b, err := readAt(dfd, name+".json", 1<<20)
	if err != nil {
		return nil
	}
	var v verifiedRecord
	if json.Unmarshal(b, &v) != nil || v.Digest != digest || !s.signedBy(verifiedContext, v.verifiedSigned(), v.MAC) {
		return nil
	}
	out := map[string]fileStamp{}
	for _, f := range v.Files {
		out[f.Name] = f
	}
	return out
}

// saveVerified records the stamps of files that matched (best effort: a
// failure only means hashing again next time).
func (s *Store) saveVerified(name, digest string, stamps []fileStamp) {
	dir := filepath.Join(s.Dir, verifiedDir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return
	}
	v := verifiedRecord{Digest: digest, Files: stamps}
	var err error
	if v.MAC, err = s.mac(verifiedContext, v.verifiedSigned()); err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.tmp", name, os.Getpid()))
	if writeFileSync(tmp, b) != nil || os.Rename(tmp, filepath.Join(dir, name+".json")) != nil {
		os.Remove(tmp)
	}
}

// checkFile opens an image file and stamps it; it hashes it (sum set)
// unless seen holds the same stamp.
func (s *Store) checkFile(dfd int, f File, seen map[string]fileStamp) (fileStamp, string, error) {
	fh, err := openAt(dfd, f.Name)
	if err != nil {
		return fileStamp{}, "", err
	}
	defer fh.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(fh.Fd()), &st); err != nil {
		return fileStamp{}, "", err
	}
	stamp := fileStamp{Name: f.Name, Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	if prev, ok := seen[f.Name]; ok && prev == stamp && stamp.Size == f.Size {
		return stamp, "", nil
	}
	sum, n, err := sha256Of(fh)
	if err != nil {
		return stamp, "", err
	}
	stamp.Size = n
	return stamp, sum, nil
}
