package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"agentbox.dev/agentbox/internal/config"
	"agentbox.dev/agentbox/internal/install"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// check is one doctor line: a name, and a detail or an error.
type check struct {
	name   string
	detail string
	err    error
}

func (c check) String() string {
	if c.err != nil {
		return fmt.Sprintf("FAIL  %-12s %v", c.name, c.err)
	}
	return fmt.Sprintf("PASS  %-12s %s", c.name, c.detail)
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check that this node can run agentbox: runsc, containerd, the runtime, nftables, cgroups",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "address", Value: "/run/containerd/containerd.sock", Usage: "containerd socket", EnvVars: []string{"CONTAINERD_ADDRESS"}},
			configFlag(),
			&cli.StringFlag{Name: "handler", Value: "agentbox", Usage: "CRI runtime handler expected to map to the agentbox shim"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "how long to wait for containerd"},
		},
		Action: func(c *cli.Context) error {
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			runsc, found := findRunsc(configPath(c))
			checks := []check{
				checkRunsc(runsc, found),
				checkSeccompErrno(c.Context, runsc, found),
				checkShimBinary(),
				checkContainerd(ctx, c.String("address"), c.String("handler")),
				checkNftables(),
				checkCgroups("/sys/fs/cgroup"),
			}
			return report(c.App.Writer, checks)
		},
	}
}

// report prints one line per check and fails when any check failed.
func report(w io.Writer, checks []check) error {
	failed := 0
	for _, c := range checks {
		fmt.Fprintln(w, c)
		if c.err != nil {
			failed++
		}
	}
	if failed > 0 {
		return cli.Exit(fmt.Sprintf("%d of %d checks failed", failed, len(checks)), 1)
	}
	return nil
}

// findRunsc returns the runsc binary the shim config names.
func findRunsc(cfgPath string, named bool) (string, error) {
	cfg, err := config.Load(cfgPath, named)
	if err != nil {
		return "", err
	}
	path, err := exec.LookPath(cfg.Runsc.Binary)
	if err != nil {
		return "", fmt.Errorf("%q not found (config %s): %w", cfg.Runsc.Binary, sourceName(cfg), err)
	}
	return path, nil
}

func checkRunsc(path string, found error) check {
	c := check{name: "runsc", err: found}
	if found != nil {
		return c
	}
	if err := requireStatic(path); err != nil {
		c.err = err
		return c
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		c.err = fmt.Errorf("%s --version: %w", path, err)
		return c
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	c.detail = fmt.Sprintf("%s (static; %s)", path, first)
	return c
}

func sourceName(cfg *config.Config) string {
	if cfg.Source == "" {
		return "built-in defaults"
	}
	return cfg.Source
}

// requireStatic is install.RequireStatic: runsc must be static.
func requireStatic(path string) error { return install.RequireStatic(path) }

func checkShimBinary() check {
	c := check{name: "shim"}
	path, err := exec.LookPath("containerd-shim-agentbox-v1")
	if err != nil {
		c.err = errors.New("containerd-shim-agentbox-v1 not on PATH: containerd cannot start the runtime")
		return c
	}
	c.detail = path
	return c
}

func checkContainerd(ctx context.Context, address, handler string) check {
	c := check{name: "containerd"}
	if _, err := os.Stat(address); err != nil {
		c.err = fmt.Errorf("socket %s: %w", address, err)
		return c
	}
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.err = err
		return c
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	v, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		c.err = fmt.Errorf("CRI on %s: %w", address, err)
		return c
	}
	st, err := rs.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		c.err = fmt.Errorf("CRI status on %s: %w", address, err)
		return c
	}
	names := handlerNames(st)
	for _, n := range names {
		if n == handler {
			c.detail = fmt.Sprintf("%s %s at %s; runtime handler %q registered", v.GetRuntimeName(), v.GetRuntimeVersion(), address, handler)
			return c
		}
	}
	c.err = fmt.Errorf("%s %s at %s has no runtime handler %q (has %v): see examples/containerd-config.toml", v.GetRuntimeName(), v.GetRuntimeVersion(), address, handler, names)
	return c
}

// handlerNames lists the CRI's runtime handlers: from the status's
// runtime_handlers (containerd 2.x), else from the CRI config in the
// verbose status (containerd 1.7 does not fill runtime_handlers).
func handlerNames(st *runtimeapi.StatusResponse) []string {
	var names []string
	for _, h := range st.GetRuntimeHandlers() {
		names = append(names, h.GetName())
	}
	if len(names) > 0 {
		return names
	}
	var cfg struct {
		Containerd struct {
			Runtimes map[string]json.RawMessage `json:"runtimes"`
		} `json:"containerd"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["config"]), &cfg); err == nil {
		for n := range cfg.Containerd.Runtimes {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

func checkNftables() check {
	c := check{name: "nftables"}
	out, err := exec.Command("nft", "--version").CombinedOutput()
	if err != nil {
		c.err = fmt.Errorf("nft: %w (install Debian's nftables)", err)
		return c
	}
	c.detail = strings.TrimSpace(string(out))
	// Load the shape of ruleset the shim loads (a netdev egress hook, sets
	// with timeouts, rate-limited logging to nfnetlink_log) into a
	// throwaway network namespace: a kernel without one of them would
	// refuse every pod with egress rules.
	cmd := exec.Command("unshare", "--net", "--", "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(sampleRuleset())
	if out, err := cmd.CombinedOutput(); err != nil {
		c.err = fmt.Errorf("%s, but the egress ruleset does not load in a scratch namespace (needs root, kernel netdev egress hooks, nft sets with timeouts, nfnetlink_log): %v: %s", c.detail, err, strings.TrimSpace(string(out)))
		return c
	}
	c.detail += "; egress ruleset loads"
	return c
}

// sampleRuleset is an allowlist with a host rule, rendered for lo.
func sampleRuleset() string {
	p := &policy.Profile{}
	p.Network.Egress = policy.EgressAllowlist
	p.Network.Allow = []policy.EgressRule{{Host: "example.com", Ports: []int{443}}, {CIDR: "10.0.0.0/8"}}
	pl, err := netpolicy.Compile(p)
	if err != nil {
		panic(err) // a fixed, valid profile
	}
	return pl.Ruleset("lo")
}

// cgroupMode names the cgroup layout mounted at root.
func cgroupMode(root string) (string, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return "v2 (unified)", nil
	}
	if _, err := os.Stat(filepath.Join(root, "memory")); err != nil {
		return "", fmt.Errorf("no cgroup hierarchy at %s", root)
	}
	if _, err := os.Stat(filepath.Join(root, "unified", "cgroup.controllers")); err == nil {
		return "v1 + v2 hybrid", nil
	}
	return "v1 (legacy)", nil
}

func checkCgroups(root string) check {
	c := check{name: "cgroups"}
	mode, err := cgroupMode(root)
	if err != nil {
		c.err = err
		return c
	}
	c.detail = mode
	return c
}
