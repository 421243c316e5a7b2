#!/bin/sh
# Regenerates ../fixtures/zstdchunked-legacy with Debian 12's skopeo (1.9.3: c/image 5.23,
# c/storage 1.43), which writes the legacy zstd:chunked format (io.containers.zstd-chunked.*
# annotations, 40-byte footer, no tar-split). Run from this directory as root on Debian 12 with
# `apt-get install -y skopeo`.
set -eu
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go run ./cmd/ocilayout "$work/in" ref
# c/image 5.23 silently reuses a previously compressed blob recorded in this cache.
rm -f /var/lib/containers/cache/blob-info-cache-v1.boltdb
skopeo copy --dest-compress --dest-compress-format zstd:chunked oci:"$work/in":ref oci:"$work/out":ref
version=$(dpkg-query -W -f '${Version}' skopeo)
# Debian builds against its own packages; Built-Using names the exact library versions.
libs=$(dpkg-query -W -f '${Built-Using}' skopeo | tr ',' '\n' |
	grep -E 'github-containers-(image|storage) |klauspost-compress ' | sed 's/^ *golang-github-//' | tr '\n' ',' | sed 's/,$//; s/,/, /g')
go run ./cmd/fromoci "$work/out" ref ../fixtures/zstdchunked-legacy \
"Debian 12 skopeo $version ($(skopeo --version); built with $libs), via chunked/testdata/gen/legacy.sh:
skopeo copy --dest-compress --dest-compress-format zstd:chunked oci:IN:ref oci:OUT:ref (IN = uncompressed reference tar layer, default compression level)
"
