#!/usr/bin/env bash
# Python's own regression tests, as a compatibility benchmark: a fixed list
# of CPython's test modules (Debian's libpython3.11-testsuite, in the
# real-agent image) under runc and under agentbox's baseline role, in one
# run, on a private containerd, as the same user (65532) in the same
# environment (HOME and TMPDIR /tmp, cwd /tmp, a network namespace with only
# loopback, up: plain ctr leaves a new namespace's lo down). It is a
# benchmark, not a test: differences are for docs/testing.md's table, each with
# its reason.
#
#   hack/pycompat.sh [MODULE ...]     # default: the list below
#   hack/pycompat.sh --summary        # the table again, from the last run's logs
#
# Results: _output/pycompat/RUNTIME/MODULE.log, and a table in
# _output/pycompat/summary.md (status, tests run, failures and errors by
# name, seconds). PYCOMPAT_RUNTIMES="runc agentbox" picks the runtimes.
#
# It installs what it needs first (hack/setup.sh, cached), so it runs after the
# quickstart alone.
source "$(dirname "$0")/lib.sh"
need_root

summary_only=false
if [ "${1:-}" = --summary ]; then summary_only=true; shift; fi
modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=(test_os test_subprocess test_threading test_signal test_select test_socket
  test_ssl test_tempfile test_shutil test_mmap test_multiprocessing_spawn test_venv)
# (test_sqlite3 is not in Debian's libpython3.11-testsuite: the workloads
# test covers sqlite3.)
runtimes=(${PYCOMPAT_RUNTIMES:-runc agentbox})
OUT=$REPO_ROOT/_output/pycompat
DEV=${AGENTBOX_PYCOMPAT_DEV:-/tmp/agentbox-pycompat}
NETNS=abx-pycompat

# run RUNTIME MODULE: one module in a fresh container; prints its log path.
run() {
  local rt=$1 m=$2 log=$OUT/$1/$2.log args=()
  mkdir -p "$OUT/$rt"
  case "$rt" in
    runc) args=(--runtime io.containerd.runc.v2) ;;
    agentbox) args=(--runtime io.containerd.agentbox.v1 --annotation agentbox.dev/role=baseline) ;;
    *) die "unknown runtime $rt" ;;
  esac
  local start=$SECONDS
  set +e
  timeout 900 ctr --address "$sock" run --rm "${args[@]}" --with-ns "network:/var/run/netns/$NETNS" --user 65532:65532 --cwd /tmp \
    --env HOME=/tmp --env TMPDIR=/tmp --env LANG=C.UTF-8 \
    "$REALAGENT_IMAGE" "pyc-$rt-$m-$$" python3 -m test -v "$m" >"$log" 2>&1
  echo "exit=$? seconds=$((SECONDS - start))" >>"$log"
  set -e
}

summary() {
  local log=$1
  local exit secs result ran failed
  exit=$(sed -n 's/^exit=\([0-9]*\) .*/\1/p' "$log" | tail -n1)
  secs=$(sed -n 's/.*seconds=\([0-9]*\)$/\1/p' "$log" | tail -n1)
  result=$(sed -n 's/^== Tests result: \(.*\) ==$/\1/p; s/^Result: \(.*\)$/\1/p' "$log" | tail -n1)
  ran=$(sed -n 's/^Ran \([0-9]*\) tests\{0,1\}.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
  # "FAIL: test_x (test.test_os.Class.test_x)": the parenthesis names it.
  failed=$(sed -n 's/^\(FAIL\|ERROR\): [^ ]* (\([^)]*\)).*/\2/p' "$log" | sed 's/^test\.//' | sort -u | tr '\n' ' ')
  printf '%s|%s|%s|%s|%s\n' "${result:-exit $exit}" "$ran" "${failed:--}" "$secs" "$exit"
}

table() {
  echo "| module | runtime | result | tests run | failing (FAIL/ERROR) | seconds |"
  echo "|---|---|---|---|---|---|"
  for m in "${modules[@]}"; do
    for rt in "${runtimes[@]}"; do
      [ -f "$OUT/$rt/$m.log" ] || continue
      IFS='|' read -r res ran failed secs _ <<<"$(summary "$OUT/$rt/$m.log")"
      echo "| $m | $rt | $res | $ran | $failed | $secs |"
    done
  done
}
if $summary_only; then
  table
  exit 0
fi

rm -rf "$OUT"; mkdir -p "$OUT"
"$REPO_ROOT/hack/setup.sh"
cleanup() {
  AGENTBOX_DEV=$DEV "$REPO_ROOT/hack/containerd.sh" stop >/dev/null 2>&1 || true
  ip netns del "$NETNS" 2>/dev/null || true
}
trap cleanup EXIT
ip netns del "$NETNS" 2>/dev/null || true
ip netns add "$NETNS"
ip -n "$NETNS" link set lo up
sock=$(AGENTBOX_DEV=$DEV "$REPO_ROOT/hack/containerd.sh" start | tail -n1)

for m in "${modules[@]}"; do
  for rt in "${runtimes[@]}"; do
    step "$m under $rt"
    run "$rt" "$m"
    IFS='|' read -r res ran failed secs _ <<<"$(summary "$OUT/$rt/$m.log")"
    step "  $res, $ran tests, ${secs}s${failed:+; failing: $failed}"
  done
done

table >"$OUT/summary.md"
cat "$OUT/summary.md"
