#!/usr/bin/env bash
# The end-to-end suite (internal/e2e, build tag e2e) against a private
# containerd with the real shim, runsc, ctr and crictl. Needs root and the
# toolchain from hack/setup.sh. The full log goes to _output/e2e.log.
source "$(dirname "$0")/lib.sh"
need_root
cd "$REPO_ROOT"
mkdir -p _output
step "end-to-end tests (private containerd, real shim, runsc, ctr, crictl)"
filter() { grep --line-buffered -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go:[0-9]+'; }
go test -tags e2e -count=1 -timeout 60m -v -skip '^TestKubeRelease$' ./internal/e2e 2>&1 | tee "$REPO_ROOT/_output/e2e.log" | filter
rc=${PIPESTATUS[0]}
# The release's install, upgrade and uninstall take agentbox off the
# cluster: on a cluster of their own, after the suite has taken its down.
step "the release on a cluster of its own (TestKubeRelease)"
go test -tags e2e -count=1 -timeout 20m -v -run '^TestKubeRelease$' ./internal/e2e 2>&1 | tee -a "$REPO_ROOT/_output/e2e.log" | filter
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
step "end-to-end log: _output/e2e.log"
exit "$rc"
