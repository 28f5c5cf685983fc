#!/usr/bin/env bash
# The full test suite: installs what it needs (cached), then the static
# checks, the unit tests, and the end-to-end suite against a private
# containerd with the real shim, runsc, ctr and crictl, and through a
# kubelet on a private single-node cluster (Makefile targets check, test
# and e2e). Needs root.
source "$(dirname "$0")/lib.sh"
need_root
"$REPO_ROOT/hack/setup.sh"
# etcd and Kubernetes for the TestKube tests (about 16 CPU-minutes the
# first time, cached after).
"$REPO_ROOT/hack/kube/build.sh" >/dev/null
# kubernetes-sigs/agent-sandbox's controller for TestKubeAgentSandbox
# (a few minutes the first time, cached after).
"$REPO_ROOT/hack/kube/agent-sandbox.sh" >/dev/null
cd "$REPO_ROOT"
step "static checks (make check: gofmt, go vet, staticcheck)"
make --no-print-directory check
step "golangci-lint (make lint: errorlint, errcheck on shim/, the layering)"
make --no-print-directory lint
step "unit tests (make test)"
make --no-print-directory test
step "fuzz targets, 10s each (make fuzz)"
make --no-print-directory fuzz
step "known vulnerabilities (make vulncheck)"
make --no-print-directory vulncheck
make --no-print-directory e2e
