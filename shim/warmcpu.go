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
	if idle == sb.warm.Idle && capped == sb.warm.Capped() {
		return
	}
	if sb.stats == nil {
		detail["cpu_class"] = "unchanged: the sandbox's cgroup is systemd's, which the shim does not write"
		return
	}
	detail["cpu_class"] = sb.warm.Set(cgroups.Root, sb.stats.Cgroup, idle, capped, WarmCPUMillis)
}

// recapCPU takes a CPU limit the shim applied to sb while it is capped (a
// live tightening, a claim's role; q): that limit is what the claim gives
// back, and the cap stays until then.
// +checklocks:sb.ops
func recapCPU(sb *sandboxState, q cgroups.Quota) {
	if sb.stats != nil {
		_ = sb.warm.Follow(cgroups.Root, sb.stats.Cgroup, q, WarmCPUMillis) // kept as it was on error: still capped
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
