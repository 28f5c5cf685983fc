package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"agentbox.dev/agentbox/internal/broker"
	"agentbox.dev/agentbox/internal/checkpoint"
)

// The broker's rate of API calls: it answers every node (a key sync, a
// claim: four or five calls each), so client-go's default of 5 a second
// queued a claim's identity for 1.5 s behind the keys of a pool's refill.
const (
	brokerQPS   = 50
	brokerBurst = 100
)

func brokerCommand() *cli.Command {
	return &cli.Command{
		Name:  "broker",
		Usage: "cluster component: give each node's agent only what the pods bound to that node need (Secret keys, shared checkpoints' data keys, its writes on Sandboxes), and write the policy objects' status from the nodes' reports",
		Description: `Runs off the agent nodes (examples/kubernetes/broker.yaml), with the only
credentials that reach beyond one node: get on the Secrets roles name, the
key-encryption key of the shared checkpoint store, and patch on agent-sandbox's
Sandboxes. It serves node agents over HTTPS. Each request carries the node agent's
service-account token for the --audience, bound to its pod; the API server's
TokenReview names the node that pod is bound to, and the broker answers for that
node alone:

  GET  /v1/keys        the keys the cluster roles of the agentbox pods bound to
                       the node inject (a binding must bind the pod's namespace or
                       handler to its role; a node's own policy files grant none)
  POST /v1/unwrap      a shared image's data key, for a pod bound to the node that
                       is the own pod of the image's Sandbox and asks to restore it
  GET  /v1/public-key  the public half of the key-encryption key
  POST /v1/sandbox     the checkpoint annotation, and a pin to the node, on a
                       Sandbox whose own pod is bound to the node, or their removal

Every refusal is logged with the node and answered 403 with its reason, which the
node agent records in its node's trail (docs/security.md). It also writes each
AgentRole's and AgentRoleBinding's status from every node's AgentNodePolicy report:
no node writes another's.`,
		Flags: []cli.Flag{
			kubeconfigFlag(),
			&cli.StringFlag{Name: "listen", Value: ":8443", Usage: "the HTTPS address"},
			&cli.StringFlag{Name: "tls-cert", Required: true, Usage: "the serving certificate (PEM), signed by the CA the node agents trust (--broker-ca)"},
			&cli.StringFlag{Name: "tls-key", Required: true, Usage: "its key"},
			&cli.StringFlag{Name: "kek", Usage: "the key-encryption key of the shared checkpoint store: an RSA private key of at least 3072 bits (PEM); \"\": no shared store"},
			&cli.StringFlag{Name: "audience", Value: broker.Audience, Usage: "the audience node agents' tokens must be for"},
			&cli.StringFlag{Name: "node-agent", Value: "system:serviceaccount:kube-system:agentbox-sync", Usage: "the node agents' user: no other is served"},
		},
		Action: runBroker,
	}
}

func runBroker(c *cli.Context) error {
	client, err := kubeClient(c, "agentbox-broker", brokerQPS, brokerBurst)
	if err != nil {
		return err
	}
	var kek *checkpoint.PrivateKEK
	if p := c.String("kek"); p != "" {
		b, err := os.ReadFile(p)
		if err == nil {
			kek, err = checkpoint.ParsePrivateKEK(b)
		}
		if err != nil {
			return cli.Exit(fmt.Sprintf("--kek %s: %v", p, err), 1)
		}
	}
	cert, err := tls.LoadX509KeyPair(c.String("tls-cert"), c.String("tls-key"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("--tls-cert/--tls-key: %v", err), 1)
	}
	log := logrus.New()
	log.SetOutput(c.App.ErrWriter)
	entry := log.WithField("component", "agentbox-broker")
	tickets, err := broker.NewTickets()
	if err != nil {
		return cli.Exit(err, 1)
	}
	s := &broker.Server{API: &broker.Cluster{Client: client}, KEK: kek, Audience: c.String("audience"), NodeAgent: c.String("node-agent"), Log: entry, Tickets: tickets}
	srv := &http.Server{
		Addr: c.String("listen"), Handler: s.Handler(),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second,
		ErrorLog: nil,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	kekID := "none"
	if kek != nil {
		kekID = kek.ID()
	}
	go func() {
		if err := (&broker.StatusWriter{Client: client, Log: entry}).Run(ctx); err != nil {
			entry.WithError(err).Error("the policy objects' status is not written")
		}
	}()
	entry.WithFields(logrus.Fields{"listen": srv.Addr, "kek": kekID, "node_agent": s.NodeAgent}).Info("agentbox broker serving")
	if err := srv.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return cli.Exit(err, 1)
	}
	return nil
}
