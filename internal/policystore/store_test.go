package policystore

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/policy"
)

// storeRoles has what a lossy encoding would get wrong: a child's empty
// list that drops its parent's (absent, it would inherit it), a pointer to
// a zero value, a uid above int32, a map, host mounts, a secret, and
// bindings.
const storeRoles = `apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: base}
spec:
  filesystem: {writable: [/tmp], maskedPaths: [/proc/kallsyms]}
  process: {maxProcesses: 32, runAsUser: 1000}
  limits: {memory: 256Mi, wallClock: 10m}
  network: {portForward: [9090, 8080]}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: child}
spec:
  inherits: base
  filesystem: {writable: [/workspace]}
  limits: {memory: 1Gi}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: none-writable}
spec:
  inherits: base
  filesystem: {writable: [], noExecWritable: false}
  process: {runAsUser: 4294967294}
  network: {egress: allowlist, allow: [{host: mcp.example.test, ports: [443], api: mcp, tools: {allow: [search]}}]}
  limits: {mcp: {calls: 5, tools: {search: 2}}}
---
apiVersion: agentbox.dev/v1
kind: Role
metadata: {name: full}
spec:
  filesystem:
    rootfs: overlay
    hostMounts: [{path: /srv/models}, {path: /srv/cache, readOnly: false}]
  process: {capabilities: [NET_BIND_SERVICE], deniedSyscalls: [ptrace]}
  credentials:
    env: {allow: [PATH, "AGENT_*"]}
    secrets: [{env: API_TOKEN, file: /etc/agentbox/secrets/api}]
    serviceAccountToken: true
---
apiVersion: agentbox.dev/v1
kind: RoleBinding
metadata: {name: b}
spec:
  role: child
  subjects:
    - {namespace: agents}
    - {containerdNamespace: default, runtimeHandler: agentbox-coder}
`

// storeDir is a policy directory with storeRoles and two of the shipped
// roles' files.
func storeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"a.yaml": storeRoles}
	for _, f := range []string{"baseline.yaml", "coder.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "policies", f))
		if err != nil {
			t.Fatal(err)
		}
		files["b-"+f] = string(b)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func mustParse(t *testing.T, y string) *policy.Set {
	t.Helper()
	s, err := policy.Parse("t.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// warnings collects what a store warns of.
type warnings struct{ got []error }

func (w *warnings) store(dir string) Dir {
	return Dir{Path: dir, Warn: func(err error) { w.got = append(w.got, err) }}
}

// A set stored by one process is the set a second one gets, read back
// whole; the second did not parse the files (its entry, changed by hand,
// is what it gets); a changed file is never answered from the store.
func TestStoreServesTheSameSet(t *testing.T) {
	if buildID() == "" {
		t.Fatal("the test binary has no Go build ID: the store would never be used")
	}
	dir, st := storeDir(t), filepath.Join(t.TempDir(), "store")
	var w warnings
	want, err := policy.LoadPaths(dir)
	if err != nil {
		t.Fatal(err)
	}
	var first policy.Cache
	got, err := first.LoadStored(dir, w.store(st))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("first load: %v (equal %v)", err, reflect.DeepEqual(got, want))
	}
	entries, _ := filepath.Glob(filepath.Join(st, "*.set"))
	if len(entries) != 1 {
		t.Fatalf("entries after a load: %v", entries)
	}
	var second policy.Cache
	got, err = second.LoadStored(dir, w.store(st))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("second load, from the store: %v (equal %v)", err, reflect.DeepEqual(got, want))
	}
	if got.Roles["none-writable"].Spec.Filesystem.Writable == nil {
		t.Fatal("an empty writable list came back absent: the child would inherit its parent's")
	}
	if p, _ := got.Profile("none-writable"); len(p.Filesystem.Writable) != 0 {
		t.Fatalf("none-writable's profile from the store: writable %v", p.Filesystem.Writable)
	}

	// The entry is what a fresh process reads: marked by hand (a.yaml
	// renamed m.yaml in every source), the mark comes back.
	data, _ := os.ReadFile(entries[0])
	os.WriteFile(entries[0], []byte(strings.ReplaceAll(string(data), filepath.Join(dir, "a.yaml"), filepath.Join(dir, "m.yaml"))), 0o600)
	var third policy.Cache
	if got, _ = third.LoadStored(dir, w.store(st)); got.Roles["base"].Source != filepath.Join(dir, "m.yaml")+":1" {
		t.Fatalf("the store was not read: base's source %q", got.Roles["base"].Source)
	}

	// One byte changed, same size and modification time: parsed, not
	// served.
	path := filepath.Join(dir, "a.yaml")
	fi, _ := os.Stat(path)
	body, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(body), "memory: 1Gi", "memory: 2Gi", 1)), 0o644)
	os.Chtimes(path, fi.ModTime(), fi.ModTime())
	var fourth policy.Cache
	got, err = fourth.LoadStored(dir, w.store(st))
	if err != nil || *got.Roles["child"].Spec.Limits.Memory != "2Gi" || strings.Contains(got.Roles["base"].Source, "m.yaml") {
		t.Fatalf("a changed file was answered from the store: %v", err)
	}
	if len(w.got) != 0 {
		t.Fatalf("warnings: %v", w.got)
	}
}

// Another binary (another build ID) has its own entries for the same
// files; a binary without one has none.
func TestStoreKey(t *testing.T) {
	a, b := key("build-a", "digest"), key("build-b", "digest")
	if a == "" || b == "" || a == b || key("build-a", "other") == a {
		t.Fatalf("keys: %q %q", a, b)
	}
	if k := key("", "digest"); k != "" {
		t.Fatalf("a binary without a build ID keyed %q", k)
	}
}

// A broken directory is not stored, and its problems are reported in full
// every time; a corrupt entry is warned of and replaced; a store others
// may write is not used; neither fails the load.
func TestStoreRefusals(t *testing.T) {
	base := t.TempDir()
	broken := filepath.Join(base, "broken")
	os.Mkdir(broken, 0o755)
	os.WriteFile(filepath.Join(broken, "r.yaml"), []byte("apiVersion: agentbox.dev/v1\nkind: Role\nmetadata: {name: r}\nspec: {limits: {memory: lots}}\n"), 0o644)
	st := filepath.Join(base, "store")
	var w warnings
	for range 2 {
		var c policy.Cache
		if _, err := c.LoadStored(broken, w.store(st)); err == nil || !strings.Contains(err.Error(), "limits.memory") {
			t.Fatalf("broken directory: %v", err)
		}
	}
	if entries, _ := filepath.Glob(filepath.Join(st, "*")); len(entries) != 0 {
		t.Fatalf("a broken directory was stored: %v", entries)
	}

	dir := storeDir(t)
	var c policy.Cache
	c.LoadStored(dir, w.store(st))
	entries, _ := filepath.Glob(filepath.Join(st, "*.set"))
	good, _ := os.ReadFile(entries[0])
	other, _ := encodeStored(&storedSet{Key: "other", Set: mustParse(t, storeRoles)})
	for _, junk := range []string{"{", string(good[:len(good)/2]), string(good) + "\x00", string(other)} {
		os.WriteFile(entries[0], []byte(junk), 0o600)
		w.got = nil
		var fresh policy.Cache
		set, err := fresh.LoadStored(dir, w.store(st))
		if err != nil || len(set.Roles) < 4 || len(w.got) != 1 {
			t.Fatalf("entry %q: %v, warnings %v", junk, err, w.got)
		}
		if back, _ := os.ReadFile(entries[0]); string(back) != string(good) {
			t.Fatalf("entry %q was not replaced", junk)
		}
	}

	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	w.got = nil
	var d policy.Cache
	if _, err := d.LoadStored(dir, w.store(open)); err != nil || len(w.got) != 1 || !strings.Contains(w.got[0].Error(), "others may write to it") {
		t.Fatalf("a store others may write: %v, warnings %v", err, w.got)
	}
	if entries, _ := filepath.Glob(filepath.Join(open, "*")); len(entries) != 0 {
		t.Fatalf("a store others may write was written: %v", entries)
	}
}

// The store keeps at most maxStoredEntries, the newest.
func TestStorePrunes(t *testing.T) {
	st := Dir{Path: t.TempDir()}
	set := mustParse(t, storeRoles)
	for i := range maxStoredEntries + 4 {
		key := strings.Repeat(string(rune('a'+i)), 8)
		st.put(key, set)
		os.Chtimes(filepath.Join(st.Path, key+".set"), time.Unix(int64(1000+i), 0), time.Unix(int64(1000+i), 0))
	}
	entries, _ := os.ReadDir(st.Path)
	if len(entries) != maxStoredEntries {
		t.Fatalf("%d entries kept", len(entries))
	}
	if _, err := os.Stat(filepath.Join(st.Path, "aaaaaaaa.set")); !os.IsNotExist(err) {
		t.Fatalf("the oldest entry was kept: %v", err)
	}
}

// The encoding reads back what it wrote, nil apart from empty, and refuses
// what it cannot hold.
func TestStoreCodec(t *testing.T) {
	set := mustParse(t, storeRoles)
	data, err := encodeStored(&storedSet{Key: "k", Set: set})
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeStored(data)
	if err != nil || !reflect.DeepEqual(back.Set, set) {
		t.Fatalf("read back: %v (equal %v)", err, err == nil && reflect.DeepEqual(back.Set, set))
	}
	for i := range data {
		if _, err := decodeStored(data[:i]); err == nil {
			t.Fatalf("the entry's first %d of %d bytes read without an error", i, len(data))
		}
	}
	if _, err := decodeStored(append(data, 0)); err == nil {
		t.Error("a byte after the entry was read without an error")
	}
	// A flag that is not 0 or 1, and a length longer than what is left.
	for _, bad := range [][]byte{{1, 'k', 2}, {1, 'k', 1, 9}, {200, 1}} {
		if _, err := decodeStored(bad); err == nil {
			t.Errorf("%v read without an error", bad)
		}
	}
	// A type the store cannot hold whole is refused, not stored in part.
	for _, v := range []any{struct{ mu sync.Mutex }{}, map[int]string{1: "a"}, 1.5} {
		if _, err := encodeValue(nil, reflect.ValueOf(v)); err == nil {
			t.Errorf("%T was encoded", v)
		}
	}
}
