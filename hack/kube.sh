#!/usr/bin/env bash
# A private single-node Kubernetes on the project's containerd: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet,
# with runtime handlers runc, agentbox and agentbox-coder. agentbox gets onto
# the node the way it does on a real cluster: the installer DaemonSet
# (examples/kubernetes/installer.yaml, its image built here) runs
# `agentbox install`, then containerd is restarted.
#
#   hack/kube.sh up       # builds what is missing (cached), starts, installs
#   hack/kube.sh up --nodes 2   # two nodes, each its own containerd, shim,
#                         # kubelet and node agent, a shared checkpoint
#                         # store, and pod routes between their bridges
#   hack/kube.sh down     # stops everything and removes every trace
#   hack/kube.sh status
#   hack/kube.sh env      # shell exports: KUBECONFIG, PATH with kubectl,
#                         # CONTAINER_RUNTIME_ENDPOINT for crictl
#   hack/kube.sh node CMD...   # runs CMD in the node's mount namespace
#   hack/kube.sh node2 CMD...  # the same on node 2
#   hack/kube.sh apiserver stop|start   # the API server alone (what a node does without it)
#   hack/kube.sh agent-sandbox   # kubernetes-sigs/agent-sandbox: its CRDs and
#                                # controller (core and extensions), built
#                                # from the Go module proxy (cached)
#   hack/kube.sh release-apply MANIFEST [INSTALLER.oci.tar IMAGE]
#                         # a release's manifest (and image), as this cluster
#                         # needs it (the release e2e)
#   hack/kube.sh restart-containerd   # node 1's
#
# The node lives in a mount namespace of its own (held by a bind mount):
# there /var/lib, /var/log, /usr/local/bin and /etc are private (/etc a
# copy), so the kubelet and containerd use their default paths, the
# installer writes to the node's real /etc/containerd and /usr/local/bin,
# and nothing on the host changes. The kubelet insists on some host sysctls
# (vm.overcommit_memory=1, kernel.panic=10, ...): read-only files with those
# values shadow /proc/sys there. Everything is under $AGENTBOX_KUBE
# (default /tmp/agentbox-kube). AGENTBOX_KUBE_AGENT_IMAGES names the
# agent images node 1 imports, when built (default "realagent agentcli";
# 1.2 GB together, most of a minute): the e2e suite's two-node and release
# clusters run no agent and import neither.
#
# The cluster's broker (agentbox broker: the keys, shared checkpoints' data
# keys and the writes on Sandboxes each node's agent may have) runs on the
# host, as the control plane does, with its own service account's token.
#
# `up` installs what it needs first (the Kubernetes and etcd builds,
# hack/kube/build.sh, cached); the agentbox binaries and runsc come from
# hack/setup.sh, which it names when they are missing.
source "$(dirname "$0")/lib.sh"

DIR=${AGENTBOX_KUBE:-/tmp/agentbox-kube}
KBIN=$(kube_bin_dir)
PIDS=$DIR/pids
LOGS=$DIR/logs
PKI=$DIR/pki
SVC_CIDR=10.98.0.0/24
APISERVER=https://127.0.0.1:16443
ETCD_CLIENT=http://127.0.0.1:23790
ETCD_PEER=http://127.0.0.1:23800
BROKER_URL=https://127.0.0.1:18443
INSTALLER_IMAGE=docker.io/agentbox/installer:latest
CG_CONTROLLERS=(cpu cpuacct cpuset memory devices freezer blkio pids net_cls perf_event hugetlb systemd unified)
# The shared checkpoint store both nodes mount (two-node mode), and where
# each node sees it.
SHARED=$DIR/shared
NODE_SHARED=/var/lib/agentbox-shared
export KUBECONFIG=$PKI/admin.kubeconfig
export PATH=$KBIN:$PATH

# use_node N sets node N's globals: its name, bridge and pod subnet, its
# directory (node 1's is $DIR itself), mount namespace, containerd socket,
# cgroup root, the suffix of its processes' pid files, and whether /run is
# its own (node 1 shares the host's).
use_node() {
  case $1 in
    1) NODE=agentbox-node NODE_IP=10.97.0.1 POD_SUBNET=10.97.0.0/24 BRIDGE=abxkube0 NDIR=$DIR SFX="" \
         CGROUP_ROOT=agentbox-kube HEALTHZ=20248 PRIVATE_RUN=0 ;;
    2) NODE=agentbox-node-2 NODE_IP=10.97.1.1 POD_SUBNET=10.97.1.0/24 BRIDGE=abxkube1 NDIR=$DIR/node2 SFX=-2 \
         CGROUP_ROOT=agentbox-kube2 HEALTHZ=20249 PRIVATE_RUN=1 ;;
    *) die "no node $1" ;;
  esac
  MNTNS=$NDIR/mntns SOCK=$NDIR/containerd.sock
}
use_node 1

# nodes is how many nodes `up` brought up (0: none).
nodes() { cat "$DIR/nodes" 2>/dev/null || echo 0; }

alive() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

# bg NAME CMD...: CMD in the background, logging to $LOGS/NAME.log. CMD
# must be a program (its pid is the one recorded), not a shell function.
bg() {
  local n=$1; shift
  alive "$n" && return
  "$@" >"$LOGS/$n.log" 2>&1 &
  echo $! >"$PIDS/$n.pid"
}

# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${secs}s waiting for $what (logs: $LOGS)"
    sleep 1
  done
}

node() { nsenter --mount="$MNTNS" -- "$@"; }

node_ns_up() { [ -f "$MNTNS" ] && findmnt -n "$MNTNS" >/dev/null 2>&1; }

# node_ns makes the current node's mount namespace (see the top of this
# file).
node_ns() {
  node_ns_up && return
  mkdir -p "$NDIR"/{varlib,varlog,usrlocalbin,sysctl,run}
  rm -rf "$NDIR/etc"; cp -a /etc "$NDIR/etc"
  # Pods' DNS: nothing listens on the node's bridge address, so a pod's
  # lookup never leaves the machine (there is no cluster DNS).
  rm -f "$NDIR/etc/resolv.conf"; echo "nameserver $NODE_IP" >"$NDIR/etc/resolv.conf"
  rm -rf "$NDIR/etc/containerd" "$NDIR/etc/agentbox"
  touch "$MNTNS"
  unshare --mount="$MNTNS" --propagation private true
  local shared=""
  [ "$(nodes)" != 2 ] || shared="mkdir -p '$NODE_SHARED'; mount --bind '$SHARED' '$NODE_SHARED'"
  local run=""
  [ "$PRIVATE_RUN" = 0 ] || run="mount --bind '$NDIR/run' /run"
  node sh -ec "
    mount --bind '$NDIR/varlib' /var/lib
    mount --bind '$NDIR/varlog' /var/log
    mount --bind '$NDIR/usrlocalbin' /usr/local/bin
    mount --bind '$NDIR/etc' /etc
    $run
    $shared
    for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
      k=\${kv%%=*}; f='$NDIR/sysctl/'\$(echo \$k | tr / _)
      echo \${kv#*=} >\$f
      mount --bind \$f /proc/sys/\$k
      mount -o remount,bind,ro /proc/sys/\$k
    done"
}

certs() {
  mkdir -p "$PKI"
  (
    cd "$PKI"
    [ -f ca.crt ] || openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=agentbox-kube-ca" 2>/dev/null
    [ -f sa.key ] || { openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }
    # cert NAME SUBJECT [SAN] [EKU]
    cert() {
      local n=$1 subj=$2 san=${3:-} eku=${4:-clientAuth}
      [ -f "$n.crt" ] && return
      openssl req -newkey rsa:2048 -nodes -keyout "$n.key" -out "$n.csr" -subj "$subj" 2>/dev/null
      { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"; echo "extendedKeyUsage=$eku"
        [ -z "$san" ] || echo "subjectAltName=$san"; } >"$n.ext"
      openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$n.crt" -days 30 -extfile "$n.ext" 2>/dev/null
      rm -f "$n.csr" "$n.ext"
    }
    cert apiserver "/CN=kube-apiserver" "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.97.0.1,IP:10.98.0.1" serverAuth
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    cert admin "/O=system:masters/CN=kubernetes-admin"
    cert kubelet "/O=system:nodes/CN=system:node:agentbox-node"
    cert kubelet-serving "/CN=agentbox-node" "DNS:agentbox-node,IP:10.97.0.1,IP:127.0.0.1" serverAuth
    cert kubelet-2 "/O=system:nodes/CN=system:node:agentbox-node-2"
    cert kubelet-serving-2 "/CN=agentbox-node-2" "DNS:agentbox-node-2,IP:10.97.1.1" serverAuth
    # The broker's serving certificate, of the cluster's CA: node agents
    # trust it through their service account's ca.crt.
    cert broker "/CN=agentbox-broker" "DNS:agentbox-broker.kube-system.svc,IP:127.0.0.1" serverAuth
    # The shared checkpoint store's key-encryption key: the broker's alone.
    [ -f broker-kek.pem ] || openssl genrsa -out broker-kek.pem 3072 2>/dev/null
    cert scheduler "/CN=system:kube-scheduler"
    cert controller-manager "/CN=system:kube-controller-manager"
    for n in admin kubelet kubelet-2 scheduler controller-manager; do
      kubeconfig "$n" "{client-certificate: \"$PKI/$n.crt\", client-key: \"$PKI/$n.key\"}"
    done
  )
}

# kubeconfig NAME USER: $PKI/NAME.kubeconfig, for the cluster, with USER
# (YAML: a client certificate, or a token) as its credentials.
kubeconfig() {
  (umask 077 && cat >"$PKI/$1.kubeconfig" <<EOT
apiVersion: v1
kind: Config
clusters:
- name: agentbox-kube
  cluster: {server: "$APISERVER", certificate-authority: "$PKI/ca.crt"}
users:
- name: $1
  user: $2
contexts:
- name: agentbox-kube
  context: {cluster: agentbox-kube, user: $1}
current-context: agentbox-kube
EOT
  )
}

# The current node's containerd config: runc only. agentbox's handlers come
# from the installer's drop-ins (imports). It sees /etc, /var/lib and
# /usr/local/bin as the node's.
write_containerd_config() {
  mkdir -p "$NDIR/etc/containerd/conf.d" "$NDIR/cni/net.d" "$NDIR/cni/ipam" "$NDIR/state"
  cat >"$NDIR/etc/containerd/config.toml" <<EOT
version = 3
root = "/var/lib/containerd"
state = "$NDIR/state"
imports = ["/etc/containerd/conf.d/*.toml"]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.nri.v1.nri"]
  socket_path = "$NDIR/nri.sock"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # Hosts like this one withhold CAP_SYS_RESOURCE even from root: runc
  # could not lower oom_score_adj below containerd's.
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = false
    Root = "$NDIR/runc-root"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "$NDIR/cni/net.d"
EOT
  # No default route: pods reach their bridge's subnet (and, with two
  # nodes, the other node's pods) only, so no test packet leaves the
  # machine.
  local routes='{"dst": "169.254.169.254/32"}'
  [ "$(nodes)" != 2 ] || routes="$routes, {\"dst\": \"10.97.0.0/16\"}"
  cat >"$NDIR/cni/net.d/10-agentbox-kube.conflist" <<EOT
{
  "cniVersion": "1.0.0",
  "name": "agentbox-kube",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NDIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_SUBNET", "rangeStart": "${NODE_IP%.1}.10"}]],
        "routes": [$routes]
      }
    },
    {"type": "loopback"}
  ]
}
EOT
}

start_containerd() {
  # nsenter execs containerd: the recorded pid is containerd's.
  bg "containerd$SFX" nsenter --mount="$MNTNS" -- env PATH="/usr/local/bin:$TOOLS_BIN:/usr/sbin:/usr/bin:/sbin:/bin" \
    "$TOOLS_BIN/containerd" --config /etc/containerd/config.toml
  wait_for "containerd$SFX" 60 ctr --address "$SOCK" version
}

start_apiserver() {
  bg kube-apiserver kube-apiserver --etcd-servers="$ETCD_CLIENT" \
    --bind-address=127.0.0.1 --secure-port=16443 --advertise-address="$NODE_IP" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SVC_CIDR" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --profiling=false --v=1
  wait_for kube-apiserver 180 kubectl get --raw /readyz
}

stop_one() {
  local n=$1
  [ -f "$PIDS/$n.pid" ] || return 0
  local pid; pid=$(cat "$PIDS/$n.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDS/$n.pid"
}

# node_up N: node N's bridge, cgroup root, mount namespace and containerd,
# with the images imported.
node_up() {
  use_node "$1"
  step "node $NODE: bridge $BRIDGE ($NODE_IP/24), cgroup /$CGROUP_ROOT, mount namespace"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    [ -z "$(ip -4 route show "$POD_SUBNET")" ] || die "$POD_SUBNET is routed already: another cluster is up"
    ip link add "$BRIDGE" type bridge
    ip addr add "$NODE_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  for c in "${CG_CONTROLLERS[@]}"; do
    [ -d "/sys/fs/cgroup/$c" ] && mkdir -p "/sys/fs/cgroup/$c/$CGROUP_ROOT"
  done
  if [ -d "/sys/fs/cgroup/cpuset/$CGROUP_ROOT" ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$CGROUP_ROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$CGROUP_ROOT/cpuset.mems"
  fi
  node_ns
  write_containerd_config
  step "node $NODE: containerd $CONTAINERD_VERSION ($SOCK)"
  start_containerd
  for img in agent pause probe; do
    ctrq --address "$SOCK" -n k8s.io images import --index-name "docker.io/agentbox/$img:latest" "$AGENTBOX_CACHE/images/$img.tar" >/dev/null
  done
  # The real-agent and agent-CLI images (hack/images.sh), when built: node
  # 1's alone (the agents' tests run there).
  local img ref
  if [ "$1" = 1 ]; then
    for img in ${AGENTBOX_KUBE_AGENT_IMAGES-realagent agentcli}; do
      case "$img" in
        realagent) ref=$REALAGENT_IMAGE ;;
        agentcli) ref=$AGENTCLI_IMAGE ;;
        *) die "AGENTBOX_KUBE_AGENT_IMAGES: unknown image $img (realagent, agentcli)" ;;
      esac
      if [ -f "$AGENTBOX_CACHE/images/$img.tar" ]; then
        ctrq --address "$SOCK" -n k8s.io images import --index-name "$ref" "$AGENTBOX_CACHE/images/$img.tar" >/dev/null
      fi
    done
  fi
  ctrq --address "$SOCK" -n k8s.io images import --index-name "$INSTALLER_IMAGE" "$REPO_ROOT/_output/images/installer.tar" >/dev/null
}

# adapt_installer NODES: the installer DaemonSet (stdin, a manifest that
# holds it) as this cluster needs it, on stdout. There is no kube-proxy or
# cluster DNS: the sync container (host network) reaches the API server
# and the broker (on the host) where they listen. Two nodes mount the
# shared checkpoint store.
adapt_installer() {
  local shared_args=""
  [ "$1" = 1 ] || shared_args="\\n\\1- --checkpoint-shared-dir=/host$NODE_SHARED"
  sed -e 's|^\( *\)- name: NODE_NAME$|\1- {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}\n\1- {name: KUBERNETES_SERVICE_PORT, value: "16443"}\n&|' \
    -e "s|^\( *\)- --broker-url=.*$|\1- --broker-url=$BROKER_URL$shared_args|"
}

# restart_containerd: node 1's containerd, stopped and started (it reads
# the installer's drop-ins at start).
restart_containerd() {
  use_node 1
  stop_one "containerd$SFX"
  start_containerd
}

# kubelet_up N: node N's kubelet, until the node is Ready without taints.
kubelet_up() {
  use_node "$1"
  step "kubelet (node $NODE)"
  cat >"$NDIR/kubelet-config.yaml" <<EOT
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "$NODE_IP"
port: 20250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ
tlsCertFile: "$PKI/kubelet-serving$SFX.crt"
tlsPrivateKeyFile: "$PKI/kubelet-serving$SFX.key"
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: "unix://$SOCK"
imageServiceEndpoint: "unix://$SOCK"
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
cgroupsPerQOS: true
# These hosts have cgroup v1 (hybrid); kubelet 1.35+ refuses it otherwise.
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: true
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
runtimeRequestTimeout: 5m
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%", imagefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
EOT
  bg "kubelet$SFX" nsenter --mount="$MNTNS" -- "$KBIN/kubelet" --config="$NDIR/kubelet-config.yaml" --kubeconfig="$PKI/kubelet$SFX.kubeconfig" \
    --hostname-override="$NODE" --node-ip="$NODE_IP" --root-dir=/var/lib/kubelet --v=2
  wait_for "node $NODE Ready" 300 kubectl wait --for=condition=Ready "node/$NODE" --timeout=5s
  wait_for "the node's taints to clear" 120 sh -c "[ -z \"\$(kubectl get node $NODE -o jsonpath='{.spec.taints}')\" ]"
  kubectl label node "$NODE" agentbox.dev/runtime=true --overwrite >/dev/null
}

# broker_up: the cluster's broker, on the host with its service account's
# token, as a Deployment runs it off the agent nodes (broker.yaml).
broker_up() {
  alive broker && return
  step "agentbox broker ($BROKER_URL; logs: $LOGS/broker.log)"
  kubectl apply -f "$REPO_ROOT/examples/kubernetes/broker-rbac.yaml" >/dev/null
  local token
  token=$(kubectl -n kube-system create token agentbox-broker --duration=48h)
  kubeconfig broker "{token: \"$token\"}"
  bg broker "$OUT_BIN/agentbox" broker --kubeconfig "$PKI/broker.kubeconfig" --listen 127.0.0.1:18443 \
    --tls-cert "$PKI/broker.crt" --tls-key "$PKI/broker.key" --kek "$PKI/broker-kek.pem"
  wait_for "the broker" 30 curl -sk -o /dev/null "$BROKER_URL/v1/keys"
}

# forward_up: pods of one node reach the other's (two-node mode): the two
# bridges forward, and an nftables table drops whatever they would forward
# anywhere else, so nothing leaves the machine.
forward_up() {
  nft -f - <<EOT
table inet abxkube_fwd {
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname { "abxkube0", "abxkube1" } oifname != { "abxkube0", "abxkube1" } drop
    oifname { "abxkube0", "abxkube1" } iifname != { "abxkube0", "abxkube1" } drop
  }
}
EOT
  sysctl -qw net.ipv4.conf.abxkube0.forwarding=1 net.ipv4.conf.abxkube1.forwarding=1
}

# shared_store_up N: node N's shim writes suspends to the shared store and
# wraps their data keys with the broker's public key (the node agent keeps
# it there).
shared_store_up() {
  use_node "$1"
  node sh -ec "for f in /etc/agentbox/config*.toml; do
    sed -i 's|^shared_dir = \"\"|shared_dir = \"$NODE_SHARED\"|; s|^shared_public_key = \"\"|shared_public_key = \"/var/lib/agentbox/broker-public.pem\"|' \$f
    grep -q '^shared_dir = \"$NODE_SHARED\"' \$f
  done"
}

up() {
  need_root
  local want=1
  if [ "${1:-}" = --nodes ]; then
    want=${2:-}
    case "$want" in 1|2) ;; *) die "--nodes: 1 or 2" ;; esac
  fi
  [ -x "$KBIN/kubelet" ] && [ -x "$KBIN/etcd" ] || "$REPO_ROOT/hack/kube/build.sh" >/dev/null
  for b in containerd ctr crictl runsc containerd-shim-runc-v2; do
    [ -x "$TOOLS_BIN/$b" ] || die "$TOOLS_BIN/$b missing: run hack/setup.sh"
  done
  [ -x "$OUT_BIN/agentbox" ] || die "$OUT_BIN/agentbox missing: run hack/build.sh"
  if alive kubelet && [ "$(nodes)" = "$want" ]; then step "already up ($want node(s))"; return; fi
  # What a killed run left behind goes first, and so does a cluster of
  # another size.
  if [ -e "$DIR" ]; then down; fi
  mkdir -p "$PIDS" "$LOGS"
  echo "$want" >"$DIR/nodes"
  step "certificates and kubeconfigs ($PKI)"
  certs
  step "installer image"
  "$REPO_ROOT/hack/images.sh" installer >/dev/null
  if [ "$want" = 2 ]; then mkdir -p -m 0700 "$SHARED"; fi
  local n
  for n in $(seq 1 "$want"); do node_up "$n"; done
  [ "$want" = 1 ] || forward_up

  step "etcd $ETCD_VERSION ($ETCD_CLIENT)"
  bg etcd etcd --name agentbox-kube --data-dir "$DIR/etcd" \
    --listen-client-urls "$ETCD_CLIENT" --advertise-client-urls "$ETCD_CLIENT" \
    --listen-peer-urls "$ETCD_PEER" --initial-advertise-peer-urls "$ETCD_PEER" \
    --initial-cluster "agentbox-kube=$ETCD_PEER" --unsafe-no-fsync --log-level warn
  wait_for etcd 60 curl -fsS "$ETCD_CLIENT/health"
  step "kube-apiserver $KUBE_VERSION ($APISERVER)"
  start_apiserver
  step "kube-controller-manager, kube-scheduler"
  bg kube-controller-manager kube-controller-manager \
    --kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$PKI/controller-manager.kubeconfig" --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=20257 --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true --profiling=false --v=1
  bg kube-scheduler kube-scheduler --kubeconfig="$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig="$PKI/scheduler.kubeconfig" --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=20259 --leader-elect=false --profiling=false --v=1
  for n in $(seq 1 "$want"); do kubelet_up "$n"; done
  # Pods need the default service account (the controller manager makes it).
  wait_for "the default service account" 120 kubectl -n default get serviceaccount default

  step "installing agentbox through the installer DaemonSet"
  # The policy API first: the installer's sync container watches it. The
  # node restriction holds each node's agent to its own node's objects.
  kubectl apply -f "$REPO_ROOT/examples/kubernetes/crds/" -f "$REPO_ROOT/examples/kubernetes/sync-rbac.yaml" \
    -f "$REPO_ROOT/examples/kubernetes/node-restriction.yaml" >/dev/null
  wait_for "the policy CRDs" 60 kubectl wait --for=condition=Established crd/agentroles.agentbox.dev crd/agentrolebindings.agentbox.dev crd/agentnodepolicies.agentbox.dev crd/agentquarantines.agentbox.dev --timeout=5s
  broker_up
  # No kube-proxy or cluster DNS here: the sync container (host network)
  # reaches the API server and the broker where they listen.
  adapt_installer "$want" <"$REPO_ROOT/examples/kubernetes/installer.yaml" \
    | kubectl apply -f - -f "$REPO_ROOT/examples/kubernetes/runtimeclass.yaml" >/dev/null
  # The node's runc handler, for the tests' twins.
  printf 'apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: runc}\nhandler: runc\n' | kubectl apply -f - >/dev/null
  wait_for "the installer pods" 180 kubectl -n kube-system rollout status daemonset/agentbox-installer --timeout=5s
  kubectl -n kube-system logs daemonset/agentbox-installer -c install | sed 's/^/    /' >&2
  for n in $(seq 1 "$want"); do
    use_node "$n"
    [ "$want" = 1 ] || shared_store_up "$n"
    step "node $NODE: restarting containerd to load the drop-ins"
    stop_one "containerd$SFX"
    start_containerd
    wait_for "the agentbox handlers" 60 sh -c "crictl --runtime-endpoint unix://$SOCK info 2>/dev/null | grep -q agentbox-coder"
    node "$OUT_BIN/agentbox" doctor --address "$SOCK" --config /etc/agentbox/config.toml >"$LOGS/doctor$SFX.log" 2>&1 \
      || { cat "$LOGS/doctor$SFX.log" >&2; die "agentbox doctor failed on node $NODE"; }
  done
  step "up: $(kubectl get nodes --no-headers | awk '{printf "%s %s %s; ", $1, $2, $5}')eval \"\$(hack/kube.sh env)\" for kubectl"
}

# node_down N: node N's containers, processes, mounts, cgroups and bridge.
node_down() {
  use_node "$1"
  if alive "containerd$SFX"; then
    step "node $NODE: removing what pods and containers are left"
    remove_containers "$SOCK"
  fi
  stop_one "containerd$SFX"
  # Whatever is left in the node's namespace was started by it; runsc's
  # sandbox and gofer have mount namespaces of their own: find them by
  # this instance's runsc root and socket.
  local rroot; rroot=$(runsc_root "$SOCK")
  if node_ns_up; then
    local want; want=mnt:[$(stat -L -c %i "$MNTNS")]
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$want" ] && kill -9 "${p#/proc/}" 2>/dev/null
    done
  fi
  kill_leftovers "$SOCK"
  # Pods' processes are in the kubelet's cgroup root (runc containers have
  # mount namespaces of their own).
  local procs
  for procs in $(find "/sys/fs/cgroup/memory/$CGROUP_ROOT" -name cgroup.procs 2>/dev/null); do
    xargs -r kill -9 <"$procs" 2>/dev/null || true
  done
  step "node $NODE: removing its mounts, cgroups, bridge and files"
  if [ -f "$MNTNS" ]; then umount "$MNTNS" 2>/dev/null || umount -l "$MNTNS" 2>/dev/null || true; fi
  unmount_under "$NDIR" "$rroot"
  for c in "${CG_CONTROLLERS[@]}"; do
    [ -d "/sys/fs/cgroup/$c/$CGROUP_ROOT" ] || continue
    find "/sys/fs/cgroup/$c/$CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ ! -d "/sys/fs/cgroup/$c/$CGROUP_ROOT" ] || step "warning: /sys/fs/cgroup/$c/$CGROUP_ROOT is busy; left"
  done
  ip link del "$BRIDGE" >/dev/null 2>&1 || true
  rm -rf "$rroot"
}

down() {
  need_root
  if alive kube-apiserver && { alive kubelet || alive kubelet-2; }; then
    step "deleting pods through the kubelets"
    # The DaemonSet first, or it makes its pods again.
    kubectl -n kube-system delete daemonset agentbox-installer --wait=true --timeout=60s >/dev/null 2>&1 || true
    kubectl delete pods --all --all-namespaces --wait=true --timeout=120s >/dev/null 2>&1 || true
  fi
  step "stopping the control plane, the broker and the kubelets"
  for n in agent-sandbox-controller broker kubelet kubelet-2 kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_one "$n"; done
  node_down 2
  node_down 1
  nft delete table inet abxkube_fwd 2>/dev/null || true
  rm -rf "$DIR"
  step "down"
}

# agent_sandbox: kubernetes-sigs/agent-sandbox on the cluster: its CRDs
# from the module's own k8s/crds, and its controller (core and extensions)
# run on the host against the API server with the admin kubeconfig, as a
# cluster runs it in a pod with its RBAC (k8s/rbac.generated.yaml). The
# node's runtime is for the agents' pods.
agent_sandbox() {
  need_root
  alive kube-apiserver || die "the cluster is not up: hack/kube.sh up"
  local asb; asb=$("$REPO_ROOT/hack/kube/agent-sandbox.sh")
  step "agent-sandbox $AGENT_SANDBOX_VERSION: CRDs"
  kubectl apply --server-side --force-conflicts -f "$asb/k8s/crds" >/dev/null
  wait_for "agent-sandbox's CRDs" 60 kubectl wait --for=condition=Established --timeout=5s \
    crd/sandboxes.agents.x-k8s.io crd/sandboxtemplates.extensions.agents.x-k8s.io \
    crd/sandboxwarmpools.extensions.agents.x-k8s.io crd/sandboxclaims.extensions.agents.x-k8s.io
  # sandboxd's image (hack/images.sh sandboxd), on node 1, for the SDK's
  # flow (docs/agent-sandbox.md).
  local sd; sd=$("$REPO_ROOT/hack/images.sh" sandboxd | tail -n1)
  use_node 1
  ctrq --address "$SOCK" -n k8s.io images import --index-name "docker.io/agentbox/sandboxd:latest" "$sd" >/dev/null
  if alive agent-sandbox-controller; then step "agent-sandbox controller already running"; return; fi
  step "agent-sandbox controller (logs: $LOGS/agent-sandbox-controller.log)"
  bg agent-sandbox-controller "$asb/bin/agent-sandbox-controller" --leader-elect=false --extensions \
    --metrics-bind-address=127.0.0.1:18080 --health-probe-bind-address=127.0.0.1:18081
  wait_for "agent-sandbox's controller" 60 curl -fsS http://127.0.0.1:18081/readyz
}

status() {
  local rc=0 n names="containerd etcd kube-apiserver kube-controller-manager kube-scheduler broker kubelet"
  [ "$(nodes)" != 2 ] || names="$names containerd-2 kubelet-2"
  echo "nodes: $(nodes)"
  for n in $names; do
    if alive "$n"; then echo "$n: running (pid $(cat "$PIDS/$n.pid"))"; else echo "$n: stopped"; rc=3; fi
  done
  return $rc
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  agent-sandbox) agent_sandbox ;;
  status) status ;;
  env)
    echo "export KUBECONFIG=$PKI/admin.kubeconfig"
    echo "export CONTAINER_RUNTIME_ENDPOINT=unix://$SOCK"
    echo "export IMAGE_SERVICE_ENDPOINT=unix://$SOCK"
    echo "export CONTAINERD_ADDRESS=$SOCK"
    echo "export PATH=$KBIN:$OUT_BIN:$TOOLS_BIN:\$PATH" ;;
  node) shift; need_root; node_ns_up || die "the node is not up"; node "$@" ;;
  node2) shift; need_root; use_node 2; node_ns_up || die "node 2 is not up"; node "$@" ;;
  # A release's manifest (make release), applied as this cluster needs
  # (adapt_installer; the broker Deployment stays Pending: its affinity
  # keeps it off agent nodes, and this cluster's broker runs on the host),
  # and its installer image imported into node 1's containerd.
  release-apply)
    need_root
    [ -f "${2:-}" ] || die "usage: $0 release-apply MANIFEST [INSTALLER.oci.tar IMAGE]"
    use_node 1
    if [ -n "${3:-}" ]; then
      ctrq --address "$SOCK" -n k8s.io images import --index-name "$4" "$3" >/dev/null
    fi
    adapt_installer "$(nodes)" <"$2" | kubectl apply -f - >/dev/null ;;
  restart-containerd) need_root; restart_containerd ;;
  # The API server alone, to show what a node does without it.
  apiserver)
    need_root
    case "${2:-}" in
      stop) stop_one kube-apiserver ;;
      start) alive etcd || die "etcd is not running: hack/kube.sh up"; start_apiserver ;;
      *) die "usage: $0 apiserver stop|start" ;;
    esac ;;
  *) die "usage: $0 up [--nodes 2]|down|status|env|node CMD...|node2 CMD...|apiserver stop|start|agent-sandbox|release-apply MANIFEST [TAR IMAGE]|restart-containerd" ;;
esac
