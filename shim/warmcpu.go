package shim

// A warm pod waits cheaply. While a SandboxWarmPool holds its Sandbox, the
// pod's cgroup (where runsc puts the sandbox: its Sentry and gofers) is in
// the kernel's idle CPU class, so what it does runs only on CPU the other
// pods leave free; once its pod is ready (it started, its probes passed)
// it only waits, and its CPU is capped at WarmCPUMillis, so that it takes
// next to nothing from the node's own work either (the kubelet,
// containerd, the API server a claim goes through: the idle class is only
// among the pods). From its claim (or whatever else holds it next) the
// cgroup is back in the normal class with the bandwidth it had. The
// kubelet sets a pod's cpu.shares and quota when it makes the pod's
// cgroup, and never cpu.idle; the node agent says who holds the Sandbox,
// from the API.

import (
	"fmt"
	"strings"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/cgroups"
	"agentbox.dev/agentbox/internal/control"
)

// WarmCPUMillis is the CPU (thousandths of a CPU) a warm pod may use once
// it is ready, until its claim.
const WarmCPUMillis = 50

// warmCPU puts sb's cgroup in the idle class when o says a warm pool holds
// its Sandbox, and caps it when its pod is ready too, undoing either
// otherwise; it says what it changed in detail["cpu_class"] (the owner
// record's), or why it left the cgroup as it was (a systemd cgroup, a
// kernel without cpu.idle, an error).
// +checklocks:sb.ops
func warmCPU(sb *sandboxState, o *control.Owner, detail map[string]string) {
	idle := o.Holder != nil && o.Holder.Kind == "SandboxWarmPool"
	capped := idle && o.Ready
	if idle == sb.cpuIdle && capped == (sb.cpuCap != nil) {
		return
	}
	if sb.stats == nil {
		detail["cpu_class"] = "unchanged: the sandbox's cgroup is systemd's, which the shim does not write"
		return
	}
	var said []string
	if idle != sb.cpuIdle {
		switch f, err := cgroups.SetIdle(cgroups.Root, sb.stats.Cgroup, idle); {
		case err != nil:
			said = append(said, "class unchanged: "+err.Error())
		case idle:
			sb.cpuIdle = true
			said = append(said, fmt.Sprintf("idle while the warm pool holds it (%s 1)", f))
		default:
			sb.cpuIdle = false
			said = append(said, fmt.Sprintf("normal (%s 0)", f))
		}
	}
	if capped != (sb.cpuCap != nil) {
		said = append(said, capCPU(sb, capped))
	}
	detail["cpu_class"] = strings.Join(said, "; ")
}

// capCPU caps sb's cgroup at WarmCPUMillis, keeping the bandwidth it had,
// or gives that back; it says what it did.
// +checklocks:sb.ops
func capCPU(sb *sandboxState, capped bool) string {
	if !capped {
		was := *sb.cpuCap
		if err := cgroups.SetQuota(cgroups.Root, sb.stats.Cgroup, was); err != nil {
			return "cap kept: " + err.Error()
		}
		sb.cpuCap = nil
		return "uncapped: " + millisText(was.Millis())
	}
	q, err := cgroups.ReadQuota(cgroups.Root, sb.stats.Cgroup)
	if err != nil {
		return "not capped: " + err.Error()
	}
	if err := lowerQuota(sb, q); err != nil {
		return "not capped: " + err.Error()
	}
	sb.cpuCap = &q
	return fmt.Sprintf("capped at %dm while it waits ready (it had %s)", WarmCPUMillis, millisText(q.Millis()))
}

// lowerQuota writes to sb's cgroup the lower of the warm cap and q (the
// bandwidth it would have uncapped).
// +checklocks:sb.ops
func lowerQuota(sb *sandboxState, q cgroups.Quota) error {
	limit := cgroups.Quota{Quota: WarmCPUMillis * q.Period / 1000, Period: q.Period}
	if q.Quota >= 0 && q.Quota < limit.Quota {
		limit = q
	}
	return cgroups.SetQuota(cgroups.Root, sb.stats.Cgroup, limit)
}

// recapCPU takes a CPU limit the shim applied to sb while it is capped (a
// live tightening, a claim's role; q): that limit is what the claim gives
// back, and the cap stays until then.
// +checklocks:sb.ops
func recapCPU(sb *sandboxState, q cgroups.Quota) {
	if sb.cpuCap == nil || sb.stats == nil || q.Period <= 0 {
		return
	}
	had := *sb.cpuCap
	if want := q.Quota * had.Period / q.Period; had.Quota < 0 || want < had.Quota {
		had.Quota = want
	}
	if err := lowerQuota(sb, had); err == nil {
		sb.cpuCap = &had
	}
}

// readyChanged notes that sb's pod became ready (or not) with the same
// holder: a warm pod that is ready is capped, with a record saying so.
// +checklocks:sb.ops
func (s *service) readyChanged(sb *sandboxState, prev *control.Owner, ready bool, detail map[string]string) string {
	next := *prev
	next.Ready = ready
	warmCPU(sb, &next, detail)
	sb.owner.Store(&next)
	msg := ownerText(&next)
	if c, ok := detail["cpu_class"]; ok {
		detail["sandbox_object"], detail["sandbox_uid"] = next.Sandbox.Namespace+"/"+next.Sandbox.Name, next.Sandbox.UID
		if h := next.Holder; h != nil {
			detail["holder_kind"], detail["holder"], detail["holder_uid"] = h.Kind, h.Name, h.UID
		}
		msg = "the pod is ready: " + c
		if !ready {
			msg = "the pod is not ready: " + c
		}
		s.record(sb.id, audit.TypeOwner.New("Success", msg, detail), false)
	}
	return msg
}

// millisText says a CPU bandwidth.
func millisText(m int64) string {
	if m == 0 {
		return "no CPU limit"
	}
	return fmt.Sprintf("%dm", m)
}
