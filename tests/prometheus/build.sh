#!/usr/bin/env bash
# Build (or find in the cache) Prometheus and promtool for the monitoring
# tests, from the wrapper module beside this script (go.sum committed), with
# this machine's Go, like the control plane. Service discovery other than
# static and file targets is left out (-tags remove_all_sd): 179 modules
# instead of 242, and no cloud SDKs to compile. The web UI's assets are not
# in the module; the API works without them. Prints the binaries' folder.
#   tests/prometheus/build.sh
# NODEKEEPER_PROMETHEUS_BIN names a folder holding `prometheus` and `promtool`.
set -euo pipefail

PROMETHEUS_VERSION=3.16.0 # Go module version v0.316.0; keep in step with go.mod
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
# Bump the suffix when the way it is built changes.
dir=$cache_root/bin/prometheus-${PROMETHEUS_VERSION}_r1

die() { echo "prometheus: error: $*" >&2; exit 1; }

if [[ -n ${NODEKEEPER_PROMETHEUS_BIN:-} ]]; then
  for b in prometheus promtool; do
    [[ -x $NODEKEEPER_PROMETHEUS_BIN/$b ]] || die "NODEKEEPER_PROMETHEUS_BIN=$NODEKEEPER_PROMETHEUS_BIN has no executable '$b'"
  done
  echo "$NODEKEEPER_PROMETHEUS_BIN"
  exit 0
fi
if [[ -f $dir/.complete ]]; then
  echo "$dir"
  exit 0
fi
command -v go >/dev/null || die "Go is needed to build Prometheus (or set NODEKEEPER_PROMETHEUS_BIN)"
export GOTOOLCHAIN=local GOSUMDB=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$dir"
start=$SECONDS
echo "prometheus: building Prometheus $PROMETHEUS_VERSION and promtool into $dir (first run on this machine; later runs reuse it)" >&2
v=github.com/prometheus/common/version
(cd "$here" && go build -mod=readonly -trimpath -tags remove_all_sd \
  -ldflags="-s -w -X $v.Version=$PROMETHEUS_VERSION -X $v.Revision=v0.316.0 -X $v.Branch=HEAD" \
  -o "$dir/" github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool) >&2 ||
  die "building Prometheus failed (see the go output above)"
touch "$dir/.complete"
echo "prometheus: built in $((SECONDS - start)) s" >&2
echo "$dir"
