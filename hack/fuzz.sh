#!/usr/bin/env bash
# Runs every fuzz target in the module for a short, fixed time each
# (FUZZTIME, default 10s): the seeds and what the fuzzer finds in that
# time. A failure leaves its input under the package's testdata/fuzz/ for
# `go test` to replay. make fuzz and hack/test.sh (so CI) run it; no root.
#
#   hack/fuzz.sh            # every target, FUZZTIME each
#   FUZZTIME=2m hack/fuzz.sh
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
fuzztime=${FUZZTIME:-10s}
targets=$(grep -rl --include='*_test.go' '^func Fuzz' . | sort)
[ -n "$targets" ] || die "no fuzz targets found"
n=0
for file in $targets; do
  pkg=./$(dirname "${file#./}")
  for fn in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    step "fuzz $pkg $fn ($fuzztime)"
    # The cache of interesting inputs stays out of the tree (.gitignore).
    go test -run '^$' -fuzz "^$fn\$" -fuzztime "$fuzztime" "$pkg" >"/tmp/agentbox-fuzz-$fn.log" 2>&1 \
      || { tail -n 30 "/tmp/agentbox-fuzz-$fn.log" >&2; die "fuzz target $fn in $pkg failed"; }
    n=$((n + 1))
  done
done
step "$n fuzz targets ran for $fuzztime each"
