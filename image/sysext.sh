#!/usr/bin/env bash
# Builds nodekeeper's systemd system extension images (systemd-sysext) from
# the static binaries, for immutable hosts that extend /usr (Flatcar, Fedora
# CoreOS, systemd-based appliance images):
#
#   image/sysext.sh OUT_DIR AMD64_BINARY [ARM64_BINARY]
#
# writes OUT_DIR/nodekeeper-VERSION-x86-64.raw (and -arm64.raw): a squashfs
# image holding only /usr:
#   /usr/bin/nodekeeper                         the static binary
#   /usr/lib/systemd/system/nodekeeper.service  maintenance only, as the
#                                               Debian package's
#   /usr/lib/systemd/system/multi-user.target.wants/nodekeeper.service
#                                               an extension cannot enable a
#                                               unit in /etc: merging it is
#                                               enabling it
#   /usr/share/nodekeeper/systemd/*.conf        the reboot and upgrade
#                                               profiles, drop-ins to link into
#                                               /etc/systemd/system/nodekeeper.service.d/
#   /usr/lib/extension-release.d/extension-release.nodekeeper-VERSION-ARCH
#                                               ID=_any (a static binary runs
#                                               on any distribution),
#                                               ARCHITECTURE= the binary's
# systemd-sysext requires the release file to carry the image's name, so the
# image is installed under its own name (/var/lib/extensions/). No env file:
# an extension has no /etc; the unit's settings come from the drop-ins and
# /etc/nodekeeper/nodekeeper.env when the host has one.
#
# The files come from `nodekeeper manifests --for package` (the amd64
# binary); the image is the same bytes from any folder: every time is
# SOURCE_DATE_EPOCH (default: the commit's time). Needs mksquashfs (Debian's
# squashfs-tools).
set -euo pipefail

usage="usage: image/sysext.sh OUT_DIR AMD64_BINARY [ARM64_BINARY]"
out=${1:?$usage}
amd64_bin=${2:?$usage}
arm64_bin=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
for b in "$amd64_bin" ${arm64_bin:+"$arm64_bin"}; do
  [[ -x $b ]] || { echo "sysext: $b is not an executable" >&2; exit 1; }
done
command -v mksquashfs >/dev/null || { echo "sysext: mksquashfs is missing (Debian's squashfs-tools)" >&2; exit 1; }
version=$("$amd64_bin" version | awk '{print $2}')
[[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || { echo "sysext: '$amd64_bin version' gave no version: $version" >&2; exit 1; }
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# image ARCH(systemd's name) BINARY
image() {
  local arch=$1 bin=$2 name="nodekeeper-$version-$1" root="$work/$1"
  mkdir -p "$root/files" "$root/usr/bin" "$root/usr/lib/extension-release.d" \
    "$root/usr/lib/systemd/system/multi-user.target.wants"
  local said
  said=$("$amd64_bin" manifests --for package --out "$root/files" 2>&1) || { echo "$said" >&2; exit 1; }
  cp -r "$root/files/usr/." "$root/usr/"
  rm -rf "$root/files"
  install -m 0755 "$bin" "$root/usr/bin/nodekeeper"
  ln -s ../nodekeeper.service "$root/usr/lib/systemd/system/multi-user.target.wants/nodekeeper.service"
  cat >"$root/usr/lib/extension-release.d/extension-release.$name" <<EOF
ID=_any
ARCHITECTURE=$arch
VERSION_ID=$version
EOF
  chmod -R u+rwX,go+rX,go-w "$root"
  local raw="$out/$name.raw"
  rm -f "$raw"
  # mksquashfs stamps the image and every file with SOURCE_DATE_EPOCH.
  mksquashfs "$root" "$raw" -quiet -noappend -all-root -no-xattrs -comp xz >/dev/null
  echo "$raw"
}

image x86-64 "$amd64_bin"
[[ -z $arm64_bin ]] || image arm64 "$arm64_bin"
