package cgroups

import (
	"fmt"
	"strings"
)

// Warm is the CPU state the runtime gave a warm pod's cgroup: whether it
// is in the idle CPU class (Idle), and the bandwidth it had before it was
// capped (Had; nil: not capped), which is what its claim gives back. The
// zero value is a cgroup as the kubelet made it. A Warm is not safe for
// concurrent use: its owner guards it.
type Warm struct {
	Idle bool
	Had  *Quota
}

// Capped says whether the cgroup is capped.
func (w *Warm) Capped() bool { return w.Had != nil }

// Set puts the cgroup at path (cgroupfs form) below root in the idle class
// or out of it, and caps it at capMillis or gives back what it had,
// changing only what differs from w; it says what it did, or why not
// ("" when nothing differed).
func (w *Warm) Set(root, path string, idle, capped bool, capMillis int64) string {
	var said []string
	if idle != w.Idle {
		switch f, err := SetIdle(root, path, idle); {
		case err != nil:
			said = append(said, "class unchanged: "+err.Error())
		case idle:
			w.Idle = true
			said = append(said, fmt.Sprintf("idle while the warm pool holds it (%s 1)", f))
		default:
			w.Idle = false
			said = append(said, fmt.Sprintf("normal (%s 0)", f))
		}
	}
	if capped != w.Capped() {
		said = append(said, w.setCap(root, path, capped, capMillis))
	}
	return strings.Join(said, "; ")
}

// setCap caps the cgroup at capMillis, keeping the bandwidth it had in
// w.Had, or gives that back; it says what it did.
func (w *Warm) setCap(root, path string, capped bool, capMillis int64) string {
	if !capped {
		was := *w.Had
		if err := SetQuota(root, path, was); err != nil {
			return "cap kept: " + err.Error()
		}
		w.Had = nil
		return "uncapped: " + MillisText(was.Millis())
	}
	q, err := ReadQuota(root, path)
	if err != nil {
		return "not capped: " + err.Error()
	}
	if err := SetQuota(root, path, capOf(q, capMillis)); err != nil {
		return "not capped: " + err.Error()
	}
	w.Had = &q
	return fmt.Sprintf("capped at %dm while it waits ready (it had %s)", capMillis, MillisText(q.Millis()))
}

// Follow takes a CPU limit applied to a capped cgroup (a live tightening,
// a claim's role; q): it is what the claim gives back, and the cap, never
// higher than q, stays until then. An uncapped cgroup is left alone.
func (w *Warm) Follow(root, path string, q Quota, capMillis int64) error {
	if w.Had == nil || q.Period <= 0 {
		return nil
	}
	had := *w.Had
	if want := q.Quota * had.Period / q.Period; had.Quota < 0 || want < had.Quota {
		had.Quota = want
	}
	if err := SetQuota(root, path, capOf(had, capMillis)); err != nil {
		return err
	}
	w.Had = &had
	return nil
}

// capOf is the lower of capMillis and q, in q's period.
func capOf(q Quota, capMillis int64) Quota {
	limit := Quota{Quota: capMillis * q.Period / 1000, Period: q.Period}
	if q.Quota >= 0 && q.Quota < limit.Quota {
		return q
	}
	return limit
}

// MillisText says a CPU bandwidth in thousandths of a CPU.
func MillisText(m int64) string {
	if m == 0 {
		return "no CPU limit"
	}
	return fmt.Sprintf("%dm", m)
}
