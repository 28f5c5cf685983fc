#!/usr/bin/env bash
# Builds the project's binaries into _output/bin.
source "$(dirname "$0")/lib.sh"
mkdir -p "$OUT_BIN"
rev=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
ldflags="-X agentbox.dev/agentbox/internal/version.Revision=$rev"
step "building agentbox binaries into $OUT_BIN"
cd "$REPO_ROOT"
CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$OUT_BIN/" ./cmd/containerd-shim-agentbox-v1 ./cmd/agentbox
# The benchmark's stock-gVisor reference shim (see hack/stock-gvisor-shim).
CGO_ENABLED=0 go build -o "$OUT_BIN/containerd-shim-runsc-v1" ./hack/stock-gvisor-shim
