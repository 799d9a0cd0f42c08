# Sourced by image/deb.sh and image/sysext.sh: what both do first. Set
# before sourcing: `tool` (the script's name, for messages), `needs` (the
# command it cannot do without) and `needs_package` (its Debian package).
# Reads the arguments OUT_DIR AMD64_BINARY [ARM64_BINARY] into out,
# amd64_bin and arm64_bin; sets here, repo, version (the amd64 binary's, or
# $version_override when set), SOURCE_DATE_EPOCH (default: the commit's
# time: every timestamp of what the script builds) and work (a folder
# removed on exit); defines `package_files DIR` (`nodekeeper manifests
# --for package`, from the amd64 binary, into DIR).

usage="usage: image/$tool.sh OUT_DIR AMD64_BINARY [ARM64_BINARY]"
out=${1:?$usage}
amd64_bin=${2:?$usage}
arm64_bin=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
for b in "$amd64_bin" ${arm64_bin:+"$arm64_bin"}; do
  [[ -x $b ]] || { echo "$tool: $b is not an executable" >&2; exit 1; }
done
command -v "$needs" >/dev/null || { echo "$tool: $needs is missing (Debian's $needs_package)" >&2; exit 1; }
version=${version_override:-$("$amd64_bin" version | awk '{print $2}')}
[[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || { echo "$tool: no usable version from '$amd64_bin version': $version" >&2; exit 1; }
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

package_files() {
  local said
  said=$("$amd64_bin" manifests --for package --out "$1" 2>&1) || { echo "$said" >&2; exit 1; }
}
