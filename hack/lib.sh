# Shared settings for the hack/ scripts. Source it; do not run it.
set -euo pipefail

# Every script answers -h/--help with its header comment (what it does,
# what it installs, its usage) and does nothing else.
case "${1:-}" in
  -h|--help)
    sed -n '2,/^[^#]/{/^#/{s/^# \{0,1\}//;p}}' "$0"
    exit 0 ;;
esac

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Toolchain cache, reused across runs (CI may keep it between runs).
AGENTBOX_CACHE=${AGENTBOX_CACHE:-/var/cache/agentbox}
TOOLS_BIN=$AGENTBOX_CACHE/bin
# The project's own binaries.
OUT_BIN=$REPO_ROOT/_output/bin
# Private containerd instance (own root, state, socket).
AGENTBOX_DEV=${AGENTBOX_DEV:-/tmp/agentbox-dev}

# runsc is built from the gVisor the shim links (go.mod): the shim checks
# trace points against that gVisor's registry.
# mod_version GO.MOD MODULE: the version GO.MOD requires of MODULE.
mod_version() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
GVISOR_VERSION=$(mod_version "$REPO_ROOT/go.mod" gvisor.dev/gvisor)
[ -n "$GVISOR_VERSION" ] || { echo "error: no gvisor.dev/gvisor version in go.mod" >&2; exit 1; }
CONTAINERD_VERSION=v2.4.2
# The containerd 1.7 and the older 2.x the compatibility tests also run.
CONTAINERD17_VERSION=v1.7.35
CONTAINERD22_VERSION=v2.2.9
CRICTL_VERSION=v1.37.0
# TEST_APT_PACKAGES: only the full setup (the tests) installs them. criu:
# containerd's CRI CheckpointContainer (the kubelet's checkpoint API)
# refuses unless a criu binary answers its version, although agentbox's
# shim, not CRIU, makes the checkpoint.
TEST_APT_PACKAGES=(chromium criu)
APT_PACKAGES=(containernetworking-plugins nftables iptables busybox-static umoci runc iproute2 jq gcc libc6-dev make mmdebstrap)

AGENT_IMAGE=docker.io/agentbox/agent:latest
PAUSE_IMAGE=docker.io/agentbox/pause:latest
PROBE_IMAGE=docker.io/agentbox/probe:latest
REALAGENT_IMAGE=docker.io/agentbox/realagent:bookworm
AGENTCLI_IMAGE=docker.io/agentbox/agentcli:bookworm

export PATH=$OUT_BIN:$TOOLS_BIN:/usr/local/go/bin:$PATH

_t0=$(date +%s)
# step prints a progress line with the seconds since the script started.
step() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - _t0 ))" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "$0 must run as root (containerd, runsc, nftables)"; }

# ctrq runs ctr without containerd's cgroup v1 deprecation warning (which
# ctr prints on every call on these hosts); other output is untouched.
ctrq() { ctr "$@" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2); }

# The Kubernetes and etcd hack/kube.sh runs (built by hack/kube/build.sh
# from the modules hack/kube/*/go.mod pin).
KUBE_VERSION=$(mod_version "$REPO_ROOT/hack/kube/kube-all/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(mod_version "$REPO_ROOT/hack/kube/etcd/go.mod" go.etcd.io/etcd/server/v3)
# module_dir MODULE@VERSION: the directory of a module from the Go module
# proxy (read-only, in the module cache). Run outside any module, so that
# no go.mod or go.sum is touched.
module_dir() { (cd / && go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }

# kubernetes-sigs/agent-sandbox: its controller and CRDs, from the Go
# module proxy (hack/kube/agent-sandbox.sh).
AGENT_SANDBOX_VERSION=v1.0.1
agent_sandbox_dir() { echo "$AGENTBOX_CACHE/kube/agent-sandbox-$AGENT_SANDBOX_VERSION"; }
kube_bin_dir() { echo "$AGENTBOX_CACHE/kube/$KUBE_VERSION-etcd$ETCD_VERSION/bin"; }

# runsc_root SOCK: the runsc state directory the shim derives from a
# containerd instance's socket (config.InstanceRunscRoot).
runsc_root() { echo "/run/agentbox/runsc/$(printf '%s' "$1" | sha256sum | cut -c1-12)"; }

# remove_containers SOCK: removes what a running containerd instance still
# has: its CRI pods, then every task and container in every namespace.
remove_containers() {
  local sock=$1 ns t c
  [ -S "$sock" ] || return 0
  crictl --runtime-endpoint "unix://$sock" rmp -fa >/dev/null 2>&1 || true
  for ns in $(ctr --address "$sock" namespaces ls -q 2>/dev/null); do
    for t in $(ctr --address "$sock" -n "$ns" tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n "$ns" tasks kill -s KILL "$t" >/dev/null 2>&1 || true
      ctr --address "$sock" -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 || true
    done
    for c in $(ctr --address "$sock" -n "$ns" containers ls -q 2>/dev/null); do
      ctr --address "$sock" -n "$ns" containers delete "$c" >/dev/null 2>&1 || true
    done
  done
}

# kill_leftovers SOCK: the last resort for an instance whose containerd is
# gone (a killed run): its shims, and runsc processes under its runsc root.
kill_leftovers() {
  pkill -9 -f -- "--root=$(runsc_root "$1")/" 2>/dev/null || true
  pkill -9 -f -- "-address $1" 2>/dev/null || true
}

# unmount_under DIR...: lazily unmounts every mount at or below the DIRs,
# deepest first.
unmount_under() {
  local re m
  re=$(printf '%s|' "$@"); re=${re%|}
  { grep -oE " ($re)(/[^ ]*)?" /proc/mounts || true; } | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
}

# Lanes: long steps that run beside others (hack/test.sh). lane_start NAME
# NICE CMD... runs CMD in the background at that niceness, its output in
# _output/lanes/NAME.log; lane_wait NAME waits for it (a progress line
# every 30 s), prints its log and returns its exit status.
declare -A LANE_PID=()
lane_log() { echo "$REPO_ROOT/_output/lanes/$1.log"; }
lane_start() {
  local name=$1 niceness=$2; shift 2
  local log; log=$(lane_log "$name")
  mkdir -p "$(dirname "$log")" && : >"$log"
  nice -n "$niceness" "$@" >"$log" 2>&1 </dev/null &
  LANE_PID[$name]=$!
  step "$name: started beside the rest (log: _output/lanes/$name.log)"
}
lane_wait() {
  local name=$1 log; log=$(lane_log "$1")
  local pid=${LANE_PID[$name]:?no lane $1} rc=0 n=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ $((n % 30)) = 0 ]; then step "waiting for $name ($(tail -n1 "$log" | cut -c1-90))"; fi
    n=$((n + 1)); sleep 1
  done
  wait "$pid" || rc=$?
  step "$name: its log (_output/lanes/$name.log)"
  sed "s/^/  [$name] /" "$log" >&2
  [ "$rc" = 0 ] || step "$name failed (exit $rc)"
  return "$rc"
}
