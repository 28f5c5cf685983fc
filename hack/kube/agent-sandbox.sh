#!/usr/bin/env bash
# Builds kubernetes-sigs/agent-sandbox's controller (core and extensions:
# Sandbox, SandboxTemplate, SandboxWarmPool, SandboxClaim), its sandboxd
# (the runtime daemon its SDKs speak to) and its Go SDK's sandboxd example
# client (examples/sandboxd-sandbox/client) from the Go module proxy at
# AGENT_SANDBOX_VERSION (hack/lib.sh), and keeps the
# module's own k8s/ directory (its CRDs and RBAC) beside it, in the
# toolchain cache. hack/kube.sh agent-sandbox applies and starts them. Safe
# to run again: a finished build is reused.
#
#   hack/kube/agent-sandbox.sh    # prints the directory on stdout
source "$(dirname "$0")/../lib.sh"

dir=$(agent_sandbox_dir)
if [ -x "$dir/bin/agent-sandbox-controller" ] && [ -x "$dir/bin/sandboxd" ] && [ -x "$dir/bin/sandboxd-client" ] && [ -f "$dir/k8s/crds/agents.x-k8s.io_sandboxes.yaml" ]; then
  step "agent-sandbox $AGENT_SANDBOX_VERSION cached ($dir)"
  echo "$dir"; exit 0
fi
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp/bin"
step "building agent-sandbox's controller $AGENT_SANDBOX_VERSION from the Go module proxy (a few minutes, once)"
CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN=$dir.tmp/bin \
  go install "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$AGENT_SANDBOX_VERSION" \
  "sigs.k8s.io/agent-sandbox/packages/sandboxd/cmd/sandboxd@$AGENT_SANDBOX_VERSION" \
  "sigs.k8s.io/agent-sandbox/examples/sandboxd-sandbox/client@$AGENT_SANDBOX_VERSION"
mv "$dir.tmp/bin/client" "$dir.tmp/bin/sandboxd-client"
src=$(module_dir "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION")
[ -d "$src/k8s/crds" ] || die "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION has no k8s/crds"
cp -r "$src/k8s" "$dir.tmp/k8s" && chmod -R u+w "$dir.tmp/k8s"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
step "agent-sandbox $AGENT_SANDBOX_VERSION built ($dir)"
echo "$dir"
