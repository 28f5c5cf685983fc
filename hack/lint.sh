#!/usr/bin/env bash
# golangci-lint, pinned, built once from the Go module proxy into the cache
# (about two minutes the first time), with .golangci.yml. No root.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
GOLANGCI_LINT_VERSION=v2.15.0
cache=$AGENTBOX_CACHE
[ -w "$cache" ] || [ -w "$(dirname "$cache")" ] || cache=${XDG_CACHE_HOME:-$HOME/.cache}/agentbox
bin=$cache/golangci-lint-$GOLANGCI_LINT_VERSION
if [ ! -x "$bin/golangci-lint" ]; then
  step "building golangci-lint $GOLANGCI_LINT_VERSION (once; cached in $bin)"
  GOBIN=$bin go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
fi
step "golangci-lint $GOLANGCI_LINT_VERSION (.golangci.yml)"
"$bin/golangci-lint" config verify
"$bin/golangci-lint" run ./...
