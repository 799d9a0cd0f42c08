#!/usr/bin/env bash
# Builds nodekeeper's images as OCI image archives (an OCI image layout in a
# tar, what `podman load`, `skopeo copy oci-archive:…`, `ctr images import`
# and k3s's agent/images folder read) with nothing but tar, gzip and
# sha256sum: no container daemon, no root, byte-for-byte reproducible.
#
#   image/oci-archive.sh BINARY OUT_DIR
#
# writes into OUT_DIR:
#   nodekeeper-VERSION.oci.tar                  the FROM-scratch image of
#                                               image/Containerfile: /nodekeeper,
#                                               the CA bundle, user 65532
#   nodekeeper-talos-extension-VERSION.oci.tar  the Talos system extension:
#                                               /manifest.yaml and /rootfs/…
#   context/                                    the Containerfile's build
#                                               context, for buildah or docker
# The Talos layout comes from the binary itself (`manifests --for talos`), so
# it is the one the drift test checks.
set -euo pipefail

bin=${1:?usage: image/oci-archive.sh BINARY OUT_DIR}
out=${2:?usage: image/oci-archive.sh BINARY OUT_DIR}
ca=${NODEKEEPER_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[[ -x $bin ]] || { echo "oci-archive: $bin is not an executable" >&2; exit 1; }
[[ -r $ca ]] || { echo "oci-archive: no CA bundle at $ca (install ca-certificates or set NODEKEEPER_CA_BUNDLE)" >&2; exit 1; }
version=$("$bin" version | awk '{print $2}')
[[ -n $version ]] || { echo "oci-archive: '$bin version' printed no version" >&2; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Deterministic tar: sorted names, epoch mtimes, root ownership.
dtar() { tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u+rwX,go+rX,go-w --format=gnu "$@"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# blob FILE: store FILE in the layout's blob folder, print its digest.
blob() {
  local d
  d=$(sha "$1")
  cp "$1" "$layout/blobs/sha256/$d"
  echo "$d"
}

# image NAME REF ROOTFS CONFIG_JSON_FRAGMENT ARCHIVE
image() {
  local name=$1 ref=$2 root=$3 config=$4 archive=$5
  layout="$work/$name-layout"
  mkdir -p "$layout/blobs/sha256"
  (cd "$root" && dtar -cf "$work/$name-layer.tar" -- *)
  local diff_id layer_digest config_digest manifest_digest
  diff_id=$(sha "$work/$name-layer.tar")
  gzip -n -6 -c "$work/$name-layer.tar" >"$work/$name-layer.tar.gz"
  layer_digest=$(blob "$work/$name-layer.tar.gz")
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"image/oci-archive.sh"}]}' \
    "$config" "$diff_id" >"$work/$name-config.json"
  config_digest=$(blob "$work/$name-config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{"org.opencontainers.image.version":"%s","org.opencontainers.image.title":"%s"}}' \
    "$config_digest" "$(size "$work/$name-config.json")" "$layer_digest" "$(size "$work/$name-layer.tar.gz")" "$version" "$name" \
    >"$work/$name-manifest.json"
  manifest_digest=$(blob "$work/$name-manifest.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"%s","io.containerd.image.name":"%s"}}]}' \
    "$manifest_digest" "$(size "$work/$name-manifest.json")" "$ref" "$ref" >"$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  (cd "$layout" && dtar -cf "$archive" oci-layout index.json blobs)
  echo "oci-archive: $archive ($ref, $(size "$archive") bytes)" >&2
}

# The agent image: exactly what image/Containerfile describes.
ctx="$out/context"
rm -rf "$ctx"
mkdir -p "$ctx"
install -m 0755 "$bin" "$ctx/nodekeeper"
install -m 0644 "$ca" "$ctx/ca-certificates.crt"
root="$work/agent-root"
mkdir -p "$root/etc/ssl/certs"
install -m 0755 "$bin" "$root/nodekeeper"
install -m 0644 "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
image nodekeeper "localhost/nodekeeper:$version" "$root" \
  '{"User":"65532:65532","Entrypoint":["/nodekeeper"],"Cmd":["run"],"Env":["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]}' \
  "$out/nodekeeper-$version.oci.tar"

# The Talos system extension: manifest.yaml and rootfs/, the binary at the
# extension service's root (/usr/local/lib/containers/<name>/).
ext="$work/talos-root"
"$bin" manifests --for talos --out "$ext" 2>/dev/null
rm "$ext/extension-service-config.yaml" # machine config, not part of the image
install -D -m 0755 "$bin" "$ext/rootfs/usr/local/lib/containers/nodekeeper/nodekeeper"
image nodekeeper-talos-extension "localhost/nodekeeper-talos-extension:$version" "$ext" '{}' \
  "$out/nodekeeper-talos-extension-$version.oci.tar"
