package netpolicy

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"agentbox.dev/agentbox/internal/hostexec"
)

// Apply loads the plan into the network namespace at netns (a path like
// /var/run/netns/cni-...) on its one non-loopback interface, which it
// returns. A namespace with no interface but loopback needs no rules.
// Interfaces named in skip (the resolver's link) are not the pod's.
func Apply(netns string, pl *Plan, skip ...string) (string, error) {
	out, err := hostexec.InNetns(netns, "", "ip", "-o", "link", "show")
	if err != nil {
		return "", fmt.Errorf("list interfaces in %s: %w", netns, err)
	}
	var ifaces []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if name != "lo" && !slices.Contains(skip, name) {
			ifaces = append(ifaces, name)
		}
	}
	switch len(ifaces) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("network namespace %s has %d interfaces (%v): egress policy covers one", netns, len(ifaces), ifaces)
	}
	if _, err := hostexec.InNetns(netns, pl.Ruleset(ifaces[0]), "nft", "-f", "-"); err != nil {
		return "", fmt.Errorf("load egress rules into %s: %w", netns, err)
	}
	return ifaces[0], nil
}

// Remove deletes agentbox's table from netns. A namespace that is already
// gone took the table with it.
func Remove(netns string) error {
	if _, err := os.Stat(netns); os.IsNotExist(err) {
		return nil
	}
	_, err := hostexec.InNetns(netns, "", "nft", "delete", "table", "netdev", Table)
	if err != nil && (strings.Contains(err.Error(), "No such file") || strings.Contains(err.Error(), "does not exist")) {
		return nil
	}
	return err
}

// Update runs nft input (such as Plan.Elements) in netns.
func Update(netns, input string) error {
	_, err := hostexec.InNetns(netns, input, "nft", "-f", "-")
	return err
}

// Counters reads what the drop rules in netns caught so far.
func Counters(netns string) (map[string]Counter, error) {
	out, err := hostexec.InNetns(netns, "", "nft", "list", "table", "netdev", Table)
	if err != nil {
		return nil, err
	}
	return ParseCounters(out), nil
}
