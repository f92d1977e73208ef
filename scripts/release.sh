#!/usr/bin/env bash
# release.sh [OUT]: the release artifacts of this commit, in OUT (dist by
# default), as make release makes them (docs/adr/0047-packages-and-the-hardened-unit.md):
#
#   mesh_V_linux_ARCH.tar.gz       meshd, meshctl, the shipped modules, the docs,
#                                  a sample config and the systemd unit
#   mesh_V_linux_ARCH.sbom.cdx.json  its CycloneDX SBOM (cyclonedx-gomod)
#   mesh_V_ARCH.deb, mesh-V-1.ARCH.rpm  the package (nfpm, packaging/nfpm.yaml)
#   SHA256SUMS                     the SHA-256 of each
#
# for each ARCH of RELEASE_ARCHS (default "amd64 arm64"); V is VERSION
# without its v. Reproducible: the binaries are built with -trimpath and
# no cgo, and every file's time is the commit's (SOURCE_DATE_EPOCH unless
# set), with owners and modes fixed, so two runs on one commit, from any
# directory, give the same bytes (test/release checks it).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(cat VERSION)
pkg_version=${version#v}
commit=$(git rev-parse --short=12 HEAD)
if ! git diff --quiet HEAD -- 2>/dev/null; then
	commit="$commit+dirty"
	echo "release: the work tree differs from $commit: the artifacts say +dirty" >&2
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
archs=${RELEASE_ARCHS:-amd64 arm64}
ldflags="-s -w -X github.com/meshkit/mesh/internal/version.release=$version -X github.com/meshkit/mesh/internal/version.commit=$commit"

# The tools, for this machine, at the versions tools/go.mod pins.
tools="$out/.tools"
GOOS= GOARCH= go build -modfile=tools/go.mod -trimpath -o "$tools/" \
	github.com/goreleaser/nfpm/v2/cmd/nfpm github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod

artifacts=()
for arch in $archs; do
	name="mesh_${pkg_version}_linux_${arch}"
	stage="$out/.stage/$name"
	rm -rf "$stage"
	mkdir -p "$stage/bin" "$stage/modules" "$stage/systemd"
	build() { GOOS=linux GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$1" "$2"; }
	build "$stage/bin/meshd" ./cmd/meshd
	build "$stage/bin/meshctl" ./cmd/meshctl
	build "$stage/modules/audit-logger" ./auditlogger/cmd/audit-logger
	build "$stage/modules/dispatcher" ./modules/dispatcher/cmd/dispatcher
	build "$stage/modules/agent" ./modules/agent/cmd/agent
	cp README.md CHANGELOG.md "$stage/"
	cp -R docs "$stage/docs"
	cp packaging/mesh.yaml "$stage/mesh.yaml.example"
	cp packaging/meshd.env "$stage/meshd.env.example"
	cp packaging/meshd.service "$stage/systemd/meshd.service"
	find "$stage" -type d -exec chmod 0755 {} +
	find "$stage" -type f -exec chmod 0644 {} +
	chmod 0755 "$stage"/bin/* "$stage"/modules/*
	find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} + # nfpm keeps a tree's own times
	(cd "$out/.stage" && tar --sort=name --format=gnu --mtime="@$SOURCE_DATE_EPOCH" \
		--owner=0 --group=0 --numeric-owner -cf - "$name") | gzip -n -9 >"$out/$name.tar.gz"
	GOOS=linux GOARCH=$arch "$tools/cyclonedx-gomod" mod -json -noserial -notimestamp -std -licenses \
		-output "$out/$name.sbom.cdx.json" . 2>/dev/null
	artifacts+=("$name.tar.gz" "$name.sbom.cdx.json")
	for packager in deb rpm; do
		made=$(ARCH=$arch STAGE=$stage PKG_VERSION=$pkg_version \
			"$tools/nfpm" package --config packaging/nfpm.yaml --packager "$packager" --target "$out/" |
			sed -n 's/.*created package: //p')
		artifacts+=("$(basename "$made")")
	done
done
(cd "$out" && sha256sum "${artifacts[@]}" | sort -k 2 >SHA256SUMS)
rm -rf "$out/.stage" "$out/.tools"
echo "release $version ($commit) in $out:"
(cd "$out" && ls -l "${artifacts[@]}" SHA256SUMS)
