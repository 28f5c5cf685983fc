#!/usr/bin/env bash
# Builds a release into _output/release/ (RELEASES.md says what each file
# is): the binaries' tarball, SHA256SUMS, an SPDX SBOM, the installer
# image as an OCI archive, and one manifest with this version's image.
# Needs the toolchain and the patched runsc of hack/setup.sh; root only
# for the image (umoci's unpack).
#
#   make release VERSION=1.2.3     # hack/release.sh 1.2.3
#   RELEASE_DIR=DIR hack/release.sh 1.2.3   # into DIR (the release e2e)
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
version=${1:-${VERSION:-}}
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] \
  || die "VERSION=$version: want MAJOR.MINOR.PATCH (semantic versioning, RELEASES.md), e.g. make release VERSION=0.4.0"
[ -x "$TOOLS_BIN/runsc" ] || die "$TOOLS_BIN/runsc missing: run hack/setup.sh (the release ships the patched runsc)"
out=${RELEASE_DIR:-$REPO_ROOT/_output/release}
name=agentbox-$version
image=docker.io/agentbox/installer:$version
rm -rf "$out" && mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The release's files carry its commit's time: built twice, they are the
# same bytes.
export SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

step "binaries $version ($rev)"
bin=$work/$name/bin
mkdir -p "$bin"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X agentbox.dev/agentbox/internal/version.Version=$version -X agentbox.dev/agentbox/internal/version.Revision=$rev" \
  -o "$bin/" ./cmd/containerd-shim-agentbox-v1 ./cmd/agentbox
install -m 0755 "$TOOLS_BIN/runsc" "$bin/runsc"
cp LICENSE RELEASES.md CHANGELOG.md "$work/$name/"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$work" -czf "$out/$name-linux-amd64.tar.gz" "$name"

step "SBOM (SPDX 2.3)"
patches=$(cd hack/patches && ls *.patch 2>/dev/null | tr '\n' ' ')
go run ./hack/sbom -name "$name" -version "$version" -comment "runsc=gVisor patched with hack/patches: $patches" \
  "$bin/containerd-shim-agentbox-v1" "$bin/agentbox" "$bin/runsc" >"$out/$name.spdx.json"

step "the manifest: CRDs, RBAC, the node restriction, the broker, the installer, the RuntimeClass"
{
  echo "# agentbox $version: kubectl apply -f agentbox.yaml (docs/install.md)."
  for f in examples/kubernetes/crds/*.yaml examples/kubernetes/sync-rbac.yaml examples/kubernetes/broker-rbac.yaml \
    examples/kubernetes/node-restriction.yaml examples/kubernetes/broker.yaml examples/kubernetes/installer.yaml \
    examples/kubernetes/runtimeclass.yaml; do
    echo "---"
    echo "# $f"
    sed -e "s|docker.io/agentbox/installer:latest|$image|g" "$f"
  done
} >"$out/agentbox.yaml"
grep -q "installer:latest" "$out/agentbox.yaml" && die "the manifest still names installer:latest"

step "the installer image $image (OCI archive)"
img_tar=$(INSTALLER_BIN=$bin INSTALLER_TAG=$version "$REPO_ROOT/hack/images.sh" installer | tail -1)
mv "$img_tar" "$out/agentbox-installer-$version.oci.tar"

(cd "$out" && sha256sum -- *.tar.gz *.oci.tar *.spdx.json agentbox.yaml >SHA256SUMS)
step "release $version in $out:"
(cd "$out" && ls -l | tail -n +2 | sed 's/^/    /' >&2)
