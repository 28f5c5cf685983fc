package audit

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Meta is what every record of a sandbox is joined with.
type Meta struct {
	Sandbox      string
	Namespace    string // containerd's
	PodNamespace string
	PodName      string
	Role         string
	PolicyDigest string
	// Claim is the task the sandbox works for since its claim; WarmPool
	// the agent-sandbox warm pool holding it until then.
	Claim    *Claim
	WarmPool string
}

// Forwarder receives committed batches of lines (a network sink). It must
// not block: it spools.
type Forwarder interface {
	Forward(lines []byte, n int) error
	Close() error
}

// Counters of a trail. Every record the trail was given is either written
// or lost; the end record states them.
type Counters struct {
	// Received counts messages read from the sandbox.
	Received uint64
	// SentryDropped counts events gVisor dropped (its socket was full).
	SentryDropped uint64
	// Anomalies counts malformed or out-of-order messages.
	Anomalies uint64
	// Written counts records in the file; Lost the records that could not
	// be written (each loss is reported by a gap record once writing works
	// again).
	Written uint64
	Lost    uint64
	// ForwardLost counts records a forwarder could not take.
	ForwardLost uint64
}

// Trail is one sandbox's audit trail: it seals records into the hash chain
// in batches and writes them to the file sink, then to forwarders. Safe for
// concurrent use.
type Trail struct {
	mu   sync.Mutex
	meta Meta
	file *FileSink
	fwd  []Forwarder

	chain Chain // committed: everything up to here is in the file
	// pending is the batch sealed on top of chain but not yet written.
	pending     []byte
	pendingN    int
	pendingHead Chain
	// lost holds losses not yet reported by a written gap record, by
	// reason; gapPending is set while such a record is in the batch.
	lost       map[string]uint64
	gapPending bool
	counters   Counters
	closed     bool
	// pendingOwn: the pending batch carries records of the trail's own,
	// which may be written from the file's reserve.
	pendingOwn bool
	// full is set while the sandbox's records do not fit the budget; its
	// records are then held (pending) and Emit blocks: the receiver stops
	// reading the sandbox's socket. fullSince is when it began.
	full      *FullError
	fullSince time.Time
	// draining: Close is near; Emit no longer blocks, and what does not
	// fit is counted as lost.
	draining bool
	cond     *sync.Cond

	stop chan struct{}
	done chan struct{}
}

// BatchBytes is when a pending batch is written without waiting.
const BatchBytes = 256 << 10

// FlushInterval and SyncInterval are the trail's durability policy (see
// FileSink).
var (
	FlushInterval = 100 * time.Millisecond
	SyncInterval  = time.Second
)

// NewTrail starts a trail writing to file. It flushes every FlushInterval
// and fsyncs every SyncInterval until Close.
func NewTrail(meta Meta, file *FileSink, fwd ...Forwarder) *Trail {
	t := &Trail{meta: meta, file: file, fwd: fwd, lost: map[string]uint64{}, stop: make(chan struct{}), done: make(chan struct{})}
	t.cond = sync.NewCond(&t.mu)
	go t.loop()
	return t
}

func (t *Trail) loop() {
	defer close(t.done)
	flush := time.NewTicker(FlushInterval)
	sync := time.NewTicker(SyncInterval)
	defer flush.Stop()
	defer sync.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-flush.C:
			t.mu.Lock()
			t.flushLocked()
			t.retryFullLocked()
			t.mu.Unlock()
		case <-sync.C:
			// The fsync runs outside the lock: a slow disk must not stall
			// the receiver (it would stop reading the sandbox's socket, and
			// gVisor drops what it cannot write after its retries).
			t.mu.Lock()
			t.flushLocked()
			f := t.file.syncer()
			t.mu.Unlock()
			f.Sync()
		}
	}
}

// SetMeta updates what later records are joined with.
func (t *Trail) SetMeta(m Meta) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.meta = m
}

// Meta is what records are joined with.
func (t *Trail) Meta() Meta {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta
}

// Emit joins r with the sandbox's metadata, seals it into the chain and
// queues it. Records of the shim's own (urgent) are written at once, from
// the reserve if need be. While the trail is full, Emit of a sandbox record
// waits until it fits again (back-pressure), unless the trail is draining.
func (t *Trail) Emit(r *Record, urgent bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for !urgent && t.full != nil && !t.closed && !t.draining {
		t.cond.Wait()
	}
	if !urgent && t.full != nil && !t.closed {
		t.lost["trail full: "+t.full.Reason]++
		t.counters.Lost++
		return
	}
	t.emitLocked(r)
	if urgent {
		t.pendingOwn = true
	}
	if urgent || len(t.pending) >= BatchBytes {
		t.flushLocked()
	}
}

// Rejoin changes what records are joined with to m, beginning with r, a
// record of the trail's own written at once: no record comes between r and
// the change on either side.
func (t *Trail) Rejoin(m Meta, r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.meta = m
	t.emitOwnLocked(r)
}

// emitOwnLocked emits r, a record of the trail's own, and writes it at once.
func (t *Trail) emitOwnLocked(r *Record) {
	t.emitLocked(r)
	t.pendingOwn = true
	t.flushLocked()
}

// Mark emits r as a record of the trail's own and writes it at once. It
// returns r's sequence number and hash, which another trail may name (a
// restored sandbox's names its checkpoint's record), or an error when r
// could not be written.
func (t *Trail) Mark(r *Record) (uint64, string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, "", errors.New("the trail is closed")
	}
	t.emitOwnLocked(r)
	if t.pendingN > 0 || r.Seq == 0 || t.chain.seq < r.Seq {
		return 0, "", fmt.Errorf("the record could not be written to the trail (%d pending)", t.pendingN)
	}
	if t.chain.seq != r.Seq {
		// Later records were written with it (a gap record comes first,
		// never after): find r's own hash.
		return 0, "", fmt.Errorf("the trail moved past the record (seq %d, now %d)", r.Seq, t.chain.seq)
	}
	return r.Seq, t.chain.prev, nil
}

// Full returns why the trail is full and since when (nil when it is not).
func (t *Trail) Full() (*FullError, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.full, t.fullSince
}

// Drain makes Emit stop waiting: the sandbox is going, and what does not
// fit from now on is counted as lost (and reported in the end record).
func (t *Trail) Drain() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.draining = true
	t.cond.Broadcast()
}

// retryFullLocked clears the full state once the budget admits records
// again (another sandbox ended, retention freed space).
func (t *Trail) retryFullLocked() {
	if t.full == nil || t.closed {
		return
	}
	if err := t.file.admit(int64(len(t.pending)) + 1); err == nil {
		t.full = nil
		t.cond.Broadcast()
	}
}

func (t *Trail) emitLocked(r *Record) {
	if t.closed {
		t.counters.Lost++
		return
	}
	if len(t.lost) > 0 && !t.gapPending {
		// Report the losses before what comes after them.
		t.gapPending = true
		t.emitLocked(t.gapRecordLocked())
	}
	r.Sandbox = t.meta.Sandbox
	r.Namespace, r.PodNamespace, r.PodName = t.meta.Namespace, t.meta.PodNamespace, t.meta.PodName
	r.Role, r.PolicyDigest = t.meta.Role, t.meta.PolicyDigest
	r.Claim, r.WarmPool = t.meta.Claim, t.meta.WarmPool
	if t.pendingN == 0 {
		t.pendingHead = t.chain
	}
	var hash string
	t.pending, hash = t.pendingHead.SealAppend(t.pending, r)
	t.pendingHead.Commit(hash)
	t.pendingN++
}

// Gap records a loss that happened elsewhere (gVisor's dropped events);
// a gap record is emitted at once.
func (t *Trail) Gap(reason string, n uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lost[reason] += n
	t.pendingOwn = true
	t.flushLocked()
}

// Count updates counters under the trail's lock.
func (t *Trail) Count(fn func(*Counters)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fn(&t.counters)
}

// Flush writes the pending batch.
func (t *Trail) Flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flushLocked()
}

// flushLocked writes the pending batch, reporting pending losses first.
func (t *Trail) flushLocked() {
	if len(t.lost) > 0 && !t.gapPending && !t.closed {
		t.gapPending = true
		t.emitLocked(t.gapRecordLocked())
	}
	t.writePendingLocked()
}

// gapRecordLocked describes the losses not yet reported.
func (t *Trail) gapRecordLocked() *Record {
	reasons := make([]string, 0, len(t.lost))
	var total uint64
	counts := map[string]uint64{}
	for r, n := range t.lost {
		reasons = append(reasons, r)
		counts[r] = n
		total += n
	}
	sort.Strings(reasons)
	g := TypeGap.New("Failure", fmt.Sprintf("%d event(s) not recorded: %v", total, reasons), nil)
	g.Counts = counts
	return g
}

// writePendingLocked writes the pending batch and reports success.
func (t *Trail) writePendingLocked() bool {
	if t.pendingN == 0 {
		return true
	}
	batch, n := t.pending, t.pendingN
	write := t.file.WriteBatch
	if t.pendingOwn || t.gapPending {
		write = t.file.WriteOwn
	}
	if err := write(batch); err != nil {
		var full *FullError
		if errors.As(err, &full) && !t.closed && !t.draining {
			// Hold the batch, sealed, for when it fits: nothing is lost
			// and the sandbox is held back (Emit waits).
			if t.full == nil {
				t.fullSince = time.Now()
			}
			t.full = full
			return false
		}
		t.pending, t.pendingN = t.pending[:0], 0
		t.gapPending, t.pendingOwn = false, false
		t.lost["file sink: "+err.Error()] += uint64(n)
		t.counters.Lost += uint64(n)
		return false
	}
	gap := t.gapPending
	t.pending, t.pendingN = t.pending[:0], 0
	t.gapPending, t.pendingOwn = false, false
	if t.full != nil && !IsFull(t.file.admit(1)) {
		t.full = nil
		t.cond.Broadcast()
	}
	if gap {
		t.lost = map[string]uint64{}
	}
	t.chain = t.pendingHead
	t.counters.Written += uint64(n)
	for _, f := range t.fwd {
		if err := f.Forward(batch, n); err != nil {
			t.counters.ForwardLost += uint64(n)
			t.lost["forwarder: "+err.Error()] += uint64(n)
		}
	}
	// The file and the forwarders copied the batch: its buffer is reused.
	t.pending = batch[:0]
	return true
}

// Counters returns a snapshot.
func (t *Trail) Counters() Counters {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counters
}

// Close writes the end record with the totals, syncs and closes the sinks.
// What could not be written is returned as an error (the end record says
// it too, if it could be written).
func (t *Trail) Close(r *Record) error {
	close(t.stop)
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.draining = true
	t.cond.Broadcast()
	t.pendingOwn = true
	t.flushLocked()
	c := t.counters
	r.Counts = map[string]uint64{
		"received": c.Received, "sentry_dropped": c.SentryDropped, "anomalies": c.Anomalies,
		"written": c.Written + 1, "lost": c.Lost, "forward_lost": c.ForwardLost,
	}
	t.emitLocked(r)
	t.pendingOwn = true
	ok := t.writePendingLocked()
	t.closed = true
	t.cond.Broadcast()
	err := t.file.Close()
	for _, f := range t.fwd {
		if ferr := f.Close(); err == nil {
			err = ferr
		}
	}
	if !ok {
		return fmt.Errorf("audit end record of %s not written; %d record(s) lost", t.meta.Sandbox, t.counters.Lost)
	}
	return err
}
