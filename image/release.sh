#!/usr/bin/env bash
# Builds the release folder from the static binaries: everything an
# operator installs from, each file once, with its checksum and a bill of
# materials.
#
#   image/release.sh OUT_DIR AMD64_BINARY ARM64_BINARY
#
# OUT_DIR (target/release-dist/ for `just release`) is emptied first; it
# must be absent, empty or an earlier release folder (one with SHA256SUMS).
# Written into it, VERSION being the binaries':
#   nodekeeper-VERSION-linux-amd64, -linux-arm64       the static binaries
#   nodekeeper-VERSION.oci.tar                         the agent image, both
#                                                      platforms (image/oci-archive.sh)
#   nodekeeper-talos-extension-VERSION.oci.tar         the Talos system extension
#   nodekeeper_VERSION_amd64.deb, _arm64.deb           image/deb.sh
#   nodekeeper-VERSION-x86-64.raw, -arm64.raw          systemd-sysext images (image/sysext.sh)
#   nodekeeper-chart-VERSION.tgz                       the Helm chart, `helm package`
#   nodekeeper-k3s-manifests-VERSION.tar.gz            k3s-manifests/, for k3s's
#                                                      auto-deploy folder or kubectl apply -R
#   nodekeeper-VERSION-linux-amd64.cdx.json, -arm64    the SBOMs: CycloneDX 1.5,
#                                                      one per binary
#   SHA256SUMS                                         what `sha256sum -c` reads
#   SHA256SUMS.sig                                     only with a signing key (below)
#
# Reproducible: the same binaries and commit give the same bytes from any
# folder. Every timestamp is SOURCE_DATE_EPOCH (default: the commit's time;
# set it when building outside a git checkout); the SBOMs' own time, serial
# number and source path are set from it and from their content.
#
# The SBOMs come from cargo-cyclonedx (crates.io; the CycloneDX project's
# own generator for Cargo): it reads Cargo.lock through `cargo metadata`
# for one target triple, so each SBOM lists what that binary's build
# resolves (no Windows-only crates, no build scripts' dependencies), with
# each crate's licence, checksum and purl. Debian packages no SBOM
# generator for Cargo. Found at $NODEKEEPER_CYCLONEDX_BIN, on PATH, or
# where tests/install-prereqs installs it. helm: $NODEKEEPER_HELM_BIN, on
# PATH, or the test cluster's (tests/upstream/build.sh helm, built with Go
# on first use).
#
# Signed when NODEKEEPER_RELEASE_SIGNING_KEY names an OpenSSH key: a
# private key without a passphrase, or the public key of one ssh-agent
# holds. `ssh-keygen -Y sign` (OpenSSH's own file signatures, namespace
# "file") signs SHA256SUMS, which covers every other file; an Ed25519
# signature has no time or randomness in it, so a signed folder is
# reproducible too. Verified with `ssh-keygen -Y verify` against the
# publisher's key, obtained some other way than the folder.
set -euo pipefail

usage="usage: image/release.sh OUT_DIR AMD64_BINARY ARM64_BINARY"
out=${1:?$usage}
amd64_bin=${2:?$usage}
arm64_bin=${3:?$usage}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
die() { echo "release: $*" >&2; exit 1; }
for b in "$amd64_bin" "$arm64_bin"; do
  [[ -x $b ]] || die "$b is not an executable"
done
version=$("$amd64_bin" version | awk '{print $2}')
[[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || die "no usable version from '$amd64_bin version': $version"
# The arm64 binary runs only under qemu-user here: its version is not asked.
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
  SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null) ||
    die "no SOURCE_DATE_EPOCH and no git commit to take it from"
fi
export SOURCE_DATE_EPOCH
[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH is not a number of seconds: $SOURCE_DATE_EPOCH"

cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
cyclonedx_version=0.5.9 # tests/install-prereqs installs this one
cyclonedx=${NODEKEEPER_CYCLONEDX_BIN:-$(command -v cargo-cyclonedx ||
  echo "$cache_root/tools/cargo-cyclonedx-$cyclonedx_version/bin/cargo-cyclonedx")}
[[ -x $cyclonedx ]] ||
  die "cargo-cyclonedx is missing (the SBOMs): cargo install --locked cargo-cyclonedx@$cyclonedx_version, or tests/install-prereqs"
helm=${NODEKEEPER_HELM_BIN:-$(command -v helm || "$repo/tests/upstream/build.sh" helm)}
[[ -x $helm ]] || die "no helm (packages the chart): put it on PATH or set NODEKEEPER_HELM_BIN"

signing_key=${NODEKEEPER_RELEASE_SIGNING_KEY:-}
if [[ -n $signing_key ]]; then
  [[ -r $signing_key ]] || die "NODEKEEPER_RELEASE_SIGNING_KEY=$signing_key: no such readable key file"
  command -v ssh-keygen >/dev/null || die "ssh-keygen (OpenSSH) is missing: it signs SHA256SUMS"
fi

if [[ -e $out ]]; then
  [[ -d $out ]] || die "$out is not a folder"
  [[ -z $(ls -A "$out") || -f $out/SHA256SUMS ]] ||
    die "$out holds files and is no release folder (no SHA256SUMS): refusing to empty it"
  rm -rf "$out"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { echo "release: $*" >&2; }

install -m 0755 "$amd64_bin" "$out/nodekeeper-$version-linux-amd64"
install -m 0755 "$arm64_bin" "$out/nodekeeper-$version-linux-arm64"

say "image archives"
"$here/oci-archive.sh" "$amd64_bin" "$work/image" "$arm64_bin" 2>/dev/null
mv "$work/image/nodekeeper-$version.oci.tar" "$work/image/nodekeeper-talos-extension-$version.oci.tar" "$out/"

say "Debian packages and system extensions"
"$here/deb.sh" "$out" "$amd64_bin" "$arm64_bin" >/dev/null
"$here/sysext.sh" "$out" "$amd64_bin" "$arm64_bin" >/dev/null

say "Helm chart"
# helm stamps every file of the archive with SOURCE_DATE_EPOCH. Its cache
# and configuration go to the work folder: packaging reads no repository.
HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data" \
  "$helm" package "$repo/image/helm" --destination "$work/chart" >/dev/null
mv "$work/chart/nodekeeper-$version.tgz" "$out/nodekeeper-chart-$version.tgz"

say "k3s folder"
# Sorted names, one time, root's: the same tar from any checkout.
tar -C "$repo" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  --mode=u+rwX,go+rX,go-w --format=gnu -cf - k3s-manifests | gzip -n -9 >"$out/nodekeeper-k3s-manifests-$version.tar.gz"

say "SBOMs"
# sbom ARCH RUST_TARGET: cargo-cyclonedx writes beside Cargo.toml, under a
# name of this run's; the copy in OUT_DIR has the release's time, a serial
# number derived from its content and no path of this checkout.
sbom() {
  local arch=$1 target=$2 name=".release-sbom-$$-$1"
  (cd "$repo" && CARGO_NET_OFFLINE=true "$cyclonedx" cyclonedx --format json --spec-version 1.5 \
    --target "$target" --no-build-deps --override-filename "$name" -q) ||
    { rm -f "$repo/$name.json"; die "cargo-cyclonedx failed for $target"; }
  python3 - "$repo/$name.json" "$out/nodekeeper-$version-linux-$arch.cdx.json" "$repo" <<'EOF' || { rm -f "$repo/$name.json"; die "the SBOM of $target: unexpected shape"; }
import datetime, hashlib, json, os, sys, uuid
src, dst, repo = sys.argv[1:]
text = open(src).read().replace("path+file://" + repo + "#", "path+file:///nodekeeper#")
bom = json.loads(text)
stamp = datetime.datetime.fromtimestamp(int(os.environ["SOURCE_DATE_EPOCH"]), datetime.timezone.utc)
bom["metadata"]["timestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
bom.pop("serialNumber", None)
body = json.dumps(bom, sort_keys=True, indent=2)
digest = hashlib.sha256(body.encode()).hexdigest()
bom["serialNumber"] = uuid.uuid5(uuid.NAMESPACE_URL, "nodekeeper-sbom:" + digest).urn
with open(dst, "w") as f:
    f.write(json.dumps(bom, sort_keys=True, indent=2) + "\n")
EOF
  rm -f "$repo/$name.json"
}
sbom amd64 x86_64-unknown-linux-musl
sbom arm64 aarch64-unknown-linux-musl

(cd "$out" && LC_ALL=C ls | grep -vx SHA256SUMS | xargs sha256sum >"$work/SHA256SUMS")
mv "$work/SHA256SUMS" "$out/SHA256SUMS"
if [[ -n $signing_key ]]; then
  # -q: the key's comment is not printed; a failure still says why.
  ssh-keygen -q -Y sign -f "$signing_key" -n file "$out/SHA256SUMS" </dev/null ||
    die "ssh-keygen could not sign SHA256SUMS with $signing_key (a passphrase? load the key into ssh-agent and name its .pub)"
fi
chmod 0644 "$out"/*
chmod 0755 "$out"/nodekeeper-"$version"-linux-*64
(cd "$out" && LC_ALL=C ls -l --time-style=+ | awk 'NR > 1 {printf "release: %10d  %s\n", $5, $NF}') >&2
echo "$out"
