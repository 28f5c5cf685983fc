package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/policysync"
)

// forkCommand forks a running agent-sandbox Sandbox from Kubernetes: it
// asks (broker.ForkAnnotation) and waits for the node's answer.
func forkCommand() *cli.Command {
	return &cli.Command{
		Name:      "fork",
		Usage:     "fork a running agent-sandbox Sandbox into copies (Kubernetes: the Sandbox's node checkpoints it while it runs, the broker makes the copies)",
		ArgsUsage: "--sandbox NAMESPACE/NAME --copies N",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "sandbox", Required: true, Usage: "NAMESPACE/NAME: the Sandbox to fork"},
			&cli.IntFlag{Name: "copies", Value: 1, Usage: fmt.Sprintf("how many copies (1 to %d)", broker.MaxForkCopies)},
			&cli.DurationFlag{Name: "timeout", Value: 3 * time.Minute, Usage: "how long to wait for the copies"},
			kubeconfigFlag(),
			outputFlag("text", "json"),
		},
		Action: sandboxFork,
	}
}

// forkAnswer is what a fork made.
type forkAnswer struct {
	Sandbox    string   `json:"sandbox"`
	Checkpoint string   `json:"checkpoint"`
	Copies     []string `json:"copies"`
}

func sandboxFork(c *cli.Context) error {
	out, err := output(c, "text", "json")
	if err != nil {
		return err
	}
	ns, name, ok := strings.Cut(c.String("sandbox"), "/")
	if !ok || ns == "" || name == "" {
		return cli.Exit(fmt.Sprintf("--sandbox %q: want NAMESPACE/NAME", c.String("sandbox")), 2)
	}
	n := c.Int("copies")
	if _, err := broker.ForkCount(strconv.Itoa(n)); err != nil {
		return cli.Exit("--copies: "+err.Error(), 2)
	}
	client, err := kubeClient(c, "agentbox-fork", 0, 0)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	sbs := client.Resource(policysync.SandboxesGVR).Namespace(ns)
	sb, err := sbs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return cli.Exit(fmt.Sprintf("Sandbox %s/%s: %v", ns, name, err), 1)
	}
	before := sb.GetAnnotations()[broker.ForkedAnnotation]
	if _, pending := sb.GetAnnotations()[broker.ForkAnnotation]; pending {
		return cli.Exit(fmt.Sprintf("Sandbox %s/%s has a fork request already (%s); remove it to ask again", ns, name, broker.ForkAnnotation), 1)
	}
	// The node's refusals said before this request are not its answer.
	seen := map[string]bool{}
	forkRefusal(ctx, client, ns, name, seen)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": sb.GetUID(), "annotations": map[string]string{broker.ForkAnnotation: strconv.Itoa(n)}}})
	if _, err := sbs.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "agentbox-fork"}); err != nil {
		return cli.Exit(fmt.Sprintf("asking Sandbox %s/%s for a fork: %v", ns, name, err), 1)
	}
	for {
		sb, err = sbs.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if now := sb.GetAnnotations()[broker.ForkedAnnotation]; now != before && now != "" {
				return printFork(c, out, ns+"/"+name, now)
			}
		}
		if why := forkRefusal(ctx, client, ns, name, seen); why != "" {
			return cli.Exit(fmt.Sprintf("Sandbox %s/%s was not forked: %s (remove %s to ask again)", ns, name, why, broker.ForkAnnotation), 1)
		}
		select {
		case <-ctx.Done():
			return cli.Exit(fmt.Sprintf("Sandbox %s/%s: no copies in %v (is its pod running on a node with agentbox sync, and the broker up?)", ns, name, c.Duration("timeout")), 1)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// forkRefusal is the message of a ForkRefused or ForkFailed Event on the
// Sandbox that is not in seen ("": none); it adds each it reads to seen.
func forkRefusal(ctx context.Context, client dynamic.Interface, ns, name string, seen map[string]bool) string {
	evs, err := client.Resource(policysync.EventsGVR).Namespace(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Sandbox,involvedObject.name=" + name})
	if err != nil {
		return ""
	}
	why := ""
	for _, ev := range evs.Items {
		reason, _ := ev.Object["reason"].(string)
		if (reason == "ForkRefused" || reason == "ForkFailed") && !seen[string(ev.GetUID())] {
			seen[string(ev.GetUID())] = true
			why, _ = ev.Object["message"].(string)
		}
	}
	return why
}

func printFork(c *cli.Context, out, sandbox, forked string) error {
	image, list, _ := strings.Cut(forked, ": ")
	a := forkAnswer{Sandbox: sandbox, Checkpoint: image}
	for _, cp := range strings.Split(list, ", ") {
		name, _, _ := strings.Cut(cp, "=")
		a.Copies = append(a.Copies, name)
	}
	if out == "json" {
		return writeJSON(c.App.Writer, a)
	}
	fmt.Fprintf(c.App.Writer, "Sandbox %s forked into checkpoint %s: copies %s\n", sandbox, image, strings.Join(a.Copies, ", "))
	return nil
}
