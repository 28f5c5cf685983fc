// Command containerd-shim-agentbox-v1 is the agentbox containerd shim
// (runtime type io.containerd.agentbox.v1): every container runs under gVisor.
package main

import (
	"context"

	cdshim "github.com/containerd/containerd/v2/pkg/shim"

	"agentbox.dev/agentbox/shim"
	"agentbox.dev/agentbox/shim/manager"
)

func main() {
	cdshim.Run(context.Background(), manager.New(shim.RuntimeName, manager.TaskV3()))
}
