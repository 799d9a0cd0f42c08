#!/usr/bin/env bash
# The test OS image: a Debian bookworm root file system that boots with
# systemd as PID 1 (tests/osimage/machine.sh boots copies of it under
# systemd-nspawn as Kubernetes nodes), built the way an image builder would
# bake a node image: Debian's systemd, containerd, runc and CNI plugins, the
# test build's kubelet, the sandbox image, and nodekeeper installed from its
# Debian package (image/deb.sh, `dpkg -i` inside the image being built: its
# postinst enables nodekeeper.service and starts nothing).
#
#   tests/osimage/image.sh build   build (or find in the cache) the image, print
#                                  its root file system's folder
#   tests/osimage/image.sh key     print the cache key (what `build` would use)
#   tests/osimage/image.sh customize ROOT
#                                  (mmdebstrap's hook, internal) the recipe
#                                  applied on top of Debian's packages
#
# The image is generic: no node name, credentials or ports. What differs per
# machine (the kubelet's kubeconfig, ports and taints, the pod network, the
# host kubeconfig of nodekeeper, the unit's metrics port and profile, as
# drop-ins) machine.sh writes into each machine's own copy before it boots.
#
# Cache: ${NODEKEEPER_CACHE_DIR:-~/.cache/nodekeeper}/osimage/<key>/rootfs,
# key = hash of this script, its image/ files, the package list, the apt sources,
# the kubelet, the nodekeeper binary, the sandbox image archive and
# image/deb.sh. A finished image is never changed
# (machines use it as the read-only lower layer of an overlay).
#
# Needs root, mmdebstrap (Debian package; installed with apt-get when
# missing) and what tests/realnode/pause-image.sh and
# `tests/controlplane/cluster.sh build-kubelet` need.
#
# Environment: NODEKEEPER_OSIMAGE_NODEKEEPER (the nodekeeper static binary,
# default target/x86_64-unknown-linux-musl/release/nodekeeper),
# NODEKEEPER_OSIMAGE_SOURCES (apt source files, space-separated, default
# this host's own: /etc/apt/sources.list and /etc/apt/sources.list.d/*.sources
# or *.list; mmdebstrap pastes each into the image's apt sources),
# NODEKEEPER_KUBELET_BIN (a folder with a ready kubelet, as node.sh),
# NODEKEEPER_CACHE_DIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
nodekeeper_bin=${NODEKEEPER_OSIMAGE_NODEKEEPER:-$repo/target/x86_64-unknown-linux-musl/release/nodekeeper}
# The Debian archive this host installs from: its own apt sources.
if [[ -n ${NODEKEEPER_OSIMAGE_SOURCES:-} ]]; then
  read -r -a sources <<<"$NODEKEEPER_OSIMAGE_SOURCES"
else
  sources=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [[ -s $f ]] && sources+=("$f")
  done
fi
suite=bookworm
# Debian packages of the image. systemd-sysv: /sbin/init is systemd.
# containernetworking-plugins: the same CNI plugins (bridge, host-local,
# loopback) the realnode nodes unpack from the same package.
# init-system-helpers: what nodekeeper's package depends on.
packages=(systemd systemd-sysv dbus iproute2 containerd runc containernetworking-plugins
  procps util-linux mount kmod init-system-helpers)

log() { echo "osimage: $*" >&2; }
die() { echo "osimage: error: $*" >&2; exit 1; }

# The inputs, resolved: kubelet, sandbox image archive.
resolve_inputs() {
  [[ -x $nodekeeper_bin ]] || die "no nodekeeper binary at $nodekeeper_bin (set NODEKEEPER_OSIMAGE_NODEKEEPER)"
  ((${#sources[@]})) || die "no apt sources on this host (set NODEKEEPER_OSIMAGE_SOURCES)"
  local bins
  if [[ -n ${NODEKEEPER_KUBELET_BIN:-} ]]; then
    bins=$NODEKEEPER_KUBELET_BIN
  else
    bins=$("$repo/tests/controlplane/cluster.sh" build-kubelet) || die "cluster.sh build-kubelet failed"
  fi
  kubelet=$bins/kubelet
  [[ -x $kubelet ]] || die "no kubelet at $kubelet"
  pause_archive=$("$repo/tests/realnode/pause-image.sh") || die "tests/realnode/pause-image.sh failed"
}

compute_key() {
  {
    echo "suite=$suite packages=${packages[*]}"
    cat "${sources[@]}"
    sha256sum "$here/image.sh" "$here"/image/* "$repo/image/deb.sh" |
      sed "s#  $repo/#  #"
    sha256sum "$kubelet" "$nodekeeper_bin" "$pause_archive" | cut -d' ' -f1
  } | sha256sum | cut -c1-16
}

cmd_build() {
  [[ $(id -u) == 0 ]] || die "building the image needs root (mmdebstrap, file ownership)"
  resolve_inputs
  local key out
  key=$(compute_key)
  out=$cache_root/osimage/$key
  if [[ -f $out/done ]]; then
    echo "$out/rootfs"
    return
  fi
  if ! command -v mmdebstrap >/dev/null || ! command -v systemd-nspawn >/dev/null; then
    log "installing mmdebstrap and systemd-container"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap systemd-container >/dev/null ||
      die "apt-get install mmdebstrap systemd-container failed"
  fi
  local start=$SECONDS
  mkdir -p "$cache_root/osimage"
  local tmp=$out.tmp
  rm -rf --one-file-system "$tmp"
  mkdir -p "$tmp/deb"
  # nodekeeper's Debian package of the binary baked in, as `just deb`
  # builds it.
  local deb
  deb=$("$repo/image/deb.sh" "$tmp/deb" "$nodekeeper_bin") || die "image/deb.sh failed"

  log "building the image $key (mmdebstrap $suite: ${packages[*]})"
  # --variant=minbase: only Essential packages plus what --include names.
  # The hook runs on the host with the root file system as its argument:
  # `image.sh customize ROOT` copies in what does not come from Debian, as an
  # image builder's recipe would; its inputs come through the environment.
  local inc
  inc=$(IFS=,; echo "${packages[*]}")
  NK_KUBELET=$kubelet NK_DEB=$deb NK_PAUSE=$pause_archive \
    mmdebstrap --quiet --variant=minbase --include="$inc" \
    --customize-hook="'$here/image.sh' customize \"\$1\"" \
    "$suite" "$tmp/rootfs" "${sources[@]}" >&2 ||
    die "mmdebstrap failed"
  rm -rf "$tmp/deb"
  {
    echo "key $key"
    echo "built $(date -u +%FT%TZ) in $((SECONDS - start)) s"
    echo "kubelet $kubelet"
    echo "nodekeeper $nodekeeper_bin $(sha256sum "$nodekeeper_bin" | cut -d' ' -f1)"
    echo "pause $pause_archive"
    echo "packages ${packages[*]}"
    echo "size $(du -sm "$tmp/rootfs" | cut -f1) MB"
  } >"$tmp/info"
  touch "$tmp/done"
  rm -rf --one-file-system "$out"
  mv "$tmp" "$out"
  log "built $out/rootfs in $((SECONDS - start)) s ($(du -sm "$out/rootfs" | cut -f1) MB)"
  echo "$out/rootfs"
}

# The image builder's recipe on top of Debian's packages (mmdebstrap's
# customize hook, see cmd_build): binaries, units, configuration, enabled
# units. No node-specific file here.
cmd_customize() {
  local root=${1:?usage: image.sh customize ROOT}
  install -m 0755 "$NK_KUBELET" "$root/usr/local/bin/kubelet"
  # nodekeeper from its package, as a platform team bakes it: dpkg in the
  # image being built (no systemd runs: the postinst enables, never starts).
  install -m 0644 "$NK_DEB" "$root/var/tmp/nodekeeper.deb"
  chroot "$root" dpkg -i /var/tmp/nodekeeper.deb >&2 || die "dpkg -i nodekeeper.deb in the image failed"
  rm -f "$root/var/tmp/nodekeeper.deb"
  install -D -m 0644 "$NK_PAUSE" "$root/usr/local/share/nodekeeper/pause.oci.tar"
  install -D -m 0644 "$here/image/containerd-config.toml" "$root/etc/containerd/config.toml"
  install -D -m 0644 "$here/image/kubelet.yaml" "$root/etc/kubernetes/kubelet.yaml"
  mkdir -p "$root/etc/kubernetes/manifests" "$root/etc/kubernetes/kubelet.conf.d" \
    "$root/etc/kubernetes/pki" "$root/etc/cni/net.d"
  local u
  for u in kubelet pause-image nk-cgroup-rw; do
    install -m 0644 "$here/image/$u.service" "$root/etc/systemd/system/"
  done
  install -D -m 0755 "$here/image/nk-cgroup-rw" "$root/usr/local/libexec/nk-cgroup-rw"
  chroot "$root" systemctl enable -q kubelet.service pause-image.service \
    nk-cgroup-rw.service containerd.service
  # A persistent journal (Debian keeps it in /run unless this folder
  # exists): the boot before a reboot stays readable (`journalctl -b -1`).
  mkdir -p "$root/var/log/journal"
  # No consoles to log in on; no network manager to wait for (host network).
  chroot "$root" systemctl mask -q getty@tty1.service console-getty.service systemd-networkd-wait-online.service
  # Each machine gets its host name from nspawn (its name) and a machine ID
  # at its first boot.
  rm -f "$root/etc/hostname" "$root/etc/machine-id"
  touch "$root/etc/machine-id"
}

case ${1:-} in
  build) cmd_build ;;
  customize) shift; cmd_customize "$@" ;;
  key) resolve_inputs; compute_key ;;
  *) die "usage: $0 build|key" ;;
esac
