package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// EventSandboxEnd is the record that closes a sandbox's trail.
const EventSandboxEnd = "agentbox/sandbox_end"

// EventGap reports events that were not recorded.
const EventGap = "agentbox/gap"

// VerifyResult is the outcome of verifying one sandbox's trail.
type VerifyResult struct {
	Sandbox string
	Files   []string
	Records uint64
	// Ended is set when the trail closes with an end record.
	Ended bool
	// FirstBad is the sequence number of the first record that is not
	// where the chain says it should be (0 when the trail is intact).
	FirstBad uint64
	// Problem says what is wrong; nil when the trail is intact.
	Problem error
	// Gaps counts the trail's gap records, and Unrecorded the events they
	// say were not recorded: an intact chain with gaps is not a complete
	// account.
	Gaps       int
	Unrecorded uint64
	// RestoredFrom is set when the sandbox was restored from a checkpoint:
	// the record of the checkpointed sandbox's trail its trail continues.
	RestoredFrom *Link
	// Checkpoints are the trail's checkpoint records, which restored
	// sandboxes' trails name.
	Checkpoints []Link
}

// Link is a checkpoint record of a trail, as the trail itself holds it
// (Checkpointed) or as a restored sandbox's trail names it (RestoredFrom).
type Link struct {
	Checkpoint string
	Sandbox    string
	Seq        uint64
	Hash       string
}

// EventCheckpointed and EventRestored are the records that link one
// agent's trails across a suspend and resume.
const (
	EventCheckpointed = "agentbox/checkpointed"
	EventRestored     = "agentbox/restored"
)

// LinkProblem says whether a restored sandbox's trail links to the trail
// of the sandbox it was checkpointed from, among the results verified
// together. given is false when that trail is not among them; a non-nil
// error means it is and does not hold the record named: the link is
// forged, or the earlier trail was altered.
func LinkProblem(r VerifyResult, all []VerifyResult) (given bool, err error) {
	l := r.RestoredFrom
	if l == nil {
		return false, nil
	}
	for _, o := range all {
		if o.Sandbox != l.Sandbox {
			continue
		}
		if o.Problem != nil {
			return true, fmt.Errorf("sandbox %s's trail does not verify", l.Sandbox)
		}
		for _, c := range o.Checkpoints {
			if c.Seq == l.Seq && c.Hash == l.Hash {
				if c.Checkpoint != l.Checkpoint {
					return true, fmt.Errorf("record %d of sandbox %s is checkpoint %q, not %q", c.Seq, l.Sandbox, c.Checkpoint, l.Checkpoint)
				}
				return true, nil
			}
		}
		return true, fmt.Errorf("sandbox %s's trail has no checkpoint record %d with fingerprint %s", l.Sandbox, l.Seq, short(l.Hash))
	}
	return false, nil
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// Verifier checks a trail line by line. Feed it the lines of a sandbox's
// segments in order, then call Finish.
type Verifier struct {
	res     VerifyResult
	seq     uint64
	prev    string
	lineNo  int
	file    string
	stopped bool
}

var hashSuffix = regexp.MustCompile(`,"hash":"([0-9a-f]{64})"\}$`)

// Line checks the next line of the trail.
func (v *Verifier) Line(file string, line []byte) {
	if v.stopped {
		return
	}
	v.lineNo++
	if file != v.file {
		v.file, v.lineNo = file, 1
	}
	line = bytes.TrimRight(line, "\r\n")
	if len(line) == 0 {
		v.fail(v.seq+1, "%s:%d: empty line", file, v.lineNo)
		return
	}
	c := splitChain(line)
	if c.badShape != "" {
		v.fail(v.seq+1, "%s:%d: %s", file, v.lineNo, c.badShape)
		return
	}
	sum := sha256.Sum256(c.body)
	if hex.EncodeToString(sum[:]) != c.hash {
		v.fail(c.seq, "%s:%d: seq %d: content does not match its hash: the record was modified", file, v.lineNo, c.seq)
		return
	}
	if v.res.Sandbox == "" {
		v.res.Sandbox = c.sandbox
	} else if c.sandbox != v.res.Sandbox {
		v.fail(c.seq, "%s:%d: seq %d belongs to sandbox %q, not %q: records were inserted", file, v.lineNo, c.seq, c.sandbox, v.res.Sandbox)
		return
	}
	want := v.seq + 1
	switch {
	case v.res.Ended:
		v.fail(c.seq, "%s:%d: seq %d follows the sandbox's end record: records were appended", file, v.lineNo, c.seq)
		return
	case c.seq > want:
		what := "deleted"
		if want == 1 {
			what = "deleted from the start (or the first segments are missing)"
		}
		v.fail(want, "%s:%d: seq %d where %d was expected: records %d..%d were %s", file, v.lineNo, c.seq, want, want, c.seq-1, what)
		return
	case c.seq < want:
		v.fail(c.seq, "%s:%d: seq %d where %d was expected: records were reordered or inserted", file, v.lineNo, c.seq, want)
		return
	case c.prev != v.prev:
		v.fail(c.seq, "%s:%d: seq %d does not link to the record before it: records were inserted or replaced", file, v.lineNo, c.seq)
		return
	}
	v.seq, v.prev = c.seq, c.hash
	v.res.Records++
	if c.event == EventGap {
		v.res.Gaps++
		for _, n := range c.counts {
			v.res.Unrecorded += n
		}
	}
	if c.event == EventSandboxEnd {
		v.res.Ended = true
	}
	switch c.event {
	case EventCheckpointed:
		v.res.Checkpoints = append(v.res.Checkpoints, Link{Checkpoint: c.detail["checkpoint"], Sandbox: c.sandbox, Seq: c.seq, Hash: c.hash})
	case EventRestored:
		if v.res.RestoredFrom != nil {
			v.fail(c.seq, "%s:%d: seq %d: a second restored record: records were inserted", file, v.lineNo, c.seq)
			return
		}
		seq, err := strconv.ParseUint(c.detail["previous_seq"], 10, 64)
		if err != nil || c.detail["previous_sandbox"] == "" || len(c.detail["previous_hash"]) != 64 {
			v.fail(c.seq, "%s:%d: seq %d: a restored record that names no checkpoint record", file, v.lineNo, c.seq)
			return
		}
		v.res.RestoredFrom = &Link{Checkpoint: c.detail["checkpoint"], Sandbox: c.detail["previous_sandbox"], Seq: seq, Hash: c.detail["previous_hash"]}
	}
}

func (v *Verifier) fail(seq uint64, format string, args ...any) {
	v.res.FirstBad = seq
	v.res.Problem = fmt.Errorf(format, args...)
	v.stopped = true
}

// Finish returns the result. A trail with no end record is truncated,
// unless open says the sandbox may still be running.
func (v *Verifier) Finish(open bool) VerifyResult {
	if v.res.Problem == nil && !v.res.Ended && !open {
		v.res.FirstBad = v.seq + 1
		if v.seq == 0 {
			v.res.Problem = fmt.Errorf("empty trail")
		} else {
			v.res.Problem = fmt.Errorf("truncated: the trail stops at seq %d without the sandbox's end record (pass --open for a sandbox still running)", v.seq)
		}
	}
	return v.res
}

// TrailFiles is one sandbox's files, in chain order.
type TrailFiles struct {
	Sandbox string
	Files   []string
}

var segmentRE = regexp.MustCompile(`^(.+)\.([0-9]{6})\.jsonl$`)

// FileName is the active file of a sandbox's trail; SegmentName a rotated
// one. Segments come before the active file, in index order.
func FileName(sandbox string) string { return sandbox + ".jsonl" }

// SegmentName names the n-th rotated segment.
func SegmentName(sandbox string, n int) string { return fmt.Sprintf("%s.%06d.jsonl", sandbox, n) }

// FindTrails groups the *.jsonl files named (or found in named
// directories) by sandbox, each in chain order.
func FindTrails(paths ...string) ([]TrailFiles, error) {
	type seg struct {
		file string
		n    int // -1 for the active file: it sorts last
	}
	bySandbox := map[string][]seg{}
	add := func(file string) {
		base := filepath.Base(file)
		if m := segmentRE.FindStringSubmatch(base); m != nil {
			n, _ := strconv.Atoi(m[2])
			bySandbox[m[1]] = append(bySandbox[m[1]], seg{file, n})
			return
		}
		bySandbox[strings.TrimSuffix(base, ".jsonl")] = append(bySandbox[strings.TrimSuffix(base, ".jsonl")], seg{file, 1 << 30})
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			add(p)
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(p, "*.jsonl"))
		for _, m := range matches {
			add(m)
		}
	}
	var out []TrailFiles
	for sb, segs := range bySandbox {
		sort.Slice(segs, func(i, j int) bool { return segs[i].n < segs[j].n })
		t := TrailFiles{Sandbox: sb}
		for _, s := range segs {
			t.Files = append(t.Files, s.file)
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Sandbox < out[j].Sandbox })
	return out, nil
}

// VerifyTrail verifies a sandbox's files in order.
func VerifyTrail(t TrailFiles, open bool) VerifyResult {
	var v Verifier
	for _, f := range t.Files {
		fh, err := os.Open(f)
		if err != nil {
			v.fail(v.seq+1, "%v", err)
			break
		}
		readLines(fh, func(line []byte) { v.Line(f, line) })
		fh.Close()
	}
	res := v.Finish(open)
	res.Files = t.Files
	if res.Sandbox == "" {
		res.Sandbox = t.Sandbox
	}
	return res
}

// readLines calls fn for each line, whatever its length.
func readLines(r io.Reader, fn func([]byte)) {
	br := bufio.NewReaderSize(r, 1<<16)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			fn(line)
		}
		if err != nil {
			return
		}
	}
}
