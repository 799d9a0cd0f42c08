#!/usr/bin/env bash
# Builds the sandbox ("pause") image of the real test nodes as an OCI image
# archive, the way image/oci-archive.sh builds nodekeeper's: tar, gzip and
# sha256sum, no container daemon. The program is tests/realnode/pause.c,
# linked with `musl-gcc -static` (musl-tools, from tests/install-prereqs).
#
#   tests/realnode/pause-image.sh     build (or find in the cache), print the archive's path
#
# The archive is cached under a key made of the source's hash:
#   ~/.cache/nodekeeper/pause/<hash>/pause.oci.tar   image localhost/pause:nodekeeper
# and imports with `ctr -n k8s.io images import` (tests/realnode/node.sh does).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
ref=${NODEKEEPER_PAUSE_IMAGE:-localhost/pause:nodekeeper}
src=$here/pause.c
key=$(cat "$src" <(echo "$ref r1") | sha256sum | cut -c1-16)
out=$cache_root/pause/$key
archive=$out/pause.oci.tar

if [[ -f $archive ]]; then
  echo "$archive"
  exit 0
fi
command -v musl-gcc >/dev/null || { echo "pause-image: musl-gcc is needed (run tests/install-prereqs)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root" "$work/layout/blobs/sha256"
musl-gcc -static -Os -s -Wall -Wextra -o "$work/root/pause" "$src"

# Deterministic tar: sorted names, epoch mtimes, root ownership.
dtar() { tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u+rwX,go+rX,go-w --format=gnu "$@"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
blob() {
  local d
  d=$(sha "$1")
  cp "$1" "$work/layout/blobs/sha256/$d"
  echo "$d"
}

(cd "$work/root" && dtar -cf "$work/layer.tar" pause)
diff_id=$(sha "$work/layer.tar")
gzip -n -6 -c "$work/layer.tar" >"$work/layer.tar.gz"
layer=$(blob "$work/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"User":"65535:65535","Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"tests/realnode/pause-image.sh"}]}' \
  "$diff_id" >"$work/config.json"
config=$(blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
  "$config" "$(size "$work/config.json")" "$layer" "$(size "$work/layer.tar.gz")" >"$work/manifest.json"
manifest=$(blob "$work/manifest.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"%s","io.containerd.image.name":"%s"}}]}' \
  "$manifest" "$(size "$work/manifest.json")" "$ref" "$ref" >"$work/layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
mkdir -p "$out"
(cd "$work/layout" && dtar -cf "$work/pause.oci.tar" oci-layout index.json blobs)
mv "$work/pause.oci.tar" "$archive"
echo "pause-image: $archive ($ref, $(size "$archive") bytes)" >&2
echo "$archive"
