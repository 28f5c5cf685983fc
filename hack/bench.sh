#!/usr/bin/env bash
# The end-to-end benchmarks against a fresh private containerd, each
# interleaved: start-to-exit latency (agentbox vs the stock gVisor shim vs
# runc) with the shim's own phases (Create, Start, Delete), audit overhead
# (on vs off, the shim's peak RSS and CPU per event), CRI pods (agentbox baseline and
# allowlist vs runc: p50/p90/p99, 20 pods 4 at a time, memory per idle pod; each CRI
# call of a pod's start split into the shim's phases, wall and CPU, 1 and 4 at a time, beside
# runc and runsc alone),
# egress (allowlist vs open), the egress gateway (by name vs the address
# allowlist: HTTP and HTTPS latency, download throughput), the quarantine
# latency (idle, and under an audit flood), checkpoint and restore (idle and 200 MiB, and a
# Python agent's pod start from its role's template vs cold vs runc), and, on the
# hack/kube.sh cluster, agent-sandbox's SandboxClaim to the agent answering an exec (a warm
# pool, one whose claims bind a role and a key, a cold agentbox Sandbox, a cold runc one; and a warm
# claim beside busy warm pods: frozen, idle class and cap, idle class only, neither), model
# calls through a model host rule vs passthrough (time to first byte, each streamed event's
# delay, throughput, the shim's PSS), and an MCP tools/call through an api: mcp rule vs
# passthrough (JSON, a streamed answer's first event). Prints medians and ratios; also writes them
# to _output/bench-start.txt.
#   AGENTBOX_BENCH_ROUNDS=30 AGENTBOX_BENCH_CRI_ROUNDS=15 hack/bench.sh
#
# It installs what the benchmarks need first, as hack/test.sh does (cached:
# the full hack/setup.sh with the real-agent images, and the Kubernetes
# and agent-sandbox builds), so it runs after the quickstart alone.
source "$(dirname "$0")/lib.sh"
[ $# -eq 0 ] || die "usage: $0 [--help] (settings by environment: AGENTBOX_BENCH_ROUNDS, AGENTBOX_BENCH_CRI_ROUNDS)"
need_root
"$REPO_ROOT/hack/setup.sh"
"$REPO_ROOT/hack/kube/build.sh" >/dev/null
"$REPO_ROOT/hack/kube/agent-sandbox.sh" >/dev/null
mkdir -p "$REPO_ROOT/_output"
: >"$REPO_ROOT/_output/bench-start.txt"
step "benchmarks: start-to-exit, audit, CRI pods and memory, egress, gateway, quarantine, checkpoint, agent-sandbox claims (about 22 minutes; log: _output/bench.log)"
cd "$REPO_ROOT"
AGENTBOX_BENCH=1 AGENTBOX_BENCH_OUT="$REPO_ROOT/_output/bench-start.txt" \
  go test -tags e2e -count=1 -timeout 60m -v -run "^TestBenchmark" ./internal/e2e >"$REPO_ROOT/_output/bench.log" 2>&1 \
  || { echo "benchmark failed; rerun with -v: AGENTBOX_BENCH=1 go test -tags e2e -run TestBenchmark -v ./internal/e2e" >&2; exit 1; }
step "the audit receiver on one core (GOMAXPROCS=1)"
GOMAXPROCS=1 go test ./internal/audit/ingest -run '^$' -bench ReceiverPipeline -benchtime 2s \
  | awk '/events\/s/ { for (i = 1; i <= NF; i++) if ($(i+1) == "events/s") printf "audit receiver on one core (GOMAXPROCS=1): %d events/s (decode, join, scrub, hash, write)\n", $i }' \
  >>"$REPO_ROOT/_output/bench-start.txt"
cat "$REPO_ROOT/_output/bench-start.txt"
