package policysync

// Fork from Kubernetes, at the node: a Sandbox annotated
// agentbox.dev/fork: "N" is checkpointed while it runs, and the broker
// makes N copies of it pinned to this node (broker/fork.go); a copy
// restored from its fork image asks the broker to take the image off its
// template, as a resume does. The image stays while a Sandbox names it.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/control"
)

// forkAndCopies acts for a Sandbox that asks for copies, and for a copy
// that runs.
func (a *Agent) forkAndCopies(ctx context.Context, l control.Listed, o *control.Owner, sbObj *unstructured.Unstructured) {
	if sbObj == nil {
		return
	}
	sb := l.Sandbox
	ask, asked := sbObj.GetAnnotations()[broker.ForkAnnotation]
	switch {
	case !asked:
		delete(a.forks, sb.ID)
	case a.forks[sb.ID] != ask && sb.State == "running":
		// Taken up once: a failure is said in an Event, and asking again
		// is writing the annotation anew.
		a.forks[sb.ID] = ask
		a.fork(ctx, l, o, sbObj, ask)
	}
	annotated, _, _ := unstructured.NestedString(sbObj.Object, "spec", "podTemplate", "metadata", "annotations", restoreAnnotation)
	if annotated != "" && broker.ForkImage(annotated) && sbObj.GetAnnotations()[broker.ForkOfAnnotation] == annotated &&
		sb.RestoredFrom == annotated && sb.State == "running" {
		w := broker.SandboxWrite{Op: broker.OpResumed, Sandbox: brokerRef(o.Sandbox), Checkpoint: annotated}
		if _, err := a.writeSandbox(ctx, w); err != nil {
			a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("taking the fork image off a copy's pod template")
			a.recordRefusal(w, err)
			return
		}
		a.event(ctx, sbObj, "Normal", "Forked", fmt.Sprintf("agentbox started this copy from fork image %s on node %s; its next pods boot afresh", annotated, a.NodeName))
	}
}

// fork checkpoints the sandbox and asks the broker for the copies.
func (a *Agent) fork(ctx context.Context, l control.Listed, o *control.Owner, sbObj *unstructured.Unstructured, ask string) {
	sb, key := l.Sandbox, o.Sandbox.Namespace+"/"+o.Sandbox.Name
	n, err := broker.ForkCount(ask)
	if err != nil {
		a.event(ctx, sbObj, "Warning", "ForkRefused", err.Error())
		return
	}
	name := broker.ForkName(o.Sandbox.UID, time.Now())
	reason := fmt.Sprintf("agent-sandbox: Sandbox %s (uid %s) asked for %d copies (%s)", key, o.Sandbox.UID, n, broker.ForkAnnotation)
	resp, err := control.Call(l.Socket, control.Request{Op: control.OpCheckpoint, Name: name, Reason: reason}, suspendWait)
	if err != nil {
		a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("checkpointing for a fork")
		a.event(ctx, sbObj, "Warning", "ForkFailed", fmt.Sprintf("agentbox could not checkpoint the agent on node %s: %v", a.NodeName, err))
		return
	}
	w := broker.SandboxWrite{Op: broker.OpForked, Sandbox: brokerRef(o.Sandbox), Checkpoint: name, Copies: n}
	made, err := a.writeSandbox(ctx, w)
	if err != nil {
		a.Log.WithError(err).WithField("sandbox", sb.ID).Warn("the broker's copies for a fork")
		a.recordRefusal(w, err)
		a.event(ctx, sbObj, "Warning", "ForkFailed", fmt.Sprintf("agentbox checkpointed the agent into %s on node %s, and the broker made no copies: %v", name, a.NodeName, err))
		return
	}
	cp := resp.Checkpoint
	msg := fmt.Sprintf("agentbox forked the agent into checkpoint %s on node %s (%d bytes in %d ms): copies %s, pinned to this node", name, a.NodeName, cp.Bytes, cp.Millis, strings.Join(made.Copies, ", "))
	a.Log.WithField("sandbox", sb.ID).Info(msg)
	a.event(ctx, sbObj, "Normal", "Forked", msg)
	if a.Trail != nil {
		a.Trail.Emit(audit.TypeCheckpointed.New("Success", fmt.Sprintf("Sandbox %s forked: %s", key, msg),
			map[string]string{"checkpoint": name, "sandbox_object": key, "sandbox_uid": o.Sandbox.UID, "node": a.NodeName, "copies": strings.Join(made.Copies, ", ")}), true)
	}
}
