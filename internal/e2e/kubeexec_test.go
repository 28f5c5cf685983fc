//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
)

// restConfig is the cluster's client configuration (its KUBECONFIG).
func (k *kubeNode) restConfig(t *testing.T) *rest.Config {
	t.Helper()
	kc := os.Getenv("KUBECONFIG")
	for _, e := range k.env {
		if v, ok := strings.CutPrefix(e, "KUBECONFIG="); ok {
			kc = v
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// apiExec runs argv in a pod's first container through the API server,
// as an SDK does (and kubectl exec, less its own start): WebSocket, falling
// back to SPDY where the server refuses the upgrade. It returns stdout.
func apiExec(ctx context.Context, rc *rest.Config, ns, pod string, argv ...string) (string, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", err
	}
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", req.URL().String())
	if err != nil {
		return "", err
	}
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", req.URL())
	if err != nil {
		return "", err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		return "", err
	}
	var out, errb bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb}); err != nil {
		return out.String(), fmt.Errorf("exec %v in %s/%s: %w (stderr %q)", argv, ns, pod, err, clip(errb.String()))
	}
	return out.String(), nil
}
