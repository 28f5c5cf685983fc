package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/policysync"
)

func syncCommand() *cli.Command {
	return &cli.Command{
		Name:  "sync",
		Usage: "node agent: keep this node's policy snapshot in step with the cluster's AgentRole and AgentRoleBinding objects, apply AgentQuarantine objects to its sandboxes, and keep the Kubernetes Secrets roles name",
		Description: `Watches the cluster's policy objects and writes them into the node's policy
directory as one file (` + policysync.FileName + `), swapped in atomically, after
validating it with the shim's loader together with the node's own files there. An
invalid set is never applied: the node keeps its last good snapshot, and the objects'
status names the file, line and field. Without the API server, the node keeps what
it has. Every change is a record in the node's audit trail (node-NODE.jsonl).

It also quarantines this node's pods that an AgentQuarantine object names (by
namespace/name or label selector) through their sandboxes' control sockets, lifts
such a quarantine only when its object is deleted, and reports the pods in the
object's status.nodes.

A role's injected secret may name a key of a Kubernetes Secret (secretRef): the
agent reads no Secret itself. It asks the cluster's broker (agentbox broker,
--broker-url), which gives it the keys of the cluster roles of the agentbox pods
bound to this node and nothing else, every --secrets-every and whenever a pod is
bound here, and keeps each key's value in a file of its own under --secrets-dir
(mode 0600, directories 0700), where the shim reads it. A rotated value is
rewritten there and reaches the gateway's next requests; a key no pod here needs
is removed. It also tells each sandbox's shim which kubernetes-sigs/agent-sandbox
Sandbox its pod belongs to, and what holds it, for the trail. When such a Sandbox
whose role keeps memory on suspend (suspend: memory) is set to operatingMode
Suspended, it checkpoints the pod's sandbox before the pod goes and has the broker
name the checkpoint in the Sandbox's pod template, so that its next pod resumes
from it; it writes Events on the Sandbox, and removes the image once resumed, or
once the Sandbox is deleted. A pod of this node restored from the shared store gets
its image's data key from the broker, which no node can unwrap itself.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"}, Usage: "this node's name (its AgentNodePolicy object)"},
			kubeconfigFlag(),
			&cli.StringFlag{Name: "policy-dir", Usage: "the node's policy directory (default: the config's policy.dir)"},
			&cli.StringFlag{Name: "audit-dir", Usage: "where the node's audit trail goes (default: the config's audit.dir)"},
			&cli.StringFlag{Name: "secrets-dir", Usage: "where the keys the broker gives this node (secretRef) are kept, root's alone (default: the config's policy.secrets_dir; \"none\": not kept)"},
			&cli.DurationFlag{Name: "secrets-every", Value: 10 * time.Second, Usage: "ask the broker for this node's keys this often: a rotated Secret reaches the gateway within it"},
			&cli.StringFlag{Name: "broker-url", Usage: "the cluster's broker (https://…): keys, shared checkpoints' data keys, and the writes on Sandboxes (\"\": none: no secretRef key is kept, and Sandboxes are not suspended with memory)"},
			&cli.StringFlag{Name: "broker-ca", Value: "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", Usage: "the CA that signed the broker's certificate"},
			&cli.StringFlag{Name: "broker-token", Value: "/var/run/secrets/agentbox/broker/token", Usage: "this node agent's service-account token for the broker's audience (a projected token bound to its pod)"},
			&cli.StringFlag{Name: "checkpoint-dir", Usage: "the node's checkpoint store, where the image a resumed or deleted agent-sandbox Sandbox leaves is removed (default: the config's checkpoint.dir)"},
			&cli.StringFlag{Name: "checkpoint-shared-dir", Usage: "the cluster's shared checkpoint store, where the images of resumed or deleted Sandboxes are removed too (default: the config's checkpoint.shared_dir)"},
			&cli.StringFlag{Name: "checkpoint-public-key", Usage: "where the broker's public key is kept for the shim (default: the config's checkpoint.shared_public_key)"},
			&cli.StringFlag{Name: "checkpoint-keys-dir", Usage: "where the data keys the broker unwraps for this node's restores go (default: the config's checkpoint.keys_dir)"},
			&cli.StringFlag{Name: "control-dir", Usage: "this node's sandbox control sockets, for AgentQuarantine objects (default: the config's shim.control_dir; \"none\": do not apply them)"},
			configFlag(),
			&cli.DurationFlag{Name: "resync", Value: time.Minute, Usage: "re-validate this often even when no object changed"},
		},
		Action: runSync,
	}
}

func runSync(c *cli.Context) error {
	node := c.String("node-name")
	if node == "" {
		return cli.Exit("--node-name (or NODE_NAME) is required", 2)
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return cli.Exit(err, 1)
	}
	dir, auditDir := flagOr(c, "policy-dir", cfg.Policy.Dir), flagOr(c, "audit-dir", cfg.Audit.Dir)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return cli.Exit(fmt.Sprintf("policy directory %s: not a directory (%v)", dir, err), 1)
	}
	client, err := kubeClient(c, "agentbox-sync/"+node, 0, 0)
	if err != nil {
		return err
	}
	sink, err := audit.NewFileSink(auditDir, "node-"+node, cfg.Audit.MaxFileBytes)
	if err != nil {
		return cli.Exit(fmt.Sprintf("node audit trail: %v", err), 1)
	}
	trail := audit.NewTrail(audit.Meta{Sandbox: sink.Name(), PodName: node}, sink)
	log := logrus.New()
	log.SetOutput(c.App.ErrWriter)
	entry := log.WithFields(logrus.Fields{"node": node, "dir": dir})
	entry.WithField("trail", sink.Path()).Info("agentbox sync starting")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	controlDir := flagOr(c, "control-dir", cfg.Shim.ControlDir)
	if controlDir == "none" {
		controlDir = ""
	}
	secretsDir := flagOr(c, "secrets-dir", cfg.Policy.SecretsDir)
	if secretsDir == "none" {
		secretsDir = ""
	}
	var bc *broker.Client
	if u := c.String("broker-url"); u != "" {
		if bc, err = broker.NewClient(u, c.String("broker-ca"), c.String("broker-token")); err != nil {
			return cli.Exit(fmt.Sprintf("--broker-url: %v", err), 2)
		}
	}
	agent := &policysync.Agent{Broker: bc, SharedDir: flagOr(c, "checkpoint-shared-dir", cfg.Checkpoint.SharedDir),
		PublicKeyFile: flagOr(c, "checkpoint-public-key", cfg.Checkpoint.SharedPublicKey), KeysDir: flagOr(c, "checkpoint-keys-dir", cfg.Checkpoint.KeysDir),
		Client: client, NodeName: node, PolicyDir: dir, Trail: trail, Log: entry, Resync: c.Duration("resync"), ControlDir: controlDir,
		SecretsDir: secretsDir, SecretsEvery: c.Duration("secrets-every"), CheckpointDir: flagOr(c, "checkpoint-dir", cfg.Checkpoint.Dir)}
	runErr := agent.Run(ctx)
	if err := trail.Close(audit.TypeSandboxEnd.New("Success", "agentbox sync stopped", map[string]string{"node": node})); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// kubeClient is a client of the API server as --kubeconfig names it, else
// as the pod's service account. qps and burst bound its rate (0: client-go's
// 5 and 10).
func kubeClient(c *cli.Context, userAgent string, qps float32, burst int) (dynamic.Interface, error) {
	var rc *rest.Config
	var err error
	if kc := c.String("kubeconfig"); kc != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kc)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("kubernetes client: %v", err), 1)
	}
	rc.UserAgent = userAgent
	rc.QPS, rc.Burst = qps, burst
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("kubernetes client: %v", err), 1)
	}
	return client, nil
}
