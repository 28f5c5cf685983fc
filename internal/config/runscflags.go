package config

// The runsc flags a config may set: the shim owns some, some only tune,
// and some weaken the sandbox and are refused.

import (
	"strings"
)

// shimOwnedFlags are runsc flags the shim sets itself; a config may not
// override them.
var shimOwnedFlags = map[string]string{
	"root":       "set runsc.root instead",
	"log":        "the shim writes runsc's log into the bundle",
	"log-format": "the shim parses runsc's JSON log",
	"panic-log":  "set per container by the shim",
}

// TuningFlags are the runsc flags a config may set: they change how gVisor
// runs, never what a role enforces. Any other flag is refused when the
// config loads.
var TuningFlags = map[string]bool{
	"platform": true, "systemd-cgroup": true, "directfs": true, "file-access": true, "file-access-mounts": true,
	"overlay2": true, "dcache": true, "cpu-num-from-quota": true, "num-network-channels": true, "gso": true,
	"software-gso": true, "gvisor-gro": true, "watchdog-action": true, "panic-signal": true,
	"debug": true, "debug-log": true, "debug-log-format": true, "log-packets": true,
	"strace": true, "strace-syscalls": true, "strace-log-size": true,
}

// weakeningFlags say why known flags are refused.
var weakeningFlags = map[string]string{
	"ignore-cgroups":      "the sandbox would ignore its cgroup and see the host's memory and CPUs: the role's limits would not hold",
	"net-raw":             "raw sockets inside the sandbox: packets forged past what the role's egress rules assume",
	"network":             "a role's egress decides the sandbox's network",
	"host-uds":            "the sandbox would reach the host's unix sockets",
	"host-fifo":           "the sandbox would reach the host's FIFOs",
	"host-settings":       "the sandbox would change the host's settings",
	"allow-flag-override": "pod annotations could then set any runsc flag",
	"oci-seccomp":         "the baseline syscall policy needs it on",
	"nvproxy":             "device passthrough",
	"tpuproxy":            "device passthrough",
	"rootless":            "the sandbox's isolation is set up by the shim as root",
	"pod-init-config":     "the shim owns the audit session",
}

// checkRunscFlag says why a config may not set a runsc flag ("" if it may).
func checkRunscFlag(k string) string {
	if TuningFlags[k] {
		return ""
	}
	if why, ok := shimOwnedFlags[k]; ok {
		return "owned by the shim: " + why
	}
	if why, ok := weakeningFlags[k]; ok {
		return "would weaken what a role enforces: " + why
	}
	return "not one of the tuning flags agentbox accepts (" + strings.Join(sortedKeys(boolKeys(TuningFlags)), ", ") + ")"
}

func boolKeys(m map[string]bool) map[string]string {
	out := map[string]string{}
	for k := range m {
		out[k] = ""
	}
	return out
}

// RunscFlags are the flags runsc runs a sandbox with: the config's tuning
// flags, then the role's, which win. The shim and `policy explain` both
// use this; the shim adds the sandbox's own audit session
// (pod-init-config).
func (c *Config) RunscFlags(role map[string]string) map[string]string {
	flags := map[string]string{}
	for k, v := range c.Runsc.Flags {
		flags[k] = v
	}
	for k, v := range role {
		flags[k] = v
	}
	return flags
}
