#!/usr/bin/env bash
# Builds the local images (no registry is reachable): an agent image with
# busybox, and the pod-sandbox (pause) image. Output: OCI archives in the
# cache, imported by hack/containerd.sh.
#
#   hack/images.sh             # the cached images
#   hack/images.sh installer   # _output/images/installer.tar: busybox, the
#                              # project's binaries and runsc, for
#                              # examples/kubernetes/installer.yaml
#   hack/images.sh realagent   # the real-agent image: Debian bookworm (glibc)
#                              # with python3, venv, pip, CPython's test suite, node, npm, git,
#                              # curl, sqlite3, openssl, make, chromium, from Debian's
#                              # packages (mmdebstrap), for the e2e suite
#   hack/images.sh sandboxd    # agent-sandbox's sandboxd image: the agent
#                              # image's busybox plus sandboxd (built by
#                              # hack/kube/agent-sandbox.sh), run as uid 1000
#   hack/images.sh agentcli    # the agent-CLI image: the real-agent image plus
#                              # Claude Code, Codex and Gemini CLI from npm
#                              # (pinned below) and Node.js 20 (the machine's;
#                              # Gemini CLI needs >= 20, bookworm's is 18)
source "$(dirname "$0")/lib.sh"
img_dir=$AGENTBOX_CACHE/images
mode=${1:-cached}
if [ "$mode" = installer ]; then img_dir=$REPO_ROOT/_output/images; fi
mkdir -p "$img_dir"
probe_src=$REPO_ROOT/internal/e2e/testdata/probe.c
fetch_src=$REPO_ROOT/internal/e2e/abx-fetch/main.go
stamp="busybox=$(dpkg-query -W -f='${Version}' busybox-static) agent=$(sha256sum "$REPO_ROOT/examples/agent/agent.sh" | cut -c1-12) probe=$(sha256sum "$probe_src" | cut -c1-12) fetch=$(sha256sum "$fetch_src" | cut -c1-12) v6"
if [ "$mode" = realagent ]; then
  # Its own stamp: the package list and the suite, never a registry. A
  # pinned snapshot would make it reproducible; Debian's mirror is what
  # this machine reaches, so the stamp names the day's package versions
  # only through the list below.
  # chromium and libnss3-tools: a browsing agent (headless Chromium, which
  # trusts certificates through an NSS database).
  ra_pkgs=python3,python3-venv,python3-pip,libpython3.11-testsuite,nodejs,npm,git,curl,ca-certificates,sqlite3,openssl,make,procps,chromium,libnss3-tools
  ra_stamp="bookworm $ra_pkgs v4"
  if [ -f "$img_dir/realagent.tar" ] && [ "$(cat "$img_dir/.realagent.stamp" 2>/dev/null)" = "$ra_stamp" ]; then
    step "real-agent image cached"
    exit 0
  fi
  command -v mmdebstrap >/dev/null || die "mmdebstrap missing: run hack/setup.sh"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  step "building the real-agent image (Debian bookworm minbase + $ra_pkgs; a few minutes; log: $AGENTBOX_CACHE/logs/realagent.log)"
  mmdebstrap --variant=minbase --mode=root --format=directory --include="$ra_pkgs" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$work/rootfs" http://deb.debian.org/debian >"$AGENTBOX_CACHE/logs/realagent.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    kill -0 "$pid" 2>/dev/null && step "  still building the real-agent image ($(tail -n1 "$AGENTBOX_CACHE/logs/realagent.log" | cut -c1-70))"
  done
  wait "$pid" || die "mmdebstrap failed: see $AGENTBOX_CACHE/logs/realagent.log"
  rootfs=$work/rootfs
  # The agent user of the suite's images (uid 65532), a home and a workspace.
  echo 'agent:x:65532:65532:agent:/home/agent:/bin/sh' >>"$rootfs/etc/passwd"
  echo 'agent:x:65532:' >>"$rootfs/etc/group"
  # localhost resolves without a runtime's /etc/hosts (plain ctr mounts none).
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
  mkdir -p "$rootfs/home/agent" "$rootfs/workspace"
  # Where Chromium reads an admin's policies (a browsing agent's pod may
  # mount one there: EncryptedClientHelloEnabled=false for passthrough rules).
  mkdir -p "$rootfs/etc/chromium/policies/managed"
  chown 65532:65532 "$rootfs/home/agent"
  chmod 1777 "$rootfs/workspace"
  rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/*
  step "packing the real-agent image"
  layout=$work/layout
  umoci init --layout "$layout"
  umoci new --image "$layout:latest"
  umoci unpack --uid-map 0:0:65536 --gid-map 0:0:65536 --image "$layout:latest" "$work/bundle" >/dev/null
  rmdir "$work/bundle/rootfs" 2>/dev/null || rm -rf "$work/bundle/rootfs"
  mv "$rootfs" "$work/bundle/rootfs"
  umoci repack --image "$layout:latest" "$work/bundle" >/dev/null
  umoci config --image "$layout:latest" --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env LANG=C.UTF-8 --config.workingdir / --config.cmd /bin/bash
  tar -C "$layout" -cf "$img_dir/realagent.tar.new" . && mv "$img_dir/realagent.tar.new" "$img_dir/realagent.tar"
  echo "$ra_stamp" >"$img_dir/.realagent.stamp"
  step "real-agent image: $(du -h "$img_dir/realagent.tar" | cut -f1)"
  exit 0
fi
if [ "$mode" = agentcli ]; then
  # Pinned: the versions the e2e suite's scripted model server was written
  # against (docs/agents/). Installed with --ignore-scripts: no package's
  # own script runs on the build host; the launchers below call each
  # CLI's platform binary, which is what its postinstall would link.
  clis="@anthropic-ai/claude-code@2.1.328 @openai/codex@0.169.0 @google/gemini-cli@0.61.0"
  node_bin=$(command -v node) || die "node missing: Gemini CLI needs Node.js >= 20 (the machine's is copied in)"
  node_v=$("$node_bin" --version)
  case $node_v in v2[0-9].*|v[3-9][0-9].*) ;; *) die "node $node_v: Gemini CLI needs Node.js >= 20";; esac
  [ -f "$img_dir/realagent.tar" ] || "$0" realagent
  ac_stamp="$clis node=$node_v base=$(cat "$img_dir/.realagent.stamp") v1"
  if [ -f "$img_dir/agentcli.tar" ] && [ "$(cat "$img_dir/.agentcli.stamp" 2>/dev/null)" = "$ac_stamp" ]; then
    step "agent-CLI image cached"
    exit 0
  fi
  npm_dir=$AGENTBOX_CACHE/agentcli-npm
  npm_stamp=$(echo "$clis" | sha256sum | cut -c1-12)
  if [ "$(cat "$npm_dir/.stamp" 2>/dev/null)" != "$npm_stamp" ]; then
    step "installing $clis from npm (about 850 MB; log: $AGENTBOX_CACHE/logs/agentcli-npm.log)"
    rm -rf "$npm_dir" && mkdir -p "$npm_dir"
    # shellcheck disable=SC2086 # one argument per package
    (cd "$npm_dir" && npm install --no-audit --no-fund --ignore-scripts --prefix . $clis) >"$AGENTBOX_CACHE/logs/agentcli-npm.log" 2>&1 \
      || { tail -n 20 "$AGENTBOX_CACHE/logs/agentcli-npm.log" >&2; die "npm install failed"; }
    echo "$npm_stamp" >"$npm_dir/.stamp"
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  step "building the agent-CLI image (the real-agent image + $clis)"
  layout=$work/layout
  mkdir -p "$layout" && tar -C "$layout" -xf "$img_dir/realagent.tar"
  umoci unpack --uid-map 0:0:65536 --gid-map 0:0:65536 --image "$layout:latest" "$work/bundle" >/dev/null
  rootfs=$work/bundle/rootfs
  mkdir -p "$rootfs/opt/agents"
  cp -a "$npm_dir/node_modules" "$rootfs/opt/agents/"
  install -m 0755 "$node_bin" "$rootfs/usr/local/bin/node"
  m=/opt/agents/node_modules
  ln -s "$m/@anthropic-ai/claude-code-linux-x64/claude" "$rootfs/usr/local/bin/claude"
  ln -s "$m/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex" "$rootfs/usr/local/bin/codex"
  ln -s "$m/@google/gemini-cli/bundle/gemini.js" "$rootfs/usr/local/bin/gemini"
  for b in claude codex gemini; do [ -x "$rootfs$(readlink "$rootfs/usr/local/bin/$b")" ] || die "$b: $(readlink "$rootfs/usr/local/bin/$b") missing"; done
  umoci repack --image "$layout:latest" "$work/bundle" >/dev/null
  tar -C "$layout" -cf "$img_dir/agentcli.tar.new" . && mv "$img_dir/agentcli.tar.new" "$img_dir/agentcli.tar"
  echo "$ac_stamp" >"$img_dir/.agentcli.stamp"
  step "agent-CLI image: $(du -h "$img_dir/agentcli.tar" | cut -f1)"
  exit 0
fi
if [ "$mode" = cached ] && [ -f "$img_dir/.stamp" ] && [ "$(cat "$img_dir/.stamp")" = "$stamp" ]; then
  step "images cached"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# build_image NAME TAG CMD...: a busybox rootfs whose command is CMD.
build_image() {
  local name=$1 tag=$2; shift 2
  step "building image $name:$tag"
  local layout=$work/$name
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci unpack --uid-map 0:0:65536 --gid-map 0:0:65536 --image "$layout:$tag" "$work/$name-bundle" >/dev/null
  local rootfs=$work/$name-bundle/rootfs
  mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,workspace,proc,sys,dev,root,home/agent}
  chmod 1777 "$rootfs/tmp"
  mkdir -p "$rootfs/usr/local/bin"
  install -m 0755 "$REPO_ROOT/examples/agent/agent.sh" "$rootfs/usr/local/bin/agent"
  if [ -n "${VOLUME:-}" ]; then mkdir -p "$rootfs$VOLUME"; chmod 1777 "$rootfs$VOLUME"; fi
  for b in ${EXTRA_BINS:-}; do install -m 0755 "$b" "$rootfs/usr/local/bin/$(basename "$b")"; done
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nagent:x:65532:65532:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nagent:x:65532:\nnobody:x:65534:\n' >"$rootfs/etc/group"
  umoci repack --image "$layout:$tag" "$work/$name-bundle" >/dev/null
  local cfg=(--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --config.workingdir /)
  for c in "$@"; do cfg+=(--config.cmd "$c"); done
  [ -z "${VOLUME:-}" ] || cfg+=(--config.volume "$VOLUME")
  umoci config --image "$layout:$tag" "${cfg[@]}"
  tar -C "$layout" -cf "$img_dir/$name.tar" .
}

if [ "$mode" = installer ]; then
  # A release (hack/release.sh) builds it from its own binaries
  # (INSTALLER_BIN: the CLI, the shim and runsc), tagged with its version.
  bins=${INSTALLER_BIN:-}
  set -- "$OUT_BIN/agentbox" "$OUT_BIN/containerd-shim-agentbox-v1" "$TOOLS_BIN/runsc"
  [ -z "$bins" ] || set -- "$bins/agentbox" "$bins/containerd-shim-agentbox-v1" "$bins/runsc"
  for b in "$@"; do
    [ -x "$b" ] || die "$b missing: run hack/setup.sh"
  done
  EXTRA_BINS="$*" build_image installer "${INSTALLER_TAG:-latest}" /usr/local/bin/agentbox install --help
  echo "$img_dir/installer.tar"
  exit 0
fi
if [ "$mode" = sandboxd ]; then
  bin=$("$REPO_ROOT/hack/kube/agent-sandbox.sh")/bin/sandboxd
  sd_stamp="$AGENT_SANDBOX_VERSION $(sha256sum "$bin" | cut -c1-12) $stamp"
  if [ -f "$img_dir/sandboxd.tar" ] && [ "$(cat "$img_dir/.sandboxd.stamp" 2>/dev/null)" = "$sd_stamp" ]; then
    step "sandboxd image cached"
    echo "$img_dir/sandboxd.tar"
    exit 0
  fi
  EXTRA_BINS="$bin" build_image sandboxd latest /usr/local/bin/sandboxd
  echo "$sd_stamp" >"$img_dir/.sandboxd.stamp"
  echo "$img_dir/sandboxd.tar"
  exit 0
fi
[ "$mode" = cached ] || die "usage: $0 [installer|realagent|agentcli|sandboxd]"

build_image agent latest /usr/local/bin/agent
# The e2e suite's probe image: the agent image plus abx-probe, a small
# static program that tries from inside the sandbox what the syscall
# policy denies (internal/e2e/testdata/probe.c), and abx-fetch.
step "compiling abx-probe (static)"
gcc -static -O2 -pthread -o "$work/abx-probe" "$probe_src"
# abx-fetch: an HTTPS client that verifies servers, with an attacker's
# knobs (Host, SNI, the address dialled), for the egress gateway tests.
step "compiling abx-fetch (static Go)"
(cd "$REPO_ROOT" && CGO_ENABLED=0 go build -trimpath -o "$work/abx-fetch" ./internal/e2e/abx-fetch)
# Its VOLUME makes containerd's CRI add an image-volume mount.
EXTRA_BINS="$work/abx-probe $work/abx-fetch" VOLUME=/var/lib/probe build_image probe latest /usr/local/bin/agent
# The pause image: a command that never exits and dies on SIGTERM/SIGKILL.
build_image pause latest /bin/sh -c 'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done'
echo "$stamp" >"$img_dir/.stamp"
