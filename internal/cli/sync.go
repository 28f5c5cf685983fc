package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"agentbox.dev/agentbox/internal/audit"
	"agentbox.dev/agentbox/internal/policy"
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
agent reads each Secret the node's roles name (a GET every --secrets-every; grant
it get on those names only) and keeps each key's value in a file of its own under
--secrets-dir (mode 0600, directories 0700), where the shim reads it. A rotated
value is rewritten there and reaches the gateway's next requests. It also tells
each sandbox's shim which kubernetes-sigs/agent-sandbox Sandbox its pod belongs
to, and what holds it, for the trail. When such a Sandbox whose role keeps memory
on suspend (suspend: memory) is set to operatingMode Suspended, it checkpoints the
pod's sandbox before the pod goes and names the checkpoint in the Sandbox's pod
template, so that its next pod resumes from it; it writes Events on the Sandbox,
and removes the image once resumed, or once the Sandbox is deleted.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"}, Usage: "this node's name (its AgentNodePolicy object)"},
			&cli.StringFlag{Name: "kubeconfig", EnvVars: []string{"KUBECONFIG"}, Usage: "kubeconfig (default: the pod's service account)"},
			&cli.StringFlag{Name: "policy-dir", Usage: "the node's policy directory (default: the config's policy.dir)"},
			&cli.StringFlag{Name: "audit-dir", Usage: "where the node's audit trail goes (default: the config's audit.dir)"},
			&cli.StringFlag{Name: "secrets-dir", Usage: "where the Kubernetes Secrets roles name (secretRef) are kept on the node, root's alone (default: the config's policy.secrets_dir; \"none\": not kept)"},
			&cli.DurationFlag{Name: "secrets-every", Value: 10 * time.Second, Usage: "read the Secrets roles name this often (one GET each): a rotated Secret reaches the gateway within it"},
			&cli.StringFlag{Name: "checkpoint-dir", Usage: "the node's checkpoint store, where the image a resumed or deleted agent-sandbox Sandbox leaves is removed (default: the config's checkpoint.dir)"},
			&cli.StringFlag{Name: "checkpoint-shared-dir", Usage: "the cluster's shared checkpoint store, where the images of resumed or deleted Sandboxes are removed too (default: the config's checkpoint.shared_dir)"},
			&cli.StringFlag{Name: "checkpoint-key-secret", Usage: "NAMESPACE/NAME/KEY: the Secret key holding the cluster's checkpoint key (32 bytes), kept in --checkpoint-key-file"},
			&cli.StringFlag{Name: "checkpoint-key-file", Usage: "where the cluster's checkpoint key is kept (default: the config's checkpoint.shared_key_file)"},
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
	var rc *rest.Config
	if kc := c.String("kubeconfig"); kc != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kc)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return cli.Exit(fmt.Sprintf("kubernetes client: %v", err), 1)
	}
	rc.UserAgent = "agentbox-sync/" + node
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return cli.Exit(fmt.Sprintf("kubernetes client: %v", err), 1)
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
	var keyRef *policy.SecretRef
	if v := c.String("checkpoint-key-secret"); v != "" {
		parts := strings.Split(v, "/")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return cli.Exit(fmt.Sprintf("--checkpoint-key-secret %q: want NAMESPACE/NAME/KEY", v), 2)
		}
		keyRef = &policy.SecretRef{Namespace: parts[0], Name: parts[1], Key: parts[2]}
	}
	keyFile := flagOr(c, "checkpoint-key-file", cfg.Checkpoint.SharedKeyFile)
	if keyRef != nil && keyFile == "" {
		return cli.Exit("--checkpoint-key-secret needs --checkpoint-key-file (or the config's checkpoint.shared_key_file)", 2)
	}
	agent := &policysync.Agent{CheckpointKey: keyRef, CheckpointKeyFile: keyFile, SharedDir: flagOr(c, "checkpoint-shared-dir", cfg.Checkpoint.SharedDir),
		Client: client, NodeName: node, PolicyDir: dir, Trail: trail, Log: entry, Resync: c.Duration("resync"), ControlDir: controlDir,
		SecretsDir: secretsDir, SecretsEvery: c.Duration("secrets-every"), CheckpointDir: flagOr(c, "checkpoint-dir", cfg.Checkpoint.Dir)}
	runErr := agent.Run(ctx)
	if err := trail.Close(audit.TypeSandboxEnd.New("Success", "agentbox sync stopped", map[string]string{"node": node})); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}
