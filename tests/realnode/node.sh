#!/usr/bin/env bash
# Real Kubernetes nodes beside the test control plane's kwok nodes: a real
# kubelet (same release as the control plane, `cluster.sh build-kubelet`) and
# a private containerd + runc per node, on this machine, as root.
#
#   node.sh up [N] [--machine]
#                           start N nodes real-0 … real-(N-1) (default 1), wait
#                           until each Node is Ready, print the env lines.
#                           --machine: each node is a machine that can reboot
#                           (tests/realnode/machine.sh: a PID + mount namespace
#                           with its own init, boot ID, /run, /var, os-release)
#   node.sh reboot NODE     reboot a machine as `systemctl reboot` in it would;
#                           returns once it is down (it boots again by itself)
#   node.sh off NODE / on NODE
#                           power a machine off and keep it off / boot it again
#   node.sh exec NODE CMD…  run CMD inside a machine (nsenter into its PID 1)
#   node.sh down            stop everything, remove every trace (idempotent)
#   node.sh status          exit 0 when the recorded nodes are up and Ready
#   node.sh logs            tails of each node's containerd and kubelet logs
#   node.sh env             the shell-sourceable variables tests read (also in
#                           $NODEKEEPER_REALNODE_DIR/env while nodes are up)
#   node.sh import ARCHIVE…       import OCI/docker archives into every node's
#                                 containerd (namespace k8s.io, snapshotter native)
#   node.sh restart containerd|kubelet [NODE]
#                           SIGTERM it and start it again (every node, or NODE),
#                           wait until it answers (not for Ready)
#   node.sh cni off|on [NODE]  take the pod network's CNI config away / put
#                           it back (Node NotReady / Ready); see cmd_cni for
#                           why a plain rename back is not enough
#   node.sh put-manifest NODE FILE  place a static pod manifest atomically
#                                   (copy to a dotfile, then rename)
#   node.sh rm-manifest NODE FILE   remove it (by its base name)
#
# Needs: root, the control plane up (tests/controlplane/cluster.sh up), and
# tests/install-prereqs run (containerd, runc, the unpacked CNI plugins, the
# local pause image). No registry is reachable: pods must use images imported
# with `import` (imagePullPolicy Never or IfNotPresent); the sandbox image is
# localhost/pause:nodekeeper (tests/realnode/pause.c).
#
# Several nodes: each node has its OWN containerd. One containerd cannot be
# shared by two kubelets: a kubelet kills every pod sandbox it finds in the
# runtime that it did not start itself (HandlePodCleanups: "Clean up
# containers for orphaned pod we had not seen before"). Each kubelet also gets
# its own cgroup root (/nodekeeper-<run>-<i>, so pods live in
# /nodekeeper-<run>-<i>/kubepods — a kubelet removes pod cgroups under its
# kubepods that it does not know), ports, bridge and subnet. Process-mode
# nodes still share what the kubelet fixes: /var/lib/kubelet/device-plugins
# (each kubelet's registration socket replaces the previous one's; nothing
# here uses device plugins) and /var/log/containers (symlinks, names unique
# per container). Machines have their own /var and /run.
#
# Machines (`up N --machine`, tests/realnode/machine.sh): each node is a PID
# + mount namespace whose PID 1 is machine.sh's init, which starts containerd
# and the kubelet (and restarts them if they exit). `systemctl reboot` or
# `reboot` inside it ends that PID 1, which ends everything in the machine,
# containers included; its supervisor boots it again with a new boot ID, the
# same disks (containerd's store, the kubelet's folder, /var), and a fresh
# /run. Its records (machine.log) say when each reboot was asked for, when
# PID 1 ended and when it booted, on the host's clock.
#
# <run> is six hex digits of a hash of NODEKEEPER_REALNODE_DIR: two runs with
# different folders use different cgroups, bridges and subnets, and `down`
# touches only its own (kube-proxy's nftables tables are the one exception:
# there is one kube-proxy per host, and `up` refuses to start while another
# run's tables exist).
#
# The kubelets serve on 127.0.0.1 only, with webhook authentication off and
# no client certificate in the API server: `kubectl logs/exec/port-forward`
# do not reach them. Read container logs from the pod-logs folder (env) or
# use ctr. `down` kills everything at once (SIGKILL): no graceful pod stop.
#
# Pod network: Debian's bridge + host-local CNI plugins, bridge nk<run>b<i>,
# the first 10.88.x.0/24 no route uses, no masquerade, no portmap (hostPort unsupported). Host-network
# pods need none of it.
#
# Services: one kube-proxy (nftables mode) for the whole machine, as node
# real-0. Every real node shares the host's network namespace, where
# kube-proxy's rules apply to all of them; a second kube-proxy would fight
# the first over the same tables. A pod reaches the API server as in any
# cluster: the `kubernetes` Service's ClusterIP, translated to the address
# the API server advertises (tests/controlplane/cluster.sh).
#
# The nodes carry the label nodekeeper.test/real-node=true and, unless
# NODEKEEPER_REALNODE_TAINT is set to empty, the taint
# nodekeeper.test/real-node=true:NoSchedule, so workloads of tests that run at
# the same time on the kwok nodes are not scheduled onto them (pods with
# spec.nodeName and static pods are not affected). kwok leaves them alone: it
# manages only nodes annotated kwok.x-k8s.io/node=fake.
#
# Outside its folder, a node changes (and `down` restores or removes): the
# sysctls vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
# kernel.panic_on_oops, kernel.keys.root_maxkeys/root_maxbytes (kubelet) and
# net.ipv4.ip_forward (CNI bridge), kube-proxy's nftables tables
# `ip kube-proxy` and `ip6 kube-proxy`, the cgroups /nodekeeper-<run>-*, bridges
# nk<run>b*, network namespaces /run/netns/cni-*, /var/lib/cni, /var/log/containers,
# /var/lib/kubelet (device-plugins), /run/containerd/s (shim sockets), and
# the Nodes (and pods bound to them) in the API.
#
# Environment: NODEKEEPER_REALNODE_DIR (default ~/.cache/nodekeeper/realnode;
# keep it short: unix socket paths are limited to 108 bytes),
# NODEKEEPER_REALNODE_TIMEOUT (seconds to wait for Ready, default 60),
# NODEKEEPER_REALNODE_TAINT (see above), NODEKEEPER_REALNODE_IMPORT (archives
# to import at `up`, space-separated), NODEKEEPER_KUBELET_BIN (a folder with
# a ready kubelet), NODEKEEPER_CACHE_DIR, NODEKEEPER_CLUSTER_DIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster_sh=$here/../controlplane/cluster.sh
# kc, waits, ports, cgroups, mounts, sysctls, client credentials.
# shellcheck source=tests/machine-lib.sh
source "$here/../machine-lib.sh"
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
cluster_dir=${NODEKEEPER_CLUSTER_DIR:-$cache_root/cluster}
dir=${NODEKEEPER_REALNODE_DIR:-$cache_root/realnode}
ready_timeout=${NODEKEEPER_REALNODE_TIMEOUT:-60}
taint=${NODEKEEPER_REALNODE_TAINT-nodekeeper.test/real-node=true:NoSchedule}
label=nodekeeper.test/real-node
pause_ref=localhost/pause:nodekeeper
snapshotter=native
# What this run makes outside its folder is named after the folder, so two
# runs (two folders) on one machine never touch each other's: cgroups
# /nodekeeper-<run>-<i>, bridges nk<run>b<i>; subnets are the first free
# 10.88.x.0/24 (recorded per node).
run_id=$(printf '%s' "$dir" | sha1sum | cut -c1-6)
cgroup_prefix=nodekeeper-$run_id-
bridge_of() { echo "nk${run_id}b$1"; }
subnet_of() { echo "10.88.$(cat "$(node_dir "$1")/subnet").0/24"; }
# "machine" (each node a PID + mount namespace of its own that can reboot,
# tests/realnode/machine.sh) or "process" (the daemons run on the host).
mode() { cat "$dir/mode" 2>/dev/null || echo process; }
machines() { [[ $(mode) == machine ]]; }
sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)

log() { echo "realnode: $*" >&2; }
die() { echo "realnode: error: $*" >&2; exit 1; }

node_name() { echo "real-$1"; }
node_dir() { echo "$dir/real-$1"; }
sock() { echo "$(node_dir "$1")/containerd.sock"; }
ctr_cmd() { echo "$(command -v ctr) --address $(sock "$1") --namespace k8s.io"; }

cni_bin() {
  local d
  for d in "$cache_root"/cni-*/usr/lib/cni; do
    [[ -x $d/bridge && -x $d/host-local && -x $d/loopback ]] && { echo "$d"; return; }
  done
  return 1
}

# free_port START: sets $port to the first port >= START that nothing
# listens on and that this `up` has not handed out yet (no subshell: it
# records what it hands out).
taken_ports=" "

# ---------------------------------------------------------------- host state

# What `up` changes outside its folder, recorded once before the first
# change, so `down` can put it back.
save_host_state() {
  [[ -f $dir/host.saved ]] && return
  mkdir -p "$dir"
  {
    local s
    for s in "${sysctls[@]}"; do
      [[ -e /proc/sys/${s//.//} ]] && echo "sysctl $s $(cat "/proc/sys/${s//.//}")"
    done
    local p
    for p in /var/lib/kubelet /var/lib/cni /var/log/containers /run/containerd /run/containerd/s /run/netns; do
      [[ -e $p ]] && echo "existed $p"
    done
    if [[ -d /run/netns ]]; then
      for p in /run/netns/*; do [[ -e $p ]] && echo "netns $p"; done
    fi
    if [[ -d /run/containerd/s ]]; then
      for p in /run/containerd/s/*; do [[ -e $p ]] && echo "shimsock $p"; done
    fi
  } >"$dir/host.saved.tmp"
  mv "$dir/host.saved.tmp" "$dir/host.saved"
}

saved() { [[ -f $dir/host.saved ]] && grep -qxF -- "$1 $2" "$dir/host.saved"; }

# ------------------------------------------------------------------------ up

write_containerd_config() {
  local i=$1 d cni
  d=$(node_dir "$i")
  cni=$(cni_bin)
  # A machine's runtime state is per boot (its own /run), as on a host.
  local state=$d/containerd/state runc_root=$d/runc
  if machines; then
    state=/run/nk/containerd runc_root=/run/nk/runc
  fi
  mkdir -p "$d/containerd/root" "$d/containerd/opt" "$d/cni-conf" "$d/cni-ipam"
  machines || mkdir -p "$state"
  cat >"$d/containerd.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "$(sock "$i")"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  # This machine forbids lowering a process's OOM score, even for root:
  # without this every pod fails in runc ("can't get final child's PID").
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapshotter"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state, by default /run/containerd/runc, shared by every containerd.
        Root = "$runc_root"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni"
    conf_dir = "$d/cni-conf"
    max_conf_num = 1
EOF
  write_cni_conf "$i"
}

cni_conf() { echo "$(node_dir "$1")/cni-conf/10-nodekeeper.conflist"; }

write_cni_conf() {
  local i=$1 d ipam
  d=$(node_dir "$i")
  # A machine's leases are per boot: every pod network is gone after a reboot.
  ipam=$d/cni-ipam
  machines && ipam=/run/nk/cni-ipam
  cat >"$d/cni-conf/.10-nodekeeper.conflist.tmp" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "nk$run_id-$i",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(bridge_of "$i")",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(subnet_of "$i")"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$ipam"
      }
    }
  ]
}
EOF
  mv "$d/cni-conf/.10-nodekeeper.conflist.tmp" "$(cni_conf "$i")"
}

# cni off|on [NODE]: take the pod network's config away (the runtime's
# network, and so the Node, turn not ready) or put it back. Containerd 1.6
# reloads its CNI config on a WRITE, RENAME or REMOVE event in the folder but
# ignores CREATE: a config renamed into place is not seen (the node stays
# NotReady, "cni plugin not initialized"), and one rewritten in place may be
# read empty (the truncation's event). So: rename into place, then append a
# newline, whose WRITE event comes once the whole file is there.
cmd_cni() {
  local state=${1:-} only=${2:-} i d conf found=0
  [[ $state == on || $state == off ]] || die "usage: node.sh cni on|off [NODE]"
  [[ -f $dir/count ]] || die "no real nodes are up (node.sh up)"
  for i in $(recorded); do
    [[ -z $only || $only == "$(node_name "$i")" ]] || continue
    found=1
    d=$(node_dir "$i")
    conf=$(cni_conf "$i")
    if [[ $state == off ]]; then
      [[ -f $conf ]] && mv "$conf" "$d/cni-off.conflist"
    elif [[ ! -f $conf ]]; then
      if [[ -f $d/cni-off.conflist ]]; then
        mv "$d/cni-off.conflist" "$conf"
      else
        write_cni_conf "$i"
      fi
      echo >>"$conf"
    fi
  done
  ((found)) || die "no real node named $only is up"
}

# The kubelet's credentials: system:node:<name> in group system:nodes.
write_node_credentials() {
  local d
  d=$(node_dir "$1")
  mkdir -p "$d/certs"
  write_client_kubeconfig "$d/kubeconfig" "system:node:$(node_name "$1")" system:nodes
}

write_kubelet_config() {
  local i=$1 d port=$2 healthz=$3
  d=$(node_dir "$i")
  mkdir -p "$d/manifests" "$d/pod-logs" "$d/kubelet" "$d/volume-plugins"
  local taints=""
  if [[ -n $taint ]]; then
    local k=${taint%%=*} rest=${taint#*=}
    local v=${rest%%:*} e=${rest##*:}
    taints="registerWithTaints:
- {key: \"$k\", value: \"$v\", effect: \"$e\"}"
  fi
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1, which the kubelet refuses by default.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$cgroup_prefix$i
failSwapOn: false
containerRuntimeEndpoint: unix://$(sock "$i")
staticPodPath: $d/manifests
podLogsDir: $d/pod-logs
address: 127.0.0.1
port: $port
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $cluster_dir/pki/ca.crt}
authorization: {mode: AlwaysAllow}
rotateCertificates: false
serverTLSBootstrap: false
hairpinMode: none
# Test machines' disks are shared and often well filled: no disk pressure,
# no image garbage collection (nothing could be pulled back).
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
shutdownGracePeriod: 0s
fileCheckFrequency: 5s
$taints
EOF
}

start_bg() {
  local pidfile=$1 logfile=$2
  shift 2
  # 9>&-: the daemons must not inherit (and so hold) node.sh's lock.
  setsid "$@" >>"$logfile" 2>&1 </dev/null 9>&- &
  echo $! >"$pidfile"
  disown $!
}

# How the node's containerd and kubelet start: a script each, run on the
# host (process mode) or by the machine's init at every boot.
write_start_scripts() {
  local i=$1 d
  d=$(node_dir "$i")
  cat >"$d/start-containerd" <<EOF
#!/bin/sh
exec containerd --config '$d/containerd.toml'
EOF
  cat >"$d/start-kubelet" <<EOF
#!/bin/sh
exec '$(cat "$dir/kubelet-bin")' --config='$d/kubelet.yaml' --kubeconfig='$d/kubeconfig' \\
  --root-dir='$d/kubelet' --cert-dir='$d/certs' --volume-plugin-dir='$d/volume-plugins' \\
  --hostname-override='$(node_name "$i")' --node-labels='$label=true' --v=2
EOF
  chmod +x "$d/start-containerd" "$d/start-kubelet"
}

# Logs are appended to, so a restart keeps what came before.
start_containerd() {
  local d
  d=$(node_dir "$1")
  start_bg "$d/containerd.pid" "$d/containerd.log" "$d/start-containerd"
}

start_kubelet() {
  local d
  d=$(node_dir "$1")
  start_bg "$d/kubelet.pid" "$d/kubelet.log" "$d/start-kubelet"
}

# A machine's own files (tests/realnode/machine.sh): its OS release (the
# kubelet's osImage), its reboot command, its cgroup root; then its
# supervisor, which boots it.
machine_os_release() {
  printf 'NAME="nodekeeper test machine"\nID=nktest\nVERSION_ID=%s\nPRETTY_NAME="nodekeeper test machine %s"\n' "$1" "$1"
}

start_machine() {
  local i=$1 d
  d=$(node_dir "$i")
  [[ -f $d/os-release ]] || machine_os_release 1 >"$d/os-release"
  cat >"$d/reboot" <<EOF
#!/bin/bash
exec bash '$here/machine.sh' request-reboot '$d' "\$@"
EOF
  chmod +x "$d/reboot"
  echo "/$cgroup_prefix$i" >"$d/cgroup-root"
  rm -f "$d/halt" "$d/off"
  start_bg "$d/supervisor.pid" "$d/supervisor.log" bash "$here/machine.sh" supervise "$d"
}

# The host PID of a machine's PID 1 (its current boot), when it runs.
machine_init() {
  local d pid
  d=$(node_dir "$1")
  pid=$(cat "$d/init.pid" 2>/dev/null) || return 1
  [[ -n $pid ]] && running "$pid" && echo "$pid"
}

# kube-proxy: one for the machine (see the header), as node real-0, in
# nftables mode. The conntrack sysctls are left as they are (0 = leave as-is):
# the host is shared. Health and metrics on loopback, on free ports.
proxy_dir() { echo "$dir/kube-proxy"; }

start_kube_proxy() {
  local d
  d=$(proxy_dir)
  start_bg "$d/kube-proxy.pid" "$d/kube-proxy.log" "$(cat "$dir/kube-proxy-bin")" \
    --kubeconfig="$d/kubeconfig" --hostname-override="$(node_name 0)" --proxy-mode=nftables \
    --cluster-cidr=10.88.0.0/16 --conntrack-max-per-core=0 \
    --conntrack-tcp-timeout-established=0s --conntrack-tcp-timeout-close-wait=0s \
    --healthz-bind-address="127.0.0.1:$(cat "$d/healthz-port")" \
    --metrics-bind-address="127.0.0.1:$(cat "$d/metrics-port")" --v=2
}

kube_proxy_healthy() {
  curl -sf --max-time 2 "http://127.0.0.1:$(cat "$(proxy_dir)/healthz-port")/healthz" >/dev/null 2>&1
}

# kube-proxy's tables, when another kube-proxy (not ours) has made them.
foreign_proxy_tables() {
  [[ -d $(proxy_dir) ]] && return 1
  nft list table ip kube-proxy >/dev/null 2>&1 || nft list table ip6 kube-proxy >/dev/null 2>&1
}

kubelet_healthy() {
  curl -sf --max-time 2 "http://127.0.0.1:$(cat "$(node_dir "$1")/healthz-port")/healthz" >/dev/null 2>&1
}

ctr_ok() { ctr --address "$(sock "$1")" --namespace k8s.io version >/dev/null 2>&1; }

import_into() {
  local i=$1 archive=$2
  ctr --address "$(sock "$i")" --namespace k8s.io images import --snapshotter "$snapshotter" "$archive" >/dev/null ||
    die "importing $archive into $(node_name "$i")'s containerd failed"
}

fail_up() { die "$@"; }

# A failed `up` (any exit before the end, once it has changed something)
# prints the logs' tails, keeps the logs in $cache_root/realnode-failed/ and
# takes everything down again.
up_ok=0
on_up_exit() {
  local rc=$?
  ((up_ok)) && return
  set +e
  trap - EXIT
  cmd_logs
  local keep=$cache_root/realnode-failed d
  rm -rf "$keep"
  for d in "$dir"/real-*; do
    [[ -d $d ]] || continue
    mkdir -p "$keep/${d##*/}"
    cp "$d"/*.log "$d"/*.yaml "$d"/*.toml "$keep/${d##*/}/" 2>/dev/null
  done
  log "up failed; logs kept in $keep; taking the nodes down"
  cmd_down
  exit $((rc ? rc : 1))
}

cmd_up() {
  local n=1 want=process a
  for a in "$@"; do
    case $a in
      --machine) want=machine ;;
      *) n=$a ;;
    esac
  done
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "usage: node.sh up [N] [--machine], N >= 1"
  ((n <= 50)) || die "at most 50 nodes (subnets 10.88.<i>.0/24)"
  [[ $(id -u) == 0 ]] || die "real nodes need root (the kubelet and containerd manage cgroups, mounts, network)"
  cluster_up || die "the control plane is not up: run tests/controlplane/cluster.sh up first"
  [[ -f $cluster_dir/pki/ca.key ]] || die "no cluster CA key at $cluster_dir/pki/ca.key"
  local c
  for c in containerd containerd-shim-runc-v2 runc ctr openssl ss nft; do
    command -v "$c" >/dev/null || die "'$c' is missing: run tests/install-prereqs"
  done
  cni_bin >/dev/null || die "no CNI plugins under $cache_root/cni-*: run tests/install-prereqs"
  local longest="$dir/real-$((n - 1))/containerd.sock.ttrpc"
  ((${#longest} < 108)) || die "socket path $longest is too long for a unix socket: set NODEKEEPER_REALNODE_DIR to a shorter folder"
  setup_kubectl

  if [[ -f $dir/count && $(cat "$dir/count") == "$n" && $(mode) == "$want" ]] && all_up; then
    log "already up: $n node(s)"
    cmd_env
    return
  fi
  if [[ -f $dir/count || -f $dir/host.saved ]] || compgen -G "$dir/real-*" >/dev/null; then
    log "taking down what a previous up left"
    cmd_down
  fi

  local start=$SECONDS kubelet_bin node_bins pause_archive
  node_bins=$("$cluster_sh" build-kubelet)
  kubelet_bin=$node_bins/kubelet
  pause_archive=$("$here/pause-image.sh")
  [[ -x $kubelet_bin ]] || die "no kubelet at $kubelet_bin"
  [[ -x $node_bins/kube-proxy ]] || die "no kube-proxy at $node_bins/kube-proxy"
  ! foreign_proxy_tables || die "this machine already has kube-proxy's nftables tables (another kube-proxy runs here?): nft list tables"
  local i
  mkdir -p "$dir"
  trap on_up_exit EXIT
  save_host_state
  echo "$want" >"$dir/mode"
  echo "$n" >"$dir/count"
  echo "$kubelet_bin" >"$dir/kubelet-bin"
  echo "$node_bins/kube-proxy" >"$dir/kube-proxy-bin"

  # RBAC only in the test API server (no Node authorizer): nodes get the
  # system:node role through their group.
  grant_nodes_their_role nodekeeper-realnode-system-node || fail_up "cannot create the ClusterRoleBinding for nodes"

  # Each node: its subnet (the first 10.88.x.0/24 nothing routes), its
  # configuration, credentials and ports.
  local d
  for i in $(seq 0 $((n - 1))); do
    d=$(node_dir "$i")
    mkdir -p "$d"
    free_subnet 10.88 >"$d/subnet" || fail_up "no free 10.88.x.0/24 for $(node_name "$i") (ip route)"
    write_containerd_config "$i"
    # The kubelet insists its cgroup root exists (in every v1 hierarchy).
    local h
    for h in $(hierarchies); do mkdir -p "$h$cgroup_prefix$i"; done
    write_node_credentials "$i"
    local port healthz
    free_port 10350
    healthz=$port
    free_port 10250
    echo "$port" >"$d/port"
    echo "$healthz" >"$d/healthz-port"
    write_kubelet_config "$i" "$port" "$healthz"
    write_start_scripts "$i"
  done
  # Process mode: containerd first, images in, then the kubelet. A machine
  # boots both at once (the kubelet waits for the sandbox image it needs).
  for i in $(seq 0 $((n - 1))); do
    if machines; then start_machine "$i"; else start_containerd "$i"; fi
  done
  for i in $(seq 0 $((n - 1))); do
    wait_until 30 ctr_ok "$i" || fail_up "$(node_name "$i")'s containerd did not answer within 30 s"
    import_into "$i" "$pause_archive"
    for a in ${NODEKEEPER_REALNODE_IMPORT:-}; do import_into "$i" "$a"; done
  done
  log "containerd up, images imported in $((SECONDS - start)) s"
  machines || for i in $(seq 0 $((n - 1))); do start_kubelet "$i"; done
  for i in $(seq 0 $((n - 1))); do
    wait_until "$ready_timeout" node_ready_or_dead "$i" || true
    node_ready "$i" || fail_up "node $(node_name "$i") is not Ready within ${ready_timeout}s"
  done

  # kube-proxy as system:kube-proxy, which the API server's default
  # ClusterRoleBinding system:node-proxier authorises. Healthy means it has
  # written its rules once.
  d=$(proxy_dir)
  mkdir -p "$d"
  write_client_kubeconfig "$d/kubeconfig" system:kube-proxy
  free_port 10256
  echo "$port" >"$d/healthz-port"
  free_port 10249
  echo "$port" >"$d/metrics-port"
  start_kube_proxy
  wait_until 30 kube_proxy_ready_or_dead || fail_up "kube-proxy is not healthy within 30 s"
  write_env "$kubelet_bin"
  up_ok=1
  trap - EXIT
  log "up: $n node(s) Ready in $((SECONDS - start)) s"
  cmd_env
}

kube_proxy_ready_or_dead() {
  kube_proxy_healthy && return 0
  alive "$(proxy_dir)/kube-proxy.pid" || fail_up "kube-proxy exited"
  return 1
}

node_ready_or_dead() {
  node_ready "$1" && return 0
  if machines; then
    alive "$(node_dir "$1")/supervisor.pid" || fail_up "the supervisor of machine $(node_name "$1") exited"
    return 1
  fi
  alive "$(node_dir "$1")/kubelet.pid" || fail_up "the kubelet of $(node_name "$1") exited"
  alive "$(node_dir "$1")/containerd.pid" || fail_up "the containerd of $(node_name "$1") exited"
  return 1
}

all_up() {
  local i d
  [[ -f $dir/env ]] || return 1
  for i in $(recorded); do
    d=$(node_dir "$i")
    if machines; then
      alive "$d/supervisor.pid" && machine_init "$i" >/dev/null && kubelet_healthy "$i" && node_ready "$i" || return 1
    else
      alive "$d/kubelet.pid" && alive "$d/containerd.pid" && node_ready "$i" || return 1
    fi
  done
  alive "$(proxy_dir)/kube-proxy.pid" && kube_proxy_healthy
}

# ---------------------------------------------------------------------- env

write_env() {
  local kubelet_bin=$1 n i d
  n=$(cat "$dir/count")
  {
    echo "# tests/realnode/node.sh env: KEY='value' lines, values never hold a quote"
    echo "NODEKEEPER_REALNODE_DIR='$dir'"
    echo "NODEKEEPER_REALNODE_COUNT='$n'"
    echo "NODEKEEPER_REALNODE_MODE='$(mode)'"
    echo "NODEKEEPER_REALNODE_NODES='$(for i in $(recorded); do printf '%s ' "$(node_name "$i")"; done | sed 's/ $//')'"
    echo "NODEKEEPER_REALNODE_KUBELET='$kubelet_bin'"
    echo "NODEKEEPER_REALNODE_CTR_BIN='$(command -v ctr)'"
    echo "NODEKEEPER_REALNODE_SNAPSHOTTER='$snapshotter'"
    echo "NODEKEEPER_REALNODE_PAUSE_IMAGE='$pause_ref'"
    echo "NODEKEEPER_REALNODE_LABEL='$label=true'"
    echo "NODEKEEPER_REALNODE_TAINT='$taint'"
    echo "NODEKEEPER_REALNODE_KUBECONFIG='$cluster_dir/kubeconfig'"
    echo "NODEKEEPER_REALNODE_KUBE_PROXY_LOG='$(proxy_dir)/kube-proxy.log'"
    echo "# node 0, for tests that use one node"
    echo "NODEKEEPER_REALNODE_NAME='$(node_name 0)'"
    echo "NODEKEEPER_REALNODE_CONTAINERD_SOCKET='$(sock 0)'"
    echo "NODEKEEPER_REALNODE_CTR='$(ctr_cmd 0)'"
    echo "NODEKEEPER_REALNODE_MANIFESTS='$(node_dir 0)/manifests'"
    for i in $(recorded); do
      d=$(node_dir "$i")
      echo "# node $i"
      echo "NODEKEEPER_REALNODE_${i}_NAME='$(node_name "$i")'"
      echo "NODEKEEPER_REALNODE_${i}_CONTAINERD_SOCKET='$(sock "$i")'"
      echo "NODEKEEPER_REALNODE_${i}_CTR='$(ctr_cmd "$i")'"
      echo "NODEKEEPER_REALNODE_${i}_MANIFESTS='$d/manifests'"
      echo "NODEKEEPER_REALNODE_${i}_POD_LOGS='$d/pod-logs'"
      echo "NODEKEEPER_REALNODE_${i}_ROOT_DIR='$d/kubelet'"
      echo "NODEKEEPER_REALNODE_${i}_KUBECONFIG='$d/kubeconfig'"
      echo "NODEKEEPER_REALNODE_${i}_KUBELET_PORT='$(cat "$d/port")'"
      echo "NODEKEEPER_REALNODE_${i}_HEALTHZ_PORT='$(cat "$d/healthz-port")'"
      echo "NODEKEEPER_REALNODE_${i}_CGROUP_ROOT='/$cgroup_prefix$i'"
      echo "NODEKEEPER_REALNODE_${i}_KUBELET_LOG='$d/kubelet.log'"
      echo "NODEKEEPER_REALNODE_${i}_CONTAINERD_LOG='$d/containerd.log'"
      echo "NODEKEEPER_REALNODE_${i}_DIR='$d'"
    done
  } >"$dir/env.tmp"
  mv "$dir/env.tmp" "$dir/env"
}

cmd_env() {
  [[ -f $dir/env ]] || die "no real nodes are up (node.sh up)"
  cat "$dir/env"
}

# -------------------------------------------------------------------- status

cmd_status() {
  if [[ ! -f $dir/count ]]; then
    echo "down"
    return 1
  fi
  setup_kubectl
  local i d ok=0 k c r
  for i in $(recorded); do
    d=$(node_dir "$i")
    k=dead c=dead r=NotReady
    cluster_up && node_ready "$i" && r=Ready
    if machines; then
      local init
      init=$(machine_init "$i") && k="machine PID 1 $init, boot $(cat "$d/boot_id")" c=$k
      kubelet_healthy "$i" || k=dead
      ctr_ok "$i" || c=dead
      [[ -f $d/off ]] && k="off" c="off"
    else
      alive "$d/kubelet.pid" && k="pid $(cat "$d/kubelet.pid")"
      alive "$d/containerd.pid" && c="pid $(cat "$d/containerd.pid")"
    fi
    echo "$(node_name "$i"): $r, kubelet $k, containerd $c ($(sock "$i"))"
    [[ $r == Ready && $k != dead && $c != dead ]] || ok=1
  done
  if alive "$(proxy_dir)/kube-proxy.pid" && kube_proxy_healthy; then
    echo "kube-proxy: healthy, pid $(cat "$(proxy_dir)/kube-proxy.pid")"
  else
    echo "kube-proxy: not healthy"
    ok=1
  fi
  return $ok
}

cmd_logs() {
  local d f
  for d in "$dir"/real-*; do
    [[ -d $d ]] || continue
    for f in containerd kubelet; do
      [[ -f $d/$f.log ]] || continue
      echo "----- $(basename "$d") $f (last 25 lines of $d/$f.log) -----" >&2
      tail -n 25 "$d/$f.log" >&2
    done
  done
  f=$(proxy_dir)/kube-proxy.log
  if [[ -f $f ]]; then
    echo "----- kube-proxy (last 25 lines of $f) -----" >&2
    tail -n 25 "$f" >&2
  fi
}

cmd_import() {
  (($#)) || die "usage: node.sh import ARCHIVE..."
  [[ -f $dir/count ]] || die "no real nodes are up (node.sh up)"
  local a i
  for a in "$@"; do
    [[ -r $a ]] || die "cannot read $a"
    for i in $(recorded); do import_into "$i" "$a"; done
  done
}

# restart containerd|kubelet [NODE]: stop it gracefully (SIGTERM) and start
# it again with the same configuration, on NODE or on every node; waits until
# it answers (containerd: its API; kubelet: /healthz), not for Ready. Pods
# keep running across a containerd restart (their shims do not stop).
cmd_restart() {
  local what=${1:-} only=${2:-} i d pidfile found=0
  [[ $what == containerd || $what == kubelet ]] || die "usage: node.sh restart containerd|kubelet [NODE]"
  [[ -f $dir/count ]] || die "no real nodes are up (node.sh up)"
  machines && die "restart works on process-mode nodes; a machine reboots instead (node.sh reboot NODE)"
  for i in $(recorded); do
    [[ -z $only || $only == "$(node_name "$i")" ]] || continue
    found=1
    d=$(node_dir "$i")
    pidfile=$d/$what.pid
    if alive "$pidfile"; then
      local pid _
      pid=$(cat "$pidfile")
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 150); do running "$pid" || break; sleep 0.1; done
      running "$pid" && kill -KILL "$pid" 2>/dev/null
      for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
    fi
    echo "---- node.sh: restart $(date -u +%FT%TZ) ----" >>"$d/$what.log"
    if [[ $what == containerd ]]; then
      start_containerd "$i"
      wait_until 30 ctr_ok "$i" || die "$(node_name "$i")'s containerd did not answer within 30 s after a restart"
    else
      start_kubelet "$i"
      wait_until 60 kubelet_healthy "$i" || die "$(node_name "$i")'s kubelet is not healthy within 60 s after a restart"
    fi
    log "$what of $(node_name "$i") restarted"
  done
  ((found)) || die "no real node named $only is up"
}

# ------------------------------------------------------------------ machines

machine_index() {
  local node=$1 i
  [[ -f $dir/count ]] || die "no real nodes are up (node.sh up)"
  machines || die "the nodes are not machines (node.sh up N --machine)"
  for i in $(recorded); do
    [[ $(node_name "$i") == "$node" ]] && { echo "$i"; return; }
  done
  die "no machine named $node is up"
}

# reboot NODE: what `systemctl reboot` inside it does (PID 1 shuts down);
# the supervisor boots it again. Returns once the old boot is gone, not
# when the node is back.
cmd_reboot() {
  local i d init
  i=$(machine_index "${1:?usage: node.sh reboot NODE}")
  d=$(node_dir "$i")
  init=$(machine_init "$i") || die "machine $1 is not running (off?)"
  nsenter -t "$init" -p -m -- "$d/reboot" reboot || die "cannot reboot $1"
  wait_until 120 eval '! running '"$init" || die "machine $1 did not go down within 120 s"
}

# off NODE: power it off (PID 1 ends at once) and keep it off; on NODE boots
# it again.
cmd_off() {
  local i d init
  i=$(machine_index "${1:?usage: node.sh off NODE}")
  d=$(node_dir "$i")
  touch "$d/off"
  if init=$(machine_init "$i"); then
    kill -KILL "$init" 2>/dev/null || true
    wait_until 30 eval '! running '"$init" || die "machine $1 did not stop within 30 s"
  fi
}

cmd_on() {
  local i
  i=$(machine_index "${1:?usage: node.sh on NODE}")
  rm -f "$(node_dir "$i")/off"
}

# exec NODE CMD...: run CMD inside the machine (its PID and mount
# namespaces), as root.
cmd_exec() {
  local i init
  i=$(machine_index "${1:?usage: node.sh exec NODE CMD...}")
  shift
  (($#)) || die "usage: node.sh exec NODE CMD..."
  init=$(machine_init "$i") || die "machine $(node_name "$i") is not running"
  exec 9>&-
  exec nsenter -t "$init" -p -m -- "$@"
}

manifests_of() {
  local node=$1 i
  for i in $(recorded); do
    [[ $(node_name "$i") == "$node" ]] && { echo "$(node_dir "$i")/manifests"; return; }
  done
  die "no real node named $node is up"
}

# The kubelet reads a manifest as soon as the file appears: written in place
# it may read half a file. Dotfiles it ignores; a rename is atomic.
cmd_put_manifest() {
  local node=${1:?usage: node.sh put-manifest NODE FILE} file=${2:?usage: node.sh put-manifest NODE FILE} m
  m=$(manifests_of "$node")
  local base
  base=$(basename "$file")
  cp "$file" "$m/.$base.tmp"
  mv "$m/.$base.tmp" "$m/$base"
}

cmd_rm_manifest() {
  local node=${1:?usage: node.sh rm-manifest NODE FILE} file=${2:?usage: node.sh rm-manifest NODE FILE} m
  m=$(manifests_of "$node")
  rm -f "$m/$(basename "$file")"
}

# ---------------------------------------------------------------------- down

# Processes of ours: the kubelets, containerds, shims, runc and kube-proxy
# whose command line names our folder (never matched by name alone).
our_pids() {
  local f p exe
  # shellcheck disable=SC2013 # /proc paths hold no spaces
  for f in $(grep -lsF -- "$dir/" /proc/[0-9]*/cmdline); do
    p=${f%/cmdline}
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case ${exe##*/} in
      kubelet | containerd | containerd-shim-runc-v2 | containerd-shim | runc | kube-proxy | unshare) echo "${p#/proc/}" ;;
    esac
  done
  return 0
}

# The daemons' state is thrown away: no need for a graceful stop.
kill_pid() {
  local pid=$1 _
  kill -KILL "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do running "$pid" || return 0; sleep 0.05; done
}

# Every process in our pods' cgroups (containers, pause).
pod_pids() {
  local h=/sys/fs/cgroup/memory/ # every v1 hierarchy holds every process: one is enough
  [[ -f $h/cgroup.procs ]] || h=/sys/fs/cgroup/
  compgen -G "$h$cgroup_prefix*" >/dev/null || return 0
  find "$h"$cgroup_prefix* -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
}

cmd_down() {
  local had_state=0
  [[ -d $dir ]] && had_state=1
  [[ $(id -u) == 0 ]] || { [[ $had_state == 0 ]] && { log "down"; return 0; }; die "down needs root"; }

  # Network namespaces of our pods, found through their processes before
  # those go.
  local inodes=" " pid
  for pid in $(pod_pids); do
    inodes+="$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) "
  done

  # 0. Machines: their supervisors (so nothing boots again), then their PID
  # 1s, which takes everything inside with them.
  local d
  for d in "$dir"/real-*; do
    [[ -d $d ]] || continue
    touch "$d/halt"
    [[ -f $d/supervisor.pid ]] && kill_pid "$(cat "$d/supervisor.pid")"
    [[ -f $d/init.pid && -n $(cat "$d/init.pid") ]] && kill_pid "$(cat "$d/init.pid")"
  done

  # 1. kubelets first (they would restart what we stop), then pods,
  # containerd, shims.
  for d in "$dir"/real-*; do
    [[ -f $d/kubelet.pid ]] && kill_pid "$(cat "$d/kubelet.pid")"
  done
  for pid in $(our_pids); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */kubelet ]] && kill_pid "$pid"
  done
  local round
  for round in 1 2 3 4 5; do
    local pids
    pids=$(pod_pids)
    [[ -n $pids ]] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  for d in "$dir"/real-*; do
    [[ -f $d/containerd.pid ]] && kill_pid "$(cat "$d/containerd.pid")"
  done
  for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  for round in $(seq 50); do
    local left=0
    for pid in $(our_pids); do running "$pid" && left=1; done
    ((left)) || break
    sleep 0.1
  done

  # 2. Network: the pods' namespaces (ours by inode, or new since `up`
  # and named by the CNI), then the bridges.
  local ns
  if [[ -d /run/netns ]]; then
    for ns in /run/netns/*; do
      [[ -e $ns ]] || continue
      if [[ $inodes == *" $(stat -L -c %i "$ns" 2>/dev/null) "* ]] ||
        { [[ -f $dir/host.saved && ${ns##*/} == cni-* ]] && ! saved netns "$ns"; }; then
        umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
        rm -f "$ns"
      fi
    done
    if [[ -f $dir/host.saved ]] && ! saved existed /run/netns && [[ -z $(ls -A /run/netns 2>/dev/null) ]]; then
      umount /run/netns 2>/dev/null || true
      rmdir /run/netns 2>/dev/null || true
    fi
  fi
  # kube-proxy's tables (it is dead by now), when it was ours.
  if [[ -d $(proxy_dir) ]] && command -v nft >/dev/null; then
    local family
    for family in ip ip6; do
      nft list table "$family" kube-proxy >/dev/null 2>&1 && { nft delete table "$family" kube-proxy || log "warning: could not delete nftables table $family kube-proxy"; }
    done
  fi
  # This run's bridges only (named after its folder).
  local br
  for br in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep "^nk${run_id}b[0-9]*\$" || true); do
    ip link delete "$br" 2>/dev/null || true
  done

  # 3. Mounts under our folder (containers' rootfs, sandbox shm, volumes, the
  # kubelet's rshared root-dir bind), then the cgroups.
  umount_ours
  local g
  for round in 1 2 3 4 5 6 7 8 9 10; do
    local left=0
    for g in $(our_cgroups); do rmdir "$g" 2>/dev/null || left=1; done
    ((left)) || break
    sleep 0.3
  done
  [[ -z $(our_cgroups) ]] || log "warning: cgroups left: $(our_cgroups | tr '\n' ' ')"

  # 4. Host paths the kubelet, containerd and the CNI use outside our folder.
  if [[ -d /var/lib/cni ]]; then
    if [[ -f $dir/host.saved ]] && ! saved existed /var/lib/cni; then
      rm -rf --one-file-system /var/lib/cni
    else
      # The CNI's cached results: <network>-<sandbox id>-<interface>.
      rm -f /var/lib/cni/results/nk"$run_id"-[0-9]*-* 2>/dev/null || true
      local sb
      for sb in "$dir"/real-*/containerd/state/io.containerd.grpc.v1.cri/sandboxes/*; do
        [[ -e $sb ]] && rm -f /var/lib/cni/results/*-"${sb##*/}"-* 2>/dev/null
      done
    fi
  fi
  if [[ -d /var/log/containers ]]; then
    local l
    for l in /var/log/containers/*; do
      [[ -L $l && $(readlink "$l") == "$dir/"* ]] && rm -f "$l"
    done
    if [[ -f $dir/host.saved ]] && ! saved existed /var/log/containers; then
      rmdir /var/log/containers 2>/dev/null || true
    fi
  fi
  if [[ -d /var/lib/kubelet && -f $dir/host.saved ]] && ! saved existed /var/lib/kubelet; then
    rm -rf --one-file-system /var/lib/kubelet
  fi
  if [[ -d /run/containerd/s && -f $dir/host.saved ]]; then
    local listening s
    listening=$(ss -Hxl 2>/dev/null | awk '{print $5}')
    for s in /run/containerd/s/*; do
      [[ -e $s ]] || continue
      saved shimsock "$s" && continue
      grep -qxF -- "$s" <<<"$listening" || rm -f "$s"
    done
  fi
  if [[ -d /run/containerd && -f $dir/host.saved ]] && ! saved existed /run/containerd; then
    find /run/containerd -depth -type d -empty -delete 2>/dev/null || true
  fi
  restore_sysctls

  # 5. The API: pods bound to our nodes, the nodes, the binding.
  if cluster_up; then
    setup_kubectl
    local nodes node
    nodes=$(kc get nodes -l "$label=true" -o 'jsonpath={.items[*].metadata.name}' 2>/dev/null) || true
    for node in $nodes; do
      kc delete pods --all-namespaces --field-selector "spec.nodeName=$node" --force --grace-period=0 --wait=false >/dev/null 2>&1 || true
    done
    [[ -n $nodes ]] && { kc delete nodes -l "$label=true" --wait=true --timeout=30s >/dev/null 2>&1 || log "warning: could not delete nodes $nodes"; }
    kc delete clusterrolebinding nodekeeper-realnode-system-node --ignore-not-found >/dev/null 2>&1 || true
  elif ((had_state)); then
    log "the control plane is down: no Node to delete"
  fi

  # 6. Our folder, containerd's store with it (images are imported again at
  # each `up`, in well under a second).
  if [[ -d $dir ]]; then
    umount_ours
    rm -rf --one-file-system "$dir" 2>/dev/null || { sleep 0.5; umount_ours; rm -rf --one-file-system "$dir" || log "warning: could not remove $dir"; }
  fi
  log "down"
}

lock() {
  mkdir -p "$cache_root"
  exec 9>"$cache_root/realnode.lock"
  flock -w 120 9 || die "another node.sh holds $cache_root/realnode.lock"
}

case ${1:-} in
  up) shift; lock; cmd_up "$@" ;;
  down) lock; cmd_down ;;
  status) cmd_status ;;
  logs) cmd_logs ;;
  env) cmd_env ;;
  import) shift; lock; cmd_import "$@" ;;
  restart) shift; lock; cmd_restart "$@" ;;
  cni) shift; lock; cmd_cni "$@" ;;
  put-manifest) shift; cmd_put_manifest "$@" ;;
  rm-manifest) shift; cmd_rm_manifest "$@" ;;
  reboot) shift; cmd_reboot "$@" ;;
  off) shift; cmd_off "$@" ;;
  on) shift; cmd_on "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  *) die "usage: $0 up [N] [--machine]|reboot NODE|off NODE|on NODE|exec NODE CMD...|down|status|logs|env|import ARCHIVE...|restart containerd|kubelet [NODE]|cni on|off [NODE]|put-manifest NODE FILE|rm-manifest NODE FILE" ;;
esac
