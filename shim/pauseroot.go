package shim

// A pod's pause container served from the node's EROFS image of its
// rootfs, with no gofer.

import (
	"context"
	"fmt"

	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/ocispec"
	"agentbox.dev/agentbox/internal/pauseroot"
)

// pauseFromImage has runsc mount a CRI pod's pause container's root from
// the node's read-only image of its rootfs (internal/pauseroot), so that
// runsc starts no gofer for it: one process, its memory (3.7 MiB of an idle
// pod's) and its start (about 20 ms) fewer per pod. The pause process reads nothing of the pod's
// files; the pod's own containers keep their gofers. It reports whether
// the root is served so, and the change (or why it is not) for the
// sandbox's record. A failure falls back to gVisor's gofer, as
// runsc.pause_image_dir = "none" does, except in a restore: gVisor
// restores a pause only with the mounts it was checkpointed with, so a
// restored pod's pause is served as its checkpoint's was, or the restore
// is refused here, naming why.
func pauseFromImage(ctx context.Context, plan *createPlan) (bool, string, error) {
	sb := plan.sandbox
	if sb == nil || !sb.inCRI {
		return false, "", nil
	}
	dir := plan.cfg.Runsc.PauseImageDir
	if sb.restore != nil {
		m := sb.restore.image.Manifest
		if !m.PauseImage {
			return false, fmt.Sprintf("the pause container's root is served by a gofer, as in checkpoint %s", m.Name), nil
		}
		if dir == "none" {
			dir = config.DefaultPauseImageDir
		}
		served, change, err := servePause(plan, dir)
		if err != nil {
			return false, "", fmt.Errorf("checkpoint %s ran its pause from the node's image of its rootfs, and this pod's cannot: %w", m.Name, err)
		}
		return served, change, nil
	}
	if dir == "none" {
		return false, "", nil
	}
	served, change, err := servePause(plan, dir)
	if err != nil {
		log.G(ctx).WithError(err).Warn("agentbox: the pause container is served by a gofer")
		return false, "the pause container's root is served by a gofer: " + err.Error(), nil
	}
	return served, change, nil
}

// servePause finds or builds the image of the pause's rootfs in dir and
// points the spec at it, recording so on the sandbox.
func servePause(plan *createPlan, dir string) (bool, string, error) {
	layers, err := plan.layers()
	if err != nil {
		return false, "", err
	}
	path, err := pauseroot.Image(dir, layers)
	if err != nil {
		return false, "", err
	}
	change, err := ocispec.RootFromImage(path)(plan.spec)
	if err != nil {
		return false, "", err
	}
	// A checkpoint of the sandbox records it (pauseImage).
	plan.sandbox.pauseImage = true
	return true, change, nil
}
