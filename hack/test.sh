#!/usr/bin/env bash
# The full test suite: installs what it needs (cached), then static checks,
# unit tests, and the end-to-end suite against a private containerd with the
# real shim, runsc, ctr and crictl. Needs root.
source "$(dirname "$0")/lib.sh"
need_root
"$REPO_ROOT/hack/setup.sh"
cd "$REPO_ROOT"
step "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './_output/*'))
[ -z "$unformatted" ] || die "gofmt needed: $unformatted"
go vet ./... && go vet -tags e2e ./internal/e2e
step "unit tests"
go test -count=1 ./...
step "end-to-end tests (private containerd, real shim, runsc, ctr, crictl)"
go test -tags e2e -count=1 -timeout 40m -v ./internal/e2e 2>&1 | tee "$REPO_ROOT/_output/e2e.log" \
  | grep --line-buffered -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go:[0-9]+' 
rc=${PIPESTATUS[0]}
step "end-to-end log: _output/e2e.log"
exit "$rc"
