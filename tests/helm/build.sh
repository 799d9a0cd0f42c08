#!/usr/bin/env bash
# Build (or find in the cache) the helm binary the chart tests use, from the
# wrapper module beside this script (go.sum committed), with this machine's
# Go, like the control plane. Prints the binary's path.
#   tests/helm/build.sh
# NODEKEEPER_HELM_BIN names a ready helm binary instead.
set -euo pipefail

HELM_VERSION=v4.3.1 # keep in step with go.mod
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
# Bump the suffix when the way helm is built changes.
dir=$cache_root/bin/helm-${HELM_VERSION}_r1

die() { echo "helm: error: $*" >&2; exit 1; }

if [[ -n ${NODEKEEPER_HELM_BIN:-} ]]; then
  [[ -x $NODEKEEPER_HELM_BIN ]] || die "NODEKEEPER_HELM_BIN=$NODEKEEPER_HELM_BIN is not an executable"
  echo "$NODEKEEPER_HELM_BIN"
  exit 0
fi
if [[ -x $dir/helm && -f $dir/.complete ]]; then
  echo "$dir/helm"
  exit 0
fi
command -v go >/dev/null || die "Go is needed to build helm (or set NODEKEEPER_HELM_BIN)"
export GOTOOLCHAIN=local GOSUMDB=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$dir"
start=$SECONDS
echo "helm: building helm $HELM_VERSION into $dir (first run on this machine; later runs reuse it)" >&2
(cd "$here" && go build -mod=readonly -trimpath \
  -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  -o "$dir/helm" helm.sh/helm/v4/cmd/helm) >&2 || die "building helm failed (see the go output above)"
touch "$dir/.complete"
echo "helm: built in $((SECONDS - start)) s" >&2
echo "$dir/helm"
