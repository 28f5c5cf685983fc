# Shared settings for the hack/ scripts. Source it; do not run it.
set -euo pipefail

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
GVISOR_VERSION=$(cd "$REPO_ROOT" && sed -n 's/^[[:space:]]*gvisor.dev\/gvisor \(v[^ ]*\).*/\1/p' go.mod)
[ -n "$GVISOR_VERSION" ] || { echo "error: no gvisor.dev/gvisor version in go.mod" >&2; exit 1; }
CONTAINERD_VERSION=v2.4.2
# The containerd 1.7 and the older 2.x the compatibility tests also run.
CONTAINERD17_VERSION=v1.7.35
CONTAINERD22_VERSION=v2.2.9
CRICTL_VERSION=v1.37.0
APT_PACKAGES=(containernetworking-plugins nftables iptables busybox-static umoci runc iproute2 jq gcc libc6-dev make)

AGENT_IMAGE=docker.io/agentbox/agent:latest
PAUSE_IMAGE=docker.io/agentbox/pause:latest
PROBE_IMAGE=docker.io/agentbox/probe:latest

export PATH=$OUT_BIN:$TOOLS_BIN:/usr/local/go/bin:$PATH

_t0=$(date +%s)
# step prints a progress line with the seconds since the script started.
step() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - _t0 ))" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "$0 must run as root (containerd, runsc, nftables)"; }

# ctrq runs ctr without containerd's cgroup v1 deprecation warning (which
# ctr prints on every call on these hosts); other output is untouched.
ctrq() { ctr "$@" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2); }

# mod_version GO.MOD MODULE: the version GO.MOD requires of MODULE.
mod_version() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }

# The Kubernetes and etcd hack/kube.sh runs (built by hack/kube/build.sh
# from the modules hack/kube/*/go.mod pin).
KUBE_VERSION=$(mod_version "$REPO_ROOT/hack/kube/kube-all/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(mod_version "$REPO_ROOT/hack/kube/etcd/go.mod" go.etcd.io/etcd/server/v3)
kube_bin_dir() { echo "$AGENTBOX_CACHE/kube/$KUBE_VERSION-etcd$ETCD_VERSION/bin"; }
