#!/usr/bin/env bash
# The end-to-end benchmarks against a fresh private containerd, each
# interleaved: start-to-exit latency (agentbox vs the stock gVisor shim vs
# runc) with the shim's own phases (Create, Start, Delete), audit overhead
# (on vs off, the shim's peak RSS), CRI pods (agentbox baseline and
# allowlist vs runc: p50/p90/p99, 20 pods 4 at a time, memory per idle pod),
# egress (allowlist vs open). Prints medians and ratios; also writes them
# to _output/bench-start.txt.
#   AGENTBOX_BENCH_ROUNDS=30 AGENTBOX_BENCH_CRI_ROUNDS=15 hack/bench.sh
source "$(dirname "$0")/lib.sh"
need_root
"$REPO_ROOT/hack/build.sh"
mkdir -p "$REPO_ROOT/_output"
step "benchmark: ${AGENTBOX_BENCH_ROUNDS:-30} rounds x 3 runtimes"
cd "$REPO_ROOT"
AGENTBOX_BENCH=1 AGENTBOX_BENCH_OUT="$REPO_ROOT/_output/bench-start.txt" \
  go test -tags e2e -count=1 -timeout 30m -run "^TestBenchmark" ./internal/e2e >/dev/null \
  || { echo "benchmark failed; rerun with -v: AGENTBOX_BENCH=1 go test -tags e2e -run TestBenchmark -v ./internal/e2e" >&2; exit 1; }
cat "$REPO_ROOT/_output/bench-start.txt"
