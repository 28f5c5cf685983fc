#!/usr/bin/env bash
# Builds etcd and Kubernetes (kube-all: apiserver, controller-manager,
# scheduler, kubelet and kubectl in one binary) from the Go module proxy into
# the toolchain cache, keyed by version and by the build's inputs. The
# versions are the ones hack/kube/*/go.mod pin. Safe to run again: a
# finished build is reused. Cold, Kubernetes costs about 20 CPU-minutes and
# 3 GB of memory at link; its build cache is removed once it has linked.
#
#   hack/kube/build.sh    # prints the bin directory on stdout
source "$(dirname "$0")/../lib.sh"

KDIR=$REPO_ROOT/hack/kube
bin_dir=$(kube_bin_dir)
stamp=$(cat "$KDIR"/kube-all/{go.mod,go.sum,main.go} "$KDIR"/etcd/{go.mod,go.sum,tools.go} | sha256sum | cut -c1-16)
if [ -f "$bin_dir/.stamp" ] && [ "$(cat "$bin_dir/.stamp")" = "$stamp" ]; then
  step "Kubernetes $KUBE_VERSION and etcd $ETCD_VERSION cached ($bin_dir)"
  echo "$bin_dir"; exit 0
fi
mkdir -p "$bin_dir" "$AGENTBOX_CACHE/logs"
gocache=$AGENTBOX_CACHE/kube/gocache
export GOCACHE=$gocache CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# watch PID LOG WHAT: progress lines while a build runs.
watch() {
  local pid=$1 log=$2 what=$3
  while kill -0 "$pid" 2>/dev/null; do
    sleep 20
    kill -0 "$pid" 2>/dev/null && step "  still building $what ($(du -sh "$gocache" 2>/dev/null | cut -f1) of build cache)"
  done
  wait "$pid" || { tail -n 20 "$log" >&2; die "building $what failed: see $log"; }
}

log=$AGENTBOX_CACHE/logs/etcd.log
step "building etcd $ETCD_VERSION (about a CPU-minute; log: $log)"
(cd "$KDIR/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin_dir/etcd" go.etcd.io/etcd/server/v3) >"$log" 2>&1 &
watch $! "$log" etcd

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
done
ld="$ld -X k8s.io/component-base/version.gitTreeState=clean"
log=$AGENTBOX_CACHE/logs/kube-all.log
step "building Kubernetes $KUBE_VERSION (about 20 CPU-minutes cold, 3 GB at link; log: $log)"
(cd "$KDIR/kube-all" && go build -trimpath -ldflags "$ld" -o "$bin_dir/kube-all" .) >"$log" 2>&1 &
watch $! "$log" "Kubernetes $KUBE_VERSION"
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
  ln -sf kube-all "$bin_dir/$c"
done
"$bin_dir/kubectl" version --client >/dev/null || die "the built kubectl does not run"
echo "$stamp" >"$bin_dir/.stamp"
rm -rf "$gocache"
step "Kubernetes $KUBE_VERSION and etcd $ETCD_VERSION built ($bin_dir)"
echo "$bin_dir"
