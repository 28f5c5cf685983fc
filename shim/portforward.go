package shim

// The pod's port-forward: listeners for the ports its role names
// (network.portForward), opened at its sandbox's Create and closed at its
// Delete; each connection one record.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/log"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/portfwd"
)

// startPortForward opens the sandbox's port-forward listeners in its
// network namespace netns, forwarding through the runsc control socket
// at socket; with no ports it opens none. A pod without a namespace of
// its own (ctr run without CNI) has no port-forward, and its profile
// record says so.
func startPortForward(ctx context.Context, sb *sandboxState, ports []int, netns, socket string) (string, error) {
	if len(ports) == 0 {
		return "", nil
	}
	if netns == "" {
		return "network.portForward: none (the sandbox has no network namespace of its own)", nil
	}
	f, err := portfwd.Start(netns, ports, socket, sb.id, func(c portfwd.Conn) { recordPortForward(sb, c) })
	if err != nil {
		return "", fmt.Errorf("network.portForward: %w", err)
	}
	sb.forwarder.Store(f)
	log.G(ctx).Debugf("agentbox: port-forward to ports %v", ports)
	return fmt.Sprintf("network.portForward: 127.0.0.1 ports %s in %s", joinPorts(ports), netns), nil
}

// stopPortForward closes the sandbox's listeners and the connections
// under way; their records go in first.
func stopPortForward(ctx context.Context, sb *sandboxState) {
	if f := sb.forwarder.Swap(nil); f != nil {
		if err := f.Close(); err != nil {
			log.G(ctx).WithError(err).Warn("agentbox: closing the port-forward listeners")
		}
	}
}

func recordPortForward(sb *sandboxState, c portfwd.Conn) {
	detail := map[string]string{"port": fmt.Sprint(c.Port), "direction": "inbound"}
	status, msg := "Failure", fmt.Sprintf("port-forward to port %d: %v", c.Port, c.Err)
	if c.Err == nil {
		status, msg = "Success", fmt.Sprintf("port-forward to port %d: %d bytes in, %d out, %v", c.Port, c.In, c.Out, c.Duration.Round(time.Millisecond))
		detail["bytes_in"], detail["bytes_out"], detail["duration_ms"] = fmt.Sprint(c.In), fmt.Sprint(c.Out), fmt.Sprint(c.Duration.Milliseconds())
	}
	r := audit.TypePortForward.New(status, msg, detail)
	r.Dst = &audit.Endpoint{IP: "127.0.0.1", Port: c.Port}
	sb.audit.trail.Emit(r, true)
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ", ")
}
