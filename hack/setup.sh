#!/usr/bin/env bash
# Installs and builds everything agentbox needs into a cache reused across
# runs: Debian packages, static runsc at the pinned gVisor version,
# containerd + ctr + the runc shim, crictl, containerd 1.7; then the
# project's binaries and the local images. Safe to run again: finished
# steps are skipped. (etcd and Kubernetes, for hack/kube.sh and the
# TestKube tests, are hack/kube/build.sh's: hack/test.sh runs it.)
#
#   hack/setup.sh              # everything the tests need
#   hack/setup.sh quickstart   # only what hack/quickstart.sh runs: no
#                              # compatibility containerds, no real-agent image
#   hack/setup.sh core         # everything but what extras builds
#   hack/setup.sh extras       # only the compatibility containerds and the
#                              # OpenTelemetry Collector (hack/test.sh builds
#                              # them beside the Kubernetes tests, which
#                              # need neither)
source "$(dirname "$0")/lib.sh"
need_root
setup_mode=${1:-full}
case "$setup_mode" in full|quickstart|core|extras) ;; *) die "usage: $0 [quickstart|core|extras]" ;; esac
# has PART: whether this mode sets up PART (core: the toolchain, the
# project's binaries and the images; extras: see above; tests: what only
# the test suite needs, in core).
has() {
  case "$1.$setup_mode" in
    core.full|core.quickstart|core.core|extras.full|extras.extras|tests.full|tests.core) return 0 ;;
  esac
  return 1
}
mkdir -p "$TOOLS_BIN" "$AGENTBOX_CACHE/logs" "$OUT_BIN"

missing=()
packages=("${APT_PACKAGES[@]}")
# The full setup adds the browser the audit report's test renders in.
[ "$setup_mode" = quickstart ] || packages+=("${TEST_APT_PACKAGES[@]}")
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  apt-get update -qq >"$AGENTBOX_CACHE/logs/apt.log" 2>&1 || die "apt-get update failed: see $AGENTBOX_CACHE/logs/apt.log"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$AGENTBOX_CACHE/logs/apt.log" 2>&1 \
    || die "apt-get install failed: see $AGENTBOX_CACHE/logs/apt.log"
else
  step "Debian packages present"
fi

# go_tool NAME STAMP PKG...: go install PKG... (static, with $LDFLAGS)
# unless the stamp matches.
go_tool() {
  local name=$1 ver=$2 stamp="$2 ${LDFLAGS:-}"; shift 2
  local sf="$TOOLS_BIN/.$name.stamp"
  if [ -f "$sf" ] && [ "$(cat "$sf")" = "$stamp" ]; then
    step "$name $ver cached"
    return
  fi
  step "building $name $ver (a few minutes; log: $AGENTBOX_CACHE/logs/$name.log)"
  ( export GOBIN=$TOOLS_BIN CGO_ENABLED=0; go install -ldflags "${LDFLAGS:-}" "$@" ) >"$AGENTBOX_CACHE/logs/$name.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    kill -0 "$pid" 2>/dev/null && step "  still building $name ($(tail -n1 "$AGENTBOX_CACHE/logs/$name.log" | cut -c1-80))"
  done
  wait "$pid" || { tail -n 20 "$AGENTBOX_CACHE/logs/$name.log" >&2; die "building $name failed"; }
  echo "$stamp" >"$sf"
}

# build_in_module NAME MODULE VERSION PKG OUT [LDFLAGS [PATCH...]]: builds
# PKG, static, inside a copy of MODULE@VERSION with the patches applied,
# unless the stamp (version and patches) matches. For what `go install
# pkg@version` cannot do: patching (runsc), or a go.mod with exclude
# directives (containerd 1.7). With GENERATE=FILE.go set, `go run FILE.go`
# runs in the tree after the patches, before the build (part of the stamp).
build_in_module() {
  local name=$1 module=$2 version=$3 pkg=$4 out=$5 ldflags=${6:-}
  shift 5; [ $# -eq 0 ] || shift
  local patches=("$@") stamp=$version sf="$TOOLS_BIN/.$name.stamp" generate=${GENERATE:-}
  [ ${#patches[@]} -eq 0 ] || stamp="$version patches=$(cat "${patches[@]}" | sha256sum | cut -c1-16)"
  [ -z "$generate" ] || stamp="$stamp generate=$(sha256sum <"$generate" | cut -c1-16)"
  if [ -f "$sf" ] && [ "$(cat "$sf")" = "$stamp" ] && [ -x "$out" ]; then
    step "$name $version cached"
    return
  fi
  local log=$AGENTBOX_CACHE/logs/$name.log src=$AGENTBOX_CACHE/src/$name
  step "building $name $version (a few minutes; log: $log)"
  (
    set -e
    mod=$(GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$mod" ] || { echo "$module not downloaded"; exit 1; }
    rm -rf "$src"; mkdir -p "$(dirname "$src")"; cp -r "$mod" "$src"; chmod -R u+w "$src"
    for p in "${patches[@]}"; do (cd "$src" && git apply -p1 "$p"); done
    if [ -n "$generate" ]; then cp "$generate" "$src/" && (cd "$src" && go run "$(basename "$generate")"); fi
    cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out" "$pkg"
  ) >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    kill -0 "$pid" 2>/dev/null && step "  still building $name ($(tail -n1 "$log" | cut -c1-80))"
  done
  wait "$pid" || { tail -n 20 "$log" >&2; die "building $name failed"; }
  rm -rf "$src"
  echo "$stamp" >"$sf"
}

# runsc MUST be static: a cgo build dies at boot inside its own chroot. It
# is built from the gVisor module go.mod pins, with hack/patches/ applied
# (each says why), and its seccomp filters precompiled as gVisor's own
# build does (hack/runsc-precompile.go).
if has core; then
  GENERATE="$REPO_ROOT/hack/runsc-precompile.go" build_in_module runsc gvisor.dev/gvisor "$GVISOR_VERSION" ./runsc "$TOOLS_BIN/runsc" \
    "-X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" "$REPO_ROOT"/hack/patches/runsc-*.patch
  go_tool containerd "$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  go_tool crictl "$CRICTL_VERSION" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"

  file "$TOOLS_BIN/runsc" 2>/dev/null | grep -q "statically linked" || ldd "$TOOLS_BIN/runsc" 2>&1 | grep -q "not a dynamic" \
    || die "$TOOLS_BIN/runsc is not static; remove it and run again"
  grep -a -q 'Platform="systrap" HostNetwork=false' "$TOOLS_BIN/runsc" \
    || die "$TOOLS_BIN/runsc has no precompiled seccomp programs (hack/runsc-precompile.go); remove it and run again"

  "$REPO_ROOT/hack/build.sh"
  "$REPO_ROOT/hack/images.sh"
  # The agent images: the Kubernetes tests run the examples/agents/ pods.
  if has tests; then
    "$REPO_ROOT/hack/images.sh" realagent
    "$REPO_ROOT/hack/images.sh" agentcli
  fi
fi

# containerd 1.7 and an older 2.x, for the compatibility tests (1.7's
# go.mod has exclude directives, so `go install pkg@version` refuses it;
# 2.x's binary name would collide with the pinned one's).
if has extras; then
  build_in_module containerd17 github.com/containerd/containerd "$CONTAINERD17_VERSION" ./cmd/containerd "$TOOLS_BIN/containerd-$CONTAINERD17_VERSION"
  build_in_module containerd22 github.com/containerd/containerd/v2 "$CONTAINERD22_VERSION" ./cmd/containerd "$TOOLS_BIN/containerd-$CONTAINERD22_VERSION"
  # The OpenTelemetry Collector the OTLP sink's test ships to: its own
  # module (internal/e2e/otelcol), so its dependencies stay out of ours.
  otelcol_stamp="$(cat "$REPO_ROOT"/internal/e2e/otelcol/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)"
  if [ -x "$TOOLS_BIN/abx-otelcol" ] && [ "$(cat "$TOOLS_BIN/.abx-otelcol.stamp" 2>/dev/null)" = "$otelcol_stamp" ]; then
    step "abx-otelcol cached"
  else
    step "building abx-otelcol (collector v0.165.0; log: $AGENTBOX_CACHE/logs/otelcol.log)"
    (cd "$REPO_ROOT/internal/e2e/otelcol" && CGO_ENABLED=0 go build -o "$TOOLS_BIN/abx-otelcol" .) >"$AGENTBOX_CACHE/logs/otelcol.log" 2>&1 \
      || { tail -n 20 "$AGENTBOX_CACHE/logs/otelcol.log" >&2; die "building abx-otelcol failed"; }
    echo "$otelcol_stamp" >"$TOOLS_BIN/.abx-otelcol.stamp"
  fi
fi

step "setup done ($setup_mode)"
