#!/usr/bin/env bash
# The end-to-end suite (internal/e2e, build tag e2e) against a private
# containerd with the real shim, runsc, ctr and crictl, and a real kubelet.
# Needs root and the toolchain from hack/setup.sh (and hack/kube/build.sh
# for the Kubernetes parts). In three parts, each its own `go test` run
# with its log in _output/e2e-PART.log:
#   node     every test but the TestKube ones (the compatibility
#            containerds and the collector of hack/setup.sh extras too)
#   kube     the TestKube tests, on one private cluster (kube-up.log)
#   release  TestKubeRelease: the release's install, upgrade and
#            uninstall take agentbox off the cluster, so it has a cluster
#            of its own, after the kube part has taken its down
#
#   hack/e2e.sh                # node, kube, release
#   hack/e2e.sh kube release   # only those parts, in that order
source "$(dirname "$0")/lib.sh"
need_root
cd "$REPO_ROOT"
mkdir -p _output
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(node kube release)
filter() { grep --line-buffered -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go:[0-9]+'; }
rc=0
for part in "${parts[@]}"; do
  # The Kubernetes parts use the nodes' own containerds: the suite's
  # private one needs only the small images (no real-agent or agent-CLI
  # image, about a minute of imports).
  # The release's cluster runs no agent: neither agent image (hack/kube.sh).
  images=all agents="realagent agentcli"
  case "$part" in
    node) what="the node's tests (private containerd, real shim, runsc, ctr, crictl)"; sel=(-timeout 45m -skip '^TestKube') ;;
    kube) what="the Kubernetes tests (a real kubelet and control plane)"; sel=(-timeout 45m -run '^TestKube' -skip '^TestKubeRelease$'); images=base ;;
    release) what="the release on a cluster of its own (TestKubeRelease)"; sel=(-timeout 20m -run '^TestKubeRelease$'); images=base agents= ;;
    *) die "unknown part $part (node, kube or release)" ;;
  esac
  step "end-to-end, $part: $what"
  AGENTBOX_DEV_IMAGES=$images AGENTBOX_KUBE_AGENT_IMAGES=$agents go test -tags e2e -count=1 -v "${sel[@]}" ./internal/e2e 2>&1 | tee "_output/e2e-$part.log" | filter
  [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; step "end-to-end, $part: FAILED (log: _output/e2e-$part.log)"; }
done
step "end-to-end logs: _output/e2e-{$(IFS=,; echo "${parts[*]}")}.log"
exit "$rc"
