// Command stock-gvisor-shim is the benchmark's reference: gVisor's own shim
// (its task service and redirector, no extension), runtime type
// io.containerd.runsc.v1.
//
// The unmodified stock binary cannot start on hosts that withhold
// CAP_SYS_RESOURCE: its manager fails the start when lowering the shim's
// oom_score_adj is refused. This reference therefore uses the agentbox
// manager (which only differs in tolerating that refusal) with gVisor's
// task-service plugin, so the benchmark compares the per-container path of
// the stock shim with agentbox's. It is built for benchmarks only.
package main

import (
	"context"

	cdshim "github.com/containerd/containerd/v2/pkg/shim"
	_ "gvisor.dev/gvisor/pkg/shim/v1/plugin" // registers gVisor's stock task service

	"agentbox.dev/agentbox/shim/manager"
)

func main() {
	cdshim.Run(context.Background(), manager.New("io.containerd.runsc.v1"))
}
