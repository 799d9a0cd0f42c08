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

tool=sysext needs=mksquashfs needs_package=squashfs-tools
# shellcheck source=image/package-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/package-common.sh"

# image ARCH(systemd's name) BINARY
image() {
  local arch=$1 bin=$2 name="nodekeeper-$version-$1" root="$work/$1"
  mkdir -p "$root/files" "$root/usr/bin" "$root/usr/lib/extension-release.d" \
    "$root/usr/lib/systemd/system/multi-user.target.wants"
  package_files "$root/files"
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
