#!/usr/bin/env bash
# Builds nodekeeper's images as OCI image archives (an OCI image layout in a
# tar, what `podman load`, `skopeo copy oci-archive:…`, `ctr images import`
# and k3s's agent/images folder read) with nothing but tar, gzip and
# sha256sum: no container daemon, no root, byte-for-byte reproducible.
#
#   image/oci-archive.sh BINARY OUT_DIR [ARM64_BINARY]
#
# BINARY is the amd64 build; with ARM64_BINARY each archive holds an image
# index of two platform manifests (linux/amd64 and linux/arm64), which
# runtimes resolve to their own platform. Writes into OUT_DIR:
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

bin=${1:?usage: image/oci-archive.sh BINARY OUT_DIR [ARM64_BINARY]}
out=${2:?usage: image/oci-archive.sh BINARY OUT_DIR [ARM64_BINARY]}
arm64_bin=${3:-}
[[ -z $arm64_bin || -f $arm64_bin ]] || { echo "oci-archive: $arm64_bin is not a file" >&2; exit 1; }
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

# manifest NAME ARCH ROOTFS CONFIG_JSON_FRAGMENT: one platform's layer,
# config and manifest into the layout; prints the manifest's descriptor.
manifest() {
  local name=$1 arch=$2 root=$3 config=$4 tag="$1-$2"
  (cd "$root" && dtar -cf "$work/$tag-layer.tar" -- *)
  local diff_id layer_digest config_digest manifest_digest
  diff_id=$(sha "$work/$tag-layer.tar")
  gzip -n -6 -c "$work/$tag-layer.tar" >"$work/$tag-layer.tar.gz"
  layer_digest=$(blob "$work/$tag-layer.tar.gz")
  printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"image/oci-archive.sh"}]}' \
    "$arch" "$config" "$diff_id" >"$work/$tag-config.json"
  config_digest=$(blob "$work/$tag-config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{"org.opencontainers.image.version":"%s","org.opencontainers.image.title":"%s"}}' \
    "$config_digest" "$(size "$work/$tag-config.json")" "$layer_digest" "$(size "$work/$tag-layer.tar.gz")" "$version" "$name" \
    >"$work/$tag-manifest.json"
  manifest_digest=$(blob "$work/$tag-manifest.json")
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"}' \
    "$manifest_digest" "$(size "$work/$tag-manifest.json")" "$arch"
}

# image NAME REF CONFIG_JSON_FRAGMENT ARCHIVE ARCH=ROOTFS...: the archive,
# its index.json naming REF: the one platform's manifest, or a nested image
# index of every platform's (what multi-platform registries serve).
image() {
  local name=$1 ref=$2 config=$3 archive=$4
  shift 4
  layout="$work/$name-layout"
  mkdir -p "$layout/blobs/sha256"
  local entries=() pair top
  for pair in "$@"; do
    entries+=("$(manifest "$name" "${pair%%=*}" "${pair#*=}" "$config")}")
  done
  local named
  named=$(printf '"annotations":{"org.opencontainers.image.ref.name":"%s","io.containerd.image.name":"%s"}' "$ref" "$ref")
  if ((${#entries[@]} == 1)); then
    top="${entries[0]%\}},$named}"
  else
    local joined
    joined=$(IFS=,; echo "${entries[*]}")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
      "$joined" >"$work/$name-index.json"
    top=$(printf '{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%s,%s}' \
      "$(blob "$work/$name-index.json")" "$(size "$work/$name-index.json")" "$named")
  fi
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "$top" >"$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  (cd "$layout" && dtar -cf "$archive" oci-layout index.json blobs)
  local arches=()
  for pair in "$@"; do arches+=("linux/${pair%%=*}"); done
  echo "oci-archive: $archive ($ref, ${arches[*]}, $(size "$archive") bytes)" >&2
}

# The agent image: exactly what image/Containerfile describes.
ctx="$out/context"
rm -rf "$ctx"
mkdir -p "$ctx"
install -m 0755 "$bin" "$ctx/nodekeeper"
install -m 0644 "$ca" "$ctx/ca-certificates.crt"
# One root per platform, each with its binary.
platforms=("amd64=$bin")
[[ -z $arm64_bin ]] || platforms+=("arm64=$arm64_bin")
agent_roots=() ext_roots=()
for p in "${platforms[@]}"; do
  arch=${p%%=*} b=${p#*=}
  root="$work/agent-root-$arch"
  mkdir -p "$root/etc/ssl/certs"
  install -m 0755 "$b" "$root/nodekeeper"
  install -m 0644 "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
  agent_roots+=("$arch=$root")
done
image nodekeeper "localhost/nodekeeper:$version" \
  '{"User":"65532:65532","Entrypoint":["/nodekeeper"],"Cmd":["run"],"Env":["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]}' \
  "$out/nodekeeper-$version.oci.tar" "${agent_roots[@]}"

# The Talos system extension: manifest.yaml and rootfs/, the binary at the
# extension service's root (/usr/local/lib/containers/<name>/).
for p in "${platforms[@]}"; do
  arch=${p%%=*} b=${p#*=}
  ext="$work/talos-root-$arch"
  "$bin" manifests --for talos --out "$ext" 2>/dev/null
  rm "$ext/extension-service-config.yaml" # machine config, not part of the image
  install -D -m 0755 "$b" "$ext/rootfs/usr/local/lib/containers/nodekeeper/nodekeeper"
  ext_roots+=("$arch=$ext")
done
image nodekeeper-talos-extension "localhost/nodekeeper-talos-extension:$version" '{}' \
  "$out/nodekeeper-talos-extension-$version.oci.tar" "${ext_roots[@]}"
