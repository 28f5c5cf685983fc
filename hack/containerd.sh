#!/usr/bin/env bash
# Starts or stops a private containerd: its own root, state and socket under
# $AGENTBOX_DEV (default /tmp/agentbox-dev), CRI on, runtime handler
# `agentbox` mapped to the agentbox shim with agentbox.dev/* annotations
# forwarded, a dual-stack CNI bridge network whose pods have no route off
# the bridge (only ones to the metadata addresses through it, which the e2e
# tests answer themselves on the bridge, so a broken egress rule reaches no
# real service).
#
#   hack/containerd.sh start   # idempotent; prints the socket path
#   hack/containerd.sh stop    # stops it and removes every trace
#   hack/containerd.sh env     # shell exports for ctr/crictl
#
# AGENTBOX_METRICS_ADDRESS=127.0.0.1:PORT serves containerd's metrics there
# (the benchmarks read its CRI timers).
# AGENTBOX_DEV_IMAGES=base imports only the small images (agent, pause,
# probe), not the real-agent and agent-CLI ones (hack/e2e.sh's kube parts).
# AGENTBOX_REGISTRY_MIRROR=http://HOST:PORT sends registry.k8s.io, gcr.io
# and k8s.gcr.io pulls there and nowhere else (hack/critest.sh's loopback
# registry).
source "$(dirname "$0")/lib.sh"

DIR=$AGENTBOX_DEV
SOCK=$DIR/containerd.sock
PIDFILE=$DIR/containerd.pid
# One bridge per instance; distinct names let two instances coexist.
BRIDGE=${AGENTBOX_BRIDGE:-abx$(printf '%s' "$DIR" | sha256sum | cut -c1-8)}

# pick_subnet chooses a 10.203.X.0/24 that no interface routes yet (two
# instances must never share one), starting from a hash of the directory.
pick_subnet() {
  local o=$(( 0x$(printf '%s' "$DIR" | sha256sum | cut -c1-2) % 200 + 20 )) i
  for i in $(seq 0 199); do
    local cand=$(( (o - 20 + i) % 200 + 20 ))
    if [ -z "$(ip -4 route show "10.203.$cand.0/24" 2>/dev/null)" ]; then
      echo "$cand"; return
    fi
  done
  die "no free 10.203.X.0/24 for the CNI bridge"
}

write_configs() {
  mkdir -p "$DIR"/{root,state,kubelet/pods,cni/net.d,cni/ipam,agentbox/policies,runsc-stock,logs}
  # Create the bridge with its gateway address now, so the subnet is taken
  # before any other instance looks (the CNI bridge plugin reuses it).
  ip link del "$BRIDGE" >/dev/null 2>&1 || true
  local octet; octet=$(pick_subnet)
  SUBNET=10.203.$octet.0/24
  # Dual stack: an IPv6 ULA subnet derived from the same octet (no DAD:
  # addresses are usable at once, in the pods too).
  SUBNET6=fd00:ab:$octet::/64
  ip link add "$BRIDGE" type bridge
  ip addr add "10.203.$octet.1/24" dev "$BRIDGE"
  ip -6 addr add "fd00:ab:$octet::1/64" dev "$BRIDGE" nodad
  ip link set "$BRIDGE" up
  # The shipped roles and bindings; edit them here, they are reread on the
  # next container start.
  cp "$REPO_ROOT"/policies/*.yaml "$DIR/agentbox/policies/"
  cat >"$DIR/agentbox/config.toml" <<EOT
# agentbox shim config for the private containerd (hack/containerd.sh).
version = 1

[runsc]
binary = "$TOOLS_BIN/runsc"

[shim]
log_level = "info"

[policy]
dir = "$DIR/agentbox/policies"
default_role = "baseline"
handler = "agentbox"

[audit]
dir = "$DIR/audit"

# Where this containerd (and a kubelet, if one runs against it) make a
# pod's files: pod mounts are accepted only from there.
[cri]
containerd_root = "$DIR/root"
kubelet_root = "$DIR/kubelet"

# Sandboxes' memory images and the key that signs them, this instance's own.
[checkpoint]
dir = "$DIR/checkpoints"
key_file = "$DIR/agentbox/node.key"
# The "cluster's" shared store: a suspend's image is also written there,
# encrypted, and a restore takes it from there when this store lacks it.
shared_dir = "$DIR/shared-checkpoints"
shared_key_file = "$DIR/agentbox/cluster.key"
EOT
  [ -f "$DIR/agentbox/cluster.key" ] || (umask 077 && head -c 32 /dev/urandom >"$DIR/agentbox/cluster.key")
  # The benchmark's stock-gVisor reference reads gVisor's own option format.
  cat >"$DIR/runsc-stock/config.toml" <<EOT
binary_name = "$TOOLS_BIN/runsc"
root = "$DIR/runsc-stock/root"
EOT
  # Pods get routes to the metadata addresses (the bridge holds them during
  # the tests) and to 198.51.100.0/24 (TEST-NET-2: the e2e suite's web host,
  # in a namespace of its own on this machine), and no default route.
  cat >"$DIR/cni/net.d/10-agentbox.conflist" <<EOT
{
  "cniVersion": "1.0.0",
  "name": "agentbox",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$SUBNET"}], [{"subnet": "$SUBNET6"}]],
        "routes": [{"dst": "169.254.169.254/32"}, {"dst": "fd00:ec2::254/128"}, {"dst": "198.51.100.0/24"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOT
  local metrics=""
  if [ -n "${AGENTBOX_METRICS_ADDRESS:-}" ]; then
    # containerd's Prometheus metrics (its CRI timers), for hack/bench.sh.
    metrics=$(printf '\n[metrics]\n  address = "%s"' "$AGENTBOX_METRICS_ADDRESS")
  fi
  cat >"$DIR/config.toml" <<EOT
version = 3
root = "$DIR/root"
state = "$DIR/state"

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"
$metrics

# Each private instance its own NRI socket: the default
# /var/run/nri/nri.sock is one per machine, and a second instance would
# take it over.
[plugins."io.containerd.nri.v1.nri"]
  socket_path = "$DIR/nri.sock"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.agentbox]
  runtime_type = "io.containerd.agentbox.v1"
  pod_annotations = ["agentbox.dev/*"]
  container_annotations = ["agentbox.dev/*"]
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.agentbox.options]
    ConfigPath = "$DIR/agentbox/config.toml"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc-stock]
  runtime_type = "io.containerd.runsc.v1"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc-stock.options]
    ConfigPath = "$DIR/runsc-stock/config.toml"

# runc, the reference the tests and critest compare with. These hosts
# withhold CAP_SYS_RESOURCE even from root: runc could not lower
# oom_score_adj below containerd's.
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    Root = "$DIR/runc-root"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "$DIR/cni/net.d"
EOT
  if [ -n "${AGENTBOX_REGISTRY_MIRROR:-}" ]; then
    local h
    for h in registry.k8s.io gcr.io k8s.gcr.io; do
      mkdir -p "$DIR/certs.d/$h"
      # server is the mirror itself: containerd never falls back to the
      # real host.
      printf 'server = "%s"\n' "$AGENTBOX_REGISTRY_MIRROR" >"$DIR/certs.d/$h/hosts.toml"
    done
    cat >>"$DIR/config.toml" <<EOT

[plugins."io.containerd.cri.v1.images".registry]
  config_path = "$DIR/certs.d"
EOT
  fi
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

start() {
  need_root
  if running; then
    step "containerd already running (pid $(cat "$PIDFILE"), socket $SOCK)"
    echo "$SOCK"; return
  fi
  for b in containerd ctr crictl runsc containerd-shim-agentbox-v1; do
    command -v "$b" >/dev/null || die "$b not found: run hack/setup.sh first"
  done
  write_configs
  step "starting private containerd ($SOCK, log $DIR/logs/containerd.log)"
  # Shims inherit containerd's environment: containers started without a
  # ConfigPath (plain ctr) use this config too.
  AGENTBOX_CONFIG="$DIR/agentbox/config.toml" containerd --config "$DIR/config.toml" >"$DIR/logs/containerd.log" 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 100); do
    ctr --address "$SOCK" version >/dev/null 2>&1 && break
    running || { tail -n 30 "$DIR/logs/containerd.log" >&2; die "containerd exited during start"; }
    sleep 0.1
  done
  ctr --address "$SOCK" version >/dev/null 2>&1 || die "containerd did not answer on $SOCK"
  step "importing images"
  for ns in default k8s.io; do
    ctrq --address "$SOCK" -n "$ns" images import --index-name "$AGENT_IMAGE" "$AGENTBOX_CACHE/images/agent.tar" >/dev/null
    ctrq --address "$SOCK" -n "$ns" images import --index-name "$PAUSE_IMAGE" "$AGENTBOX_CACHE/images/pause.tar" >/dev/null
    ctrq --address "$SOCK" -n "$ns" images import --index-name "$PROBE_IMAGE" "$AGENTBOX_CACHE/images/probe.tar" >/dev/null
    # The real-agent and agent-CLI images (hack/images.sh realagent,
    # agentcli), when built: the test suite's; the quickstart does not
    # need them, nor do the Kubernetes tests (AGENTBOX_DEV_IMAGES=base:
    # hack/e2e.sh), whose nodes have containerds of their own.
    [ "${AGENTBOX_DEV_IMAGES:-all}" = all ] || continue
    if [ -f "$AGENTBOX_CACHE/images/realagent.tar" ]; then
      ctrq --address "$SOCK" -n "$ns" images import --index-name "$REALAGENT_IMAGE" "$AGENTBOX_CACHE/images/realagent.tar" >/dev/null
    fi
    if [ -f "$AGENTBOX_CACHE/images/agentcli.tar" ]; then
      ctrq --address "$SOCK" -n "$ns" images import --index-name "$AGENTCLI_IMAGE" "$AGENTBOX_CACHE/images/agentcli.tar" >/dev/null
    fi
  done
  echo "$SOCK"
}

stop() {
  if running; then
    local pid; pid=$(cat "$PIDFILE")
    step "stopping containerd (pid $pid)"
    remove_containers "$SOCK"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
  # Last resort for a run that was killed mid-test.
  kill_leftovers "$SOCK"
  # Leftover mounts under our dirs (from a killed run), deepest first.
  local rroot; rroot=$(runsc_root "$SOCK")
  unmount_under "$DIR" "$rroot"
  rm -rf "$rroot"
  ip link del "$BRIDGE" >/dev/null 2>&1 || true
  # The instance's directory too, when it is one this script made.
  if [ "$DIR" != / ] && [ -f "$DIR/config.toml" ] && grep -q "$SOCK" "$DIR/config.toml" 2>/dev/null; then
    rm -rf "$DIR"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env)
    echo "export CONTAINERD_ADDRESS=$SOCK"
    echo "export CONTAINER_RUNTIME_ENDPOINT=unix://$SOCK"
    echo "export IMAGE_SERVICE_ENDPOINT=unix://$SOCK"
    echo "export PATH=$OUT_BIN:$TOOLS_BIN:\$PATH" ;;
  *) die "usage: $0 start|stop|env" ;;
esac
