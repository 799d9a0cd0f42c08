#!/usr/bin/env bash
# Build (or find in the cache) every upstream Go program the tests run, from
# the one wrapper module beside this script (go.sum committed), with this
# machine's Go, in one `go build`: the Kubernetes control plane (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok),
# the real nodes' kubelet and kube-proxy, helm for the chart tests, and
# Prometheus and promtool for the monitoring tests.
#
# One module and one build, because the programs share most of their
# libraries: built from four modules, client-go, grpc, OpenTelemetry and the
# rest were compiled once per module at that module's versions (686 s cold
# on 2 cores); here once, and the build schedules every program's packages
# and links together.
#
#   tests/upstream/build.sh [controlplane|kubelet|helm|prometheus|kine|controlplane-vX.Y]
#
# Prints the folder holding everything, or with an argument what that part's
# user needs: the control plane's folder (with kwok.yaml), the kubelet's
# folder, helm's path, Prometheus's folder. A folder (or binary) named in the
# part's variable is used instead, and nothing is built for that part:
#   NODEKEEPER_CONTROLPLANE_BIN  etcd, kube-apiserver, kube-controller-manager,
#                                kube-scheduler, kwok and kubectl
#   NODEKEEPER_KUBELET_BIN       kubelet and kube-proxy
#   NODEKEEPER_HELM_BIN          a helm binary
#   NODEKEEPER_PROMETHEUS_BIN    prometheus and promtool
#   NODEKEEPER_KINE_BIN          a kine binary
#
# controlplane-vX.Y (the version lanes: v1.34, v1.35, v1.36) builds
# kube-apiserver, kube-controller-manager and kube-scheduler of that minor
# from its own module, ./k8s-vX.Y (one module cannot hold two releases of
# k8s.io/kubernetes), into its own folder, beside links to the main
# build's etcd, kwok, kubectl and kwok.yaml.
#
# kine (k3s's datastore: etcd's API over sqlite, for the control plane's
# kine lane) is built from its own module, ./kine, into its own folder,
# only when asked for: it requires newer etcd and grpc than the Kubernetes
# release pins, and in the one module it would change what every other
# program is built from.
set -euo pipefail

K8S_VERSION=v1.37.1
ETCD_VERSION=v3.7.0 # what k8s.io/kubernetes $K8S_VERSION requires
KWOK_VERSION=v0.8.0
KINE_VERSION=v0.17.5 # in kine/go.mod; keep in step with it
HELM_VERSION=v4.3.1
PROMETHEUS_VERSION=3.16.0
PROMETHEUS_MODULE=v0.316.0 # the Go module version of Prometheus $PROMETHEUS_VERSION
# All of them are in go.mod; keep these in step with it.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
# Bump the recipe suffix when the way the binaries are built changes.
dir=$cache_root/bin/upstream-k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_prometheus-${PROMETHEUS_VERSION}_r1

controlplane=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl)
kubelet=(kubelet kube-proxy)

log() { echo "upstream: $*" >&2; }
die() { echo "upstream: error: $*" >&2; exit 1; }

go_env() {
  # The checksum database is out of reach here; the committed go.sum is the
  # source of truth for this module.
  export GOTOOLCHAIN=local GOSUMDB=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
}

# A folder named by a variable must hold what its part needs.
check_folder() {
  local var=$1 folder=$2 b
  shift 2
  for b in "$@"; do
    [[ -x $folder/$b ]] || die "$var=$folder has no executable '$b'"
  done
}

build_all() {
  [[ -f $dir/.complete ]] && return
  command -v go >/dev/null || die "Go is needed to build the test cluster's programs (or name ready ones: see tests/upstream/build.sh)"
  go_env
  mkdir -p "$dir"
  local start=$SECONDS minor=${K8S_VERSION#v1.} pkg stamp="-s -w"
  minor=${minor%%.*}
  # Stamp each release as its own build does, so /version, kubectl, helm
  # and Prometheus report their versions rather than v0.0.0-master. An -X
  # for a package a program does not link is ignored.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  stamp+=" -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
  pkg=github.com/prometheus/common/version
  stamp+=" -X $pkg.Version=$PROMETHEUS_VERSION -X $pkg.Revision=$PROMETHEUS_MODULE -X $pkg.Branch=HEAD"
  log "building Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION and Prometheus $PROMETHEUS_VERSION into $dir (first run on this machine; later runs reuse it)"
  # remove_all_sd: Prometheus without service discovery other than static
  # and file targets (no cloud SDKs to compile); nothing else has the tag.
  # The compiler writes no DWARF (-ldflags -w drops it from the binaries
  # anyway; tracebacks use the pc tables) and collects garbage less often
  # (GOGC=400): helm alone on 2 cores, cold, took 136 s plain, 119 s without
  # DWARF, 110 s with GOGC=400, 101 s with both.
  (cd "$here" && GOGC=400 go build -mod=readonly -trimpath -tags remove_all_sd \
    -gcflags=all=-dwarf=false -ldflags="$stamp" -o "$dir/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy \
    ./etcd \
    sigs.k8s.io/kwok/cmd/kwok \
    helm.sh/helm/v4/cmd/helm \
    github.com/prometheus/prometheus/cmd/prometheus \
    github.com/prometheus/prometheus/cmd/promtool) >&2 ||
    die "building failed (see the go output above)"
  write_kwok_config "$dir/kwok.yaml"
  touch "$dir/.complete"
  log "built in $((SECONDS - start)) s"
}

# kine, pure Go (CGO_ENABLED=0 builds its sqlite driver from
# modernc.org/sqlite, where k3s links the C one).
build_kine() {
  local kdir=$cache_root/bin/kine-${KINE_VERSION}_r1 start=$SECONDS
  if [[ ! -f $kdir/.complete ]]; then
    command -v go >/dev/null || die "Go is needed to build kine (or name a ready one: NODEKEEPER_KINE_BIN)"
    go_env
    mkdir -p "$kdir"
    log "building kine $KINE_VERSION into $kdir (first run on this machine; later runs reuse it)"
    (cd "$here/kine" && GOGC=400 go build -mod=readonly -trimpath -gcflags=all=-dwarf=false \
      -ldflags="-s -w -X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION" \
      -o "$kdir/" github.com/k3s-io/kine) >&2 || die "building kine failed (see the go output above)"
    touch "$kdir/.complete"
    log "built kine in $((SECONDS - start)) s"
  fi
  echo "$kdir/kine"
}

# The control plane of another minor, for the version lanes.
build_minor() {
  local minor=$1 mod=$here/k8s-$1 version kdir start=$SECONDS stamp="-s -w" pkg
  [[ -f $mod/go.mod ]] || die "no module for Kubernetes $minor (tests/upstream/k8s-$minor)"
  version=$(sed -n 's|^require k8s.io/kubernetes \(v[0-9.]*\)$|\1|p' "$mod/go.mod")
  [[ -n $version ]] || die "$mod/go.mod names no k8s.io/kubernetes version"
  kdir=$cache_root/bin/k8s-${version}_r1
  if [[ ! -f $kdir/.complete ]]; then
    build_all
    go_env
    mkdir -p "$kdir"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor#v1.} -X $pkg.gitTreeState=clean"
    done
    log "building the control plane of Kubernetes $version into $kdir (first run on this machine; later runs reuse it)"
    (cd "$mod" && GOGC=400 go build -mod=readonly -trimpath -gcflags=all=-dwarf=false \
      -ldflags="$stamp" -o "$kdir/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler) >&2 || die "building Kubernetes $version failed (see the go output above)"
    ln -sf "$dir/etcd" "$dir/kwok" "$dir/kubectl" "$dir/kwok.yaml" "$kdir/"
    touch "$kdir/.complete"
    log "built Kubernetes $version in $((SECONDS - start)) s"
  fi
  echo "$kdir"
}

# kwok runs no stages unless given some; kwokctl injects its defaults
# (node-initialize, heartbeat with lease, pod ready/complete/delete). We take
# the very same files from the kwok module we build.
write_kwok_config() {
  local out=$1 src s f
  go_env
  src=$(cd "$here" && go mod download -json sigs.k8s.io/kwok 2>/dev/null | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -n $src ]] || die "cannot find kwok's stage files; put a kwok.yaml beside the binaries"
  s=$src/kustomize/stage
  {
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo "---"
      cat "$s/$f"
    done
  } >"$out.tmp"
  mv "$out.tmp" "$out"
}

case ${1:-} in
"")
  build_all
  echo "$dir"
  ;;
controlplane)
  if [[ -n ${NODEKEEPER_CONTROLPLANE_BIN:-} ]]; then
    check_folder NODEKEEPER_CONTROLPLANE_BIN "$NODEKEEPER_CONTROLPLANE_BIN" "${controlplane[@]}"
    [[ -f $NODEKEEPER_CONTROLPLANE_BIN/kwok.yaml ]] || write_kwok_config "$NODEKEEPER_CONTROLPLANE_BIN/kwok.yaml"
    echo "$NODEKEEPER_CONTROLPLANE_BIN"
  else
    build_all
    echo "$dir"
  fi
  ;;
kubelet)
  if [[ -n ${NODEKEEPER_KUBELET_BIN:-} ]]; then
    check_folder NODEKEEPER_KUBELET_BIN "$NODEKEEPER_KUBELET_BIN" "${kubelet[@]}"
    echo "$NODEKEEPER_KUBELET_BIN"
  else
    build_all
    echo "$dir"
  fi
  ;;
helm)
  if [[ -n ${NODEKEEPER_HELM_BIN:-} ]]; then
    [[ -x $NODEKEEPER_HELM_BIN && ! -d $NODEKEEPER_HELM_BIN ]] || die "NODEKEEPER_HELM_BIN=$NODEKEEPER_HELM_BIN is not an executable"
    echo "$NODEKEEPER_HELM_BIN"
  else
    build_all
    echo "$dir/helm"
  fi
  ;;
prometheus)
  if [[ -n ${NODEKEEPER_PROMETHEUS_BIN:-} ]]; then
    check_folder NODEKEEPER_PROMETHEUS_BIN "$NODEKEEPER_PROMETHEUS_BIN" prometheus promtool
    echo "$NODEKEEPER_PROMETHEUS_BIN"
  else
    build_all
    echo "$dir"
  fi
  ;;
kine)
  if [[ -n ${NODEKEEPER_KINE_BIN:-} ]]; then
    [[ -x $NODEKEEPER_KINE_BIN && ! -d $NODEKEEPER_KINE_BIN ]] || die "NODEKEEPER_KINE_BIN=$NODEKEEPER_KINE_BIN is not an executable"
    echo "$NODEKEEPER_KINE_BIN"
  else
    build_kine
  fi
  ;;
controlplane-v1.*)
  build_minor "${1#controlplane-}"
  ;;
*) die "usage: $0 [controlplane|kubelet|helm|prometheus|kine|controlplane-vX.Y]" ;;
esac
