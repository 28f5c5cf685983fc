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
fuzz_once() { go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" "$1" >"$3" 2>&1; }
# deadline_race LOG: the failure is the coordinator's, not the target's.
deadline_race() {
  grep -q '^    context deadline exceeded$' "$1" &&
    ! grep -Eq 'Failing input written|panic:|_test\.go:[0-9]+:|fuzzing process hung' "$1"
}
n=0
for file in $targets; do
  pkg=./$(dirname "${file#./}")
  for fn in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    step "fuzz $pkg $fn ($fuzztime)"
    # The cache of interesting inputs stays out of the tree (.gitignore).
    log=/tmp/agentbox-fuzz-$fn.log
    if ! fuzz_once "$pkg" "$fn" "$log"; then
      # Go 1.26's coordinator can fail a target with a bare "context
      # deadline exceeded" as -fuzztime ends, without any failing input
      # (golang/go#75804, fixed in Go 1.27). A real finding always writes
      # its input ("Failing input written to"); only the bare race is run
      # again, once, and said so.
      if deadline_race "$log"; then
        step "fuzz $pkg $fn: Go's fuzztime race (golang/go#75804), no failing input; running it once more"
        fuzz_once "$pkg" "$fn" "$log" || { tail -n 30 "$log" >&2; die "fuzz target $fn in $pkg failed twice"; }
      else
        tail -n 30 "$log" >&2
        die "fuzz target $fn in $pkg failed"
      fi
    fi
    n=$((n + 1))
  done
done
step "$n fuzz targets ran for $fuzztime each"
