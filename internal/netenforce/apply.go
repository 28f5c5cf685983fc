// Package netenforce applies a compiled network plan (internal/netpolicy)
// in a pod's network namespace with nft, and reads back what its drop
// rules logged (nfnetlink_log): the side effects the pure compiler leaves
// to the shim.
package netenforce

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"agentbox.dev/agentbox/internal/hostexec"
	"agentbox.dev/agentbox/internal/netpolicy"
)

// Apply loads the plan into the network namespace at netns (a path like
// /var/run/netns/cni-...) on its one non-loopback interface, which it
// returns. A namespace with no interface but loopback needs no rules.
// Interfaces named in skip (the resolver's link) are not the pod's.
func Apply(netns string, pl *netpolicy.Plan, skip ...string) (string, error) {
	ifaces, err := interfaces(netns, skip)
	if err != nil {
		return "", fmt.Errorf("list interfaces in %s: %w", netns, err)
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

// interfaces lists the non-loopback interfaces of the namespace at path,
// but those in skip, over netlink.
func interfaces(path string, skip []string) ([]string, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback == 0 && !slices.Contains(skip, a.Name) {
			out = append(out, a.Name)
		}
	}
	return out, nil
}

// Remove deletes agentbox's table from netns. A namespace that is already
// gone took the table with it.
func Remove(netns string) error {
	if _, err := os.Stat(netns); os.IsNotExist(err) {
		return nil
	}
	_, err := hostexec.InNetns(netns, "", "nft", "delete", "table", "netdev", netpolicy.Table)
	if err != nil && (strings.Contains(err.Error(), "No such file") || strings.Contains(err.Error(), "does not exist")) {
		return nil
	}
	return err
}

// Counters reads what the drop rules in netns caught so far.
func Counters(netns string) (map[string]netpolicy.Counter, error) {
	out, err := hostexec.InNetns(netns, "", "nft", "list", "table", "netdev", netpolicy.Table)
	if err != nil {
		return nil, err
	}
	return netpolicy.ParseCounters(out), nil
}

// Quarantine replaces the rules in netns with netpolicy.QuarantineRuleset(ifaces),
// in one transaction.
func Quarantine(netns string, ifaces ...string) error {
	if _, err := hostexec.InNetns(netns, netpolicy.QuarantineRuleset(ifaces), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("quarantine %s: %w", netns, err)
	}
	return nil
}

// Restore loads the plan's rules on iface again, replacing a quarantine in
// one transaction.
func Restore(netns string, pl *netpolicy.Plan, iface string) error {
	if _, err := hostexec.InNetns(netns, pl.Ruleset(iface), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("restore egress rules in %s: %w", netns, err)
	}
	return nil
}
