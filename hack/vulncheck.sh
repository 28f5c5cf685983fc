#!/usr/bin/env bash
# govulncheck, pinned, against a pinned copy of the Go vulnerability
# database. vuln.go.dev is not reachable from the machines agentbox is
# built on; the database is generated from golang.org/x/vulndb (its OSV
# files, as the Go module proxy serves them) with that repository's own
# cmd/gendb, once, into the cache. The findings govulncheck reports as
# called are compared with hack/vulncheck-accepted.txt: each accepted one
# says why it cannot be fixed here yet. A new finding fails; an accepted
# one no longer found is reported, to be removed. No root.
#
#   hack/vulncheck.sh          # make vulncheck
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
GOVULNCHECK_VERSION=v1.9.0
cache=$AGENTBOX_CACHE
[ -w "$cache" ] || [ -w "$(dirname "$cache")" ] || cache=${XDG_CACHE_HOME:-$HOME/.cache}/agentbox
db=$cache/vulndb/$VULNDB_VERSION
if [ ! -f "$db/index/db.json" ]; then
  step "vulnerability database from golang.org/x/vulndb@$VULNDB_VERSION (the Go module proxy)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  src=$(module_dir "golang.org/x/vulndb@$VULNDB_VERSION")
  [ -d "$src/data/osv" ] || die "golang.org/x/vulndb@$VULNDB_VERSION has no data/osv"
  # gendb reads the OSV files from a git repository (their dates from its
  # commit): a snapshot of the module, committed at its version's time.
  cp -r "$src" "$work/repo" && chmod -R u+w "$work/repo"
  stamp=${VULNDB_VERSION#v0.0.0-}; stamp=${stamp%%-*}
  date="${stamp:0:4}-${stamp:4:2}-${stamp:6:2}T${stamp:8:2}:${stamp:10:2}:${stamp:12:2}Z"
  (cd "$work/repo" && git init -q && git add -A && GIT_COMMITTER_DATE=$date git -c user.name=agentbox -c user.email=agentbox@localhost \
    commit -q --date="$date" -m "golang.org/x/vulndb@$VULNDB_VERSION")
  mkdir -p "$(dirname "$db")"
  (cd "$work/repo" && go run ./cmd/gendb -repo . -out "$db.tmp" >/dev/null)
  mv "$db.tmp" "$db"
fi
bin=$cache/govulncheck-$GOVULNCHECK_VERSION
[ -x "$bin/govulncheck" ] || GOBIN=$bin go install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION"
step "govulncheck $GOVULNCHECK_VERSION against the database of $VULNDB_VERSION"
out=$(mktemp)
# Exit 3 is "vulnerabilities found": judged below, against the accepted list.
rc=0
"$bin/govulncheck" -db "file://$db" ./... >"$out" 2>&1 || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 3 ] || { cat "$out" >&2; die "govulncheck failed (exit $rc)"; }
found=$(sed -n 's/^Vulnerability #[0-9]*: \(GO-[0-9-]*\)$/\1/p' "$out" | sort -u)
# Every finding must be read: one whose ID this cannot parse (a new format,
# a new kind of ID) fails, as does an exit 3 with none parsed.
reported=$(grep -c '^Vulnerability #' "$out" || true)
parsed=$(grep -c '^Vulnerability #[0-9]*: GO-[0-9-]*$' "$out" || true)
if [ "$reported" != "$parsed" ] || { [ "$rc" = 3 ] && [ "$parsed" = 0 ]; }; then
  cat "$out" >&2
  die "govulncheck reported findings this script could not read ($parsed of $reported parsed, exit $rc): read them above"
fi
accepted=$(sed -n 's/^\(GO-[0-9-]*\)[[:space:]].*/\1/p' hack/vulncheck-accepted.txt | sort -u)
new=$(comm -23 <(printf '%s\n' $found) <(printf '%s\n' $accepted) | sed '/^$/d')
gone=$(comm -13 <(printf '%s\n' $found) <(printf '%s\n' $accepted) | sed '/^$/d')
for id in $gone; do step "$id is accepted in hack/vulncheck-accepted.txt and no longer found: remove it"; done
if [ -n "$new" ]; then
  cat "$out" >&2
  die "vulnerabilities the code calls, not accepted: $(echo $new) (fix them, or add each to hack/vulncheck-accepted.txt with why it cannot be fixed yet)"
fi
step "govulncheck: $(echo "$found" | sed '/^$/d' | wc -l) called vulnerabilities, all accepted with a reason; none new"
