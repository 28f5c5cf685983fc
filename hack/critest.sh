#!/usr/bin/env bash
# CRI conformance: critest (sigs.k8s.io/cri-tools) against the agentbox
# handler, with runc as the reference in the same run, on a private
# containerd. critest's images come from registries that cannot be reached
# here: stand-ins (busybox-static, umoci, and hack/critest's two small
# programs) are served from a registry on loopback, and containerd sends
# registry.k8s.io, gcr.io and k8s.gcr.io there and nowhere else. Builds and
# images are cached under $AGENTBOX_CACHE/critest.
#
#   hack/critest.sh [HANDLER[:ROLE] ...]
#       default: runc agentbox:baseline agentbox:critest-permissive
#
# ROLE is the shim config's default_role for that run (critest's pods claim
# none). critest-permissive (hack/critest/critest-permissive.yaml) is the
# widest role the schema expresses: with it, a spec that fails is a defect
# or a gVisor limit rather than a role doing its job. Results (JUnit and
# logs) go to _output/critest/NAME/, the counts to _output/critest/summary.txt.
# CRITEST_FOCUS=REGEX runs only the specs it matches.
#
# It installs what it needs first (hack/setup.sh, cached), so it runs after the
# quickstart alone.
source "$(dirname "$0")/lib.sh"
need_root

CRITEST_VERSION=$CRICTL_VERSION
CRANE_VERSION=v0.22.1
W=$AGENTBOX_CACHE/critest
BIN=$W/bin
REGISTRY=127.0.0.1:5999
OUT=$REPO_ROOT/_output/critest
DEV=${AGENTBOX_CRITEST_DEV:-/tmp/agentbox-critest}
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(runc agentbox:baseline agentbox:critest-permissive)
mkdir -p "$BIN" "$OUT" "$AGENTBOX_CACHE/logs"

# runsc, containerd, crictl and the agentbox binaries (cached; quick when
# nothing changed).
"$REPO_ROOT/hack/setup.sh"

# critest: cmd/critest holds only test files, so it is built as a test
# binary from a copy of the module.
if [ "$(cat "$BIN/.critest.stamp" 2>/dev/null)" != "$CRITEST_VERSION" ]; then
  step "building critest $CRITEST_VERSION (log: $AGENTBOX_CACHE/logs/critest.log)"
  (
    set -e
    mod=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/cri-tools@$CRITEST_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    src=$W/src/cri-tools; rm -rf "$src"; mkdir -p "$W/src"; cp -r "$mod" "$src"; chmod -R u+w "$src"
    cd "$src" && CGO_ENABLED=0 go test -c -o "$BIN/critest" ./cmd/critest
    rm -rf "$src"
  ) >"$AGENTBOX_CACHE/logs/critest.log" 2>&1 || { tail -n 20 "$AGENTBOX_CACHE/logs/critest.log" >&2; die "building critest failed"; }
  echo "$CRITEST_VERSION" >"$BIN/.critest.stamp"
fi
if [ "$(cat "$BIN/.crane.stamp" 2>/dev/null)" != "$CRANE_VERSION" ]; then
  step "building crane $CRANE_VERSION"
  GOBIN=$BIN CGO_ENABLED=0 go install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" >"$AGENTBOX_CACHE/logs/crane.log" 2>&1 \
    || { tail -n 20 "$AGENTBOX_CACHE/logs/crane.log" >&2; die "building crane failed"; }
  echo "$CRANE_VERSION" >"$BIN/.crane.stamp"
fi
(cd "$REPO_ROOT" && CGO_ENABLED=0 go build -o "$BIN/" ./hack/critest/websrv ./hack/critest/nnp)

# Stand-in images, each an OCI layout under $W/images.
img_stamp="busybox=$(dpkg-query -W -f='${Version}' busybox-static) src=$(cat "$REPO_ROOT"/hack/critest/*/main.go "$0" | sha256sum | cut -c1-16)"
if [ "$(cat "$W/images/.stamp" 2>/dev/null)" != "$img_stamp" ]; then
  step "building critest's stand-in images"
  rm -rf "$W/images"; mkdir -p "$W/images"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  # image NAME EXTRA [umoci config args...]: a busybox image; EXTRA (a
  # function or "-") adds to its rootfs.
  image() {
    local name=$1 extra=$2; shift 2
    local layout=$W/images/$name r=$work/$name/rootfs
    umoci init --layout "$layout"
    umoci new --image "$layout:latest"
    umoci unpack --uid-map 0:0:65536 --gid-map 0:0:65536 --image "$layout:latest" "$work/$name" >/dev/null
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,tmp,root,home,var/www,var/run,proc,sys,dev}
    chmod 1777 "$r/tmp"
    cp /bin/busybox "$r/bin/busybox"
    # Hard links, as in the real busybox image: a spec masks /bin/ls, and
    # with symlinks that would mask busybox itself (runc and agentbox
    # alike follow them inside the container).
    for a in $(/bin/busybox --list); do [ -e "$r/bin/$a" ] || ln "$r/bin/busybox" "$r/bin/$a"; done
    printf '%s\n' root:x:0:0:root:/root:/bin/sh daemon:x:1:1:daemon:/usr/sbin:/bin/false www-data:x:33:33:www-data:/var/www:/bin/false \
      nobody:x:65534:65534:nobody:/home:/bin/false >"$r/etc/passwd"
    printf '%s\n' root:x:0: daemon:x:1: wheel:x:10:root www-data:x:33: users:x:100: nogroup:x:65534: >"$r/etc/group"
    # Applets Debian's busybox-static lacks and the specs run.
    printf '%s\n' '#!/bin/sh' '# pgrep PATTERN: pids whose comm contains PATTERN' 'rc=1' \
      'for d in /proc/[0-9]*; do c=$(cat "$d/comm" 2>/dev/null) || continue; case "$c" in *"$1"*) [ "${d#/proc/}" = "$$" ] || { echo "${d#/proc/}"; rc=0; } ;; esac; done' \
      'exit $rc' >"$r/usr/bin/pgrep"
    printf '%s\n' '#!/bin/sh' '# ipcs -m: shared memory segments' 'echo "------ Shared Memory Segments --------"' \
      'echo "key        shmid      owner      perms      bytes      nattch     status"' '[ -r /proc/sysvipc/shm ] || exit 0' \
      'tail -n +2 /proc/sysvipc/shm | while read key shmid perms size cpid lpid nattch uid rest; do printf "%-10s %-10s %-10s %-10s %-10s %-10s\n" "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"; done' \
      >"$r/usr/bin/ipcs"
    chmod 0755 "$r/usr/bin/pgrep" "$r/usr/bin/ipcs"
    [ "$extra" = - ] || "$extra" "$r"
    umoci repack --image "$layout:latest" "$work/$name" >/dev/null
    umoci config --image "$layout:latest" --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
    umoci gc --layout "$layout"
  }
  web_nginx() { install -m 0755 "$BIN/websrv" "$1/usr/sbin/nginx"; mkdir -p "$1/usr/share/nginx/html"; }
  web_httpd() { install -m 0755 "$BIN/websrv" "$1/usr/local/bin/httpd"; }
  setuid_nnp() { install -m 4755 -o 0 -g 0 "$BIN/nnp" "$1/usr/local/bin/nnp"; }
  user_1000() {
    echo 'default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh' >>"$1/etc/passwd"
    printf 'default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n' >>"$1/etc/group"
    mkdir -p "$1/home/default-user"; chown 1000:1000 "$1/home/default-user"
  }
  marker() { touch "$1/$MARKER"; }
  image busybox - --config.cmd sh
  image nginx web_nginx --config.env PIDFILE=/var/run/nginx.pid --config.env PORT=80 --config.cmd nginx --config.cmd -g --config.cmd 'daemon off;'
  image hostnet-nginx web_nginx --config.env PIDFILE=/var/run/nginx.pid --config.env PORT=12003 --config.cmd nginx --config.cmd -g --config.cmd 'daemon off;'
  image httpd web_httpd --config.env PORT=80 --config.cmd httpd-foreground --config.entrypoint /usr/local/bin/httpd
  image nonewprivs setuid_nnp --config.entrypoint /usr/local/bin/nnp
  image user-uid - --config.user 1002 --config.cmd sh
  image user-username - --config.user www-data --config.cmd sh
  image user-uid-group - --config.user 1003:1004 --config.cmd sh
  image user-username-group - --config.user www-data:1004 --config.cmd sh
  image predefined-group user_1000 --config.user 1000 --config.cmd sh
  for m in test-image-1 test-image-2 test-image-3 test-image-latest same-image test all pause; do
    MARKER=$m image "marker-$m" marker --config.cmd sh
  done
  echo "$img_stamp" >"$W/images/.stamp"
fi

cleanup() {
  [ -z "${REG_PID:-}" ] || kill "$REG_PID" 2>/dev/null || true
  AGENTBOX_DEV=$DEV "$REPO_ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
  rm -rf "$DEV"
}
trap cleanup EXIT

step "registry on $REGISTRY"
rm -rf "$W/registry"; mkdir -p "$W/registry"
"$BIN/crane" registry serve --address "$REGISTRY" --disk "$W/registry" >"$OUT/registry.log" 2>&1 &
REG_PID=$!
for _ in $(seq 50); do curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
push() { "$BIN/crane" push --insecure "$W/images/$1" "$REGISTRY/$2" >/dev/null || die "push $2"; }
push busybox e2e-test-images/busybox:1.29-2
push nginx e2e-test-images/nginx:1.14-2
push httpd e2e-test-images/httpd:2.4.39-4
push nonewprivs e2e-test-images/nonewprivs:1.3
S=k8s-staging-cri-tools
push hostnet-nginx $S/hostnet-nginx-amd64:latest
push user-uid $S/test-image-user-uid:latest
push user-username $S/test-image-user-username:latest
push user-uid-group $S/test-image-user-uid-group:latest
push user-username-group $S/test-image-user-username-group:latest
push predefined-group $S/test-image-predefined-group:latest
for m in test-image-1 test-image-2 test-image-3 test-image-latest; do push "marker-$m" "$S/$m:latest"; done
for t in 1 2 3; do push marker-same-image "$S/test-image-tags:$t"; done
push marker-test $S/test-image-tag:test
push marker-all $S/test-image-tag:all
push marker-pause pause:3.9

step "private containerd ($DEV) mirroring critest's registries to $REGISTRY"
rm -rf "$DEV"
AGENTBOX_DEV=$DEV AGENTBOX_REGISTRY_MIRROR=http://$REGISTRY "$REPO_ROOT/hack/containerd.sh" start >/dev/null
cp "$REPO_ROOT/hack/critest/critest-permissive.yaml" "$DEV/agentbox/policies/"
sock=$DEV/containerd.sock

: >"$OUT/summary.txt"
for run in "${runs[@]}"; do
  handler=${run%%:*} role=
  [ "$run" = "$handler" ] || role=${run#*:}
  name=$handler${role:+-$role}
  if [ -n "$role" ]; then
    sed -i "s/^default_role = .*/default_role = \"$role\"/" "$DEV/agentbox/config.toml"
  fi
  out=$OUT/$name; rm -rf "$out"; mkdir -p "$out"
  step "critest: $name (3 minutes for runc, about 10 for agentbox; log: $out/critest.log)"
  ( cd "$out" && "$BIN/critest" --runtime-endpoint "unix://$sock" --image-endpoint "unix://$sock" \
      --runtime-handler "$handler" --nri-socket "$DEV/nri.sock" --report-dir "$out" \
      --ginkgo.no-color --ginkgo.v --ginkgo.timeout=2h \
      --ginkgo.skip 'public image with digest should be pulled and removed' \
      ${CRITEST_FOCUS:+--ginkgo.focus "$CRITEST_FOCUS"} ) >"$out/critest.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && step "  $name: $(grep -c "^•" "$out/critest.log" 2>/dev/null || true) specs done"
  done
  wait "$pid" || true
  counts=$(grep -E '^Ran [0-9]+ of [0-9]+ Specs' "$out/critest.log" | tail -1)
  result=$(grep -oE '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$out/critest.log" | tail -1)
  printf '%-32s %s; %s\n' "$name" "${counts:-no summary}" "${result:-see $out/critest.log}" | tee -a "$OUT/summary.txt"
  grep -E '^\s*\[FAIL\]' "$out/critest.log" | sed 's/^\s*//' | sort -u >"$out/failed.txt" || true
  # The specs that skipped (rro's among them until the handler advertised it).
  grep -A1 '^S \[SKIPPED\]' "$out/critest.log" | grep -v '^S \[SKIPPED\]\|^--' | sort >"$out/skipped.txt" || true
done
step "summary: $OUT/summary.txt"
