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
# gVisor's checklocks, at the gVisor version go.mod pins: the fields the
# shim's locks guard (+checklocks annotations) are touched only under them.
# Built once, in a module of its own (its golang.org/x/tools is not the
# shim's), into the cache.
CHECKLOCKS_TOOLS_VERSION=v0.43.0
gvisor=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
cl=$cache/checklocks-$gvisor
if [ ! -x "$cl/checklocks" ]; then
  step "building gVisor's checklocks at $gvisor (once; cached in $cl)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cat >"$work/go.mod" <<MOD
module checklocks

go 1.25

require (
	gvisor.dev/gvisor $gvisor
	golang.org/x/tools $CHECKLOCKS_TOOLS_VERSION
)
MOD
  printf 'package main\n\nimport (\n\t"golang.org/x/tools/go/analysis/singlechecker"\n\t"gvisor.dev/gvisor/tools/checklocks"\n)\n\nfunc main() { singlechecker.Main(checklocks.Analyzer) }\n' >"$work/main.go"
  (cd "$work" && go mod tidy >/dev/null 2>&1 && go build -o "$cl/checklocks" .) || die "building checklocks failed"
fi
step "checklocks (gVisor $gvisor) on shim/ and shim/sandbox/"
go vet -vettool="$cl/checklocks" ./shim/ ./shim/sandbox/
