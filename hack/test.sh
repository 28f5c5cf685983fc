#!/usr/bin/env bash
# The full test suite: installs what it needs (cached), then the static
# checks, the unit tests, the fuzz targets, the vulnerability check, and
# the end-to-end suite against a private containerd with the real shim,
# runsc, ctr and crictl, and through a kubelet on a private single-node
# cluster (Makefile targets check, lint, test, fuzz, vulncheck and e2e).
# Needs root.
#
# Cold, most of the time is building (Kubernetes alone is about 20
# CPU-minutes on 2 cores). So work that does not depend on other work runs
# beside it, in lanes (hack/lib.sh lane_start; logs in _output/lanes/),
# until the machine is busy throughout (docs/testing.md has the figures):
#   1. Kubernetes, etcd and agent-sandbox's controller build beside the
#      core setup (runsc, containerd, crictl, agentbox, the images).
#   2. The Kubernetes tests run while the compatibility containerds and
#      the collector build (nice 10), and the static checks, unit tests,
#      fuzz targets and vulnerability check run (nice 19): pure Go, none of
#      them touches what the tests start.
#   3. The node's tests (which need the extras), then the release's.
# Every lane's log is printed when it is waited for; any failure fails the
# run, after everything has run.
source "$(dirname "$0")/lib.sh"
need_root
cd "$REPO_ROOT"
failed=()
lane_start kube-build 0 bash -c '"$1/hack/kube/build.sh" >/dev/null && "$1/hack/kube/agent-sandbox.sh" >/dev/null' _ "$REPO_ROOT"
"$REPO_ROOT/hack/setup.sh" core
lane_wait kube-build || die "etcd, Kubernetes or agent-sandbox did not build: the Kubernetes tests cannot run"
lane_start extras 10 "$REPO_ROOT/hack/setup.sh" extras
lane_start checks 19 bash -c '
  set -e
  step() { printf "==> %s\n" "$*"; }
  step "static checks (make check: gofmt, go vet, staticcheck)"; make --no-print-directory check
  step "golangci-lint (make lint: errorlint, errcheck on shim/, the layering)"; make --no-print-directory lint
  step "unit tests (make test)"; make --no-print-directory test
  step "fuzz targets, 10s each (make fuzz)"; make --no-print-directory fuzz
  step "known vulnerabilities (make vulncheck)"; make --no-print-directory vulncheck'
"$REPO_ROOT/hack/e2e.sh" kube || failed+=("end-to-end, kube")
lane_wait extras || failed+=("setup extras")
"$REPO_ROOT/hack/e2e.sh" node release || failed+=("end-to-end, node or release")
lane_wait checks || failed+=("checks, unit tests, fuzz or vulncheck")
[ ${#failed[@]} = 0 ] || die "failed: $(IFS=';'; echo "${failed[*]}")"
step "all passed"
