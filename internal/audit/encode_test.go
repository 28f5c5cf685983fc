package audit

import (
	"encoding/json"
	"reflect"
	"testing"
)

func sampleRecords() []*Record {
	res, st, sig := int64(3), int32(0), int32(9)
	uid := uint32(65532)
	return []*Record{
		{Time: "t", ClassName: "Base Event", Event: "agentbox/gap", Counts: map[string]uint64{"b": 2, "a": 1}, Detail: map[string]string{"z": "<&>", "y": "\u2028"}},
		{Time: "t", ClassUID: 1001, ClassName: "File System Activity", ActivityID: 14, ActivityName: "Open", Status: "Success", Result: &res,
			Process: &Process{PID: 1, TID: 2, PPID: 0, Name: "cat\x00\x1f", Argv: []string{"a\"b", "c\\d", "\xff\xfe"}, Env: []string{"A=b"}, Cwd: "/", UID: &uid, GID: &uid, ExitSts: &st, ExitSignal: &sig, ChildPID: 4},
			File:    &File{Path: "/etc/passwd", Flags: "O_RDONLY", Mode: 0o644}, Dst: &Endpoint{Family: "inet", IP: "10.0.0.1", Port: 80, Path: "", Type: "stream"},
			Message: "tab\there\nnewline", Event: "syscall/openat", Sandbox: "sb", Container: "c", PodNamespace: "ns", PodName: "p", Role: "r", PolicyDigest: "d", Seq: 7, PrevHash: "abc"},
		{Process: &Process{}, Dst: &Endpoint{}, File: &File{}},
	}
}

func sameAsEncodingJSON(t *testing.T, r *Record) {
	t.Helper()
	want, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	got := r.appendJSON(nil)
	var a, b any
	if err := json.Unmarshal(got, &a); err != nil {
		t.Fatalf("hand-written encoding is not JSON: %v\n%s", err, got)
	}
	json.Unmarshal(want, &b)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("encodings differ:\n got %s\nwant %s", got, want)
	}
}

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	for _, r := range sampleRecords() {
		sameAsEncodingJSON(t, r)
	}
}

// FuzzEncode: for any strings, the hand-written encoder and encoding/json
// decode to the same value.
func FuzzEncode(f *testing.F) {
	f.Add("a", "b\x00", "\xff", "<\u2028>")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		r := sampleRecords()[1]
		r.Message, r.Process.Name, r.Process.Argv, r.File.Path = a, b, []string{c, d}, d
		r.Detail = map[string]string{a: b, c: d}
		r.Counts = map[string]uint64{b: 1}
		sameAsEncodingJSON(t, r)
	})
}
