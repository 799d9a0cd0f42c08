#!/usr/bin/env bash
# Test machines that boot a real OS image (tests/osimage/image.sh: Debian
# bookworm, systemd as PID 1, containerd, the kubelet and nodekeeper.service
# baked in) under systemd-nspawn, as real Kubernetes nodes of the test
# control plane (tests/controlplane/cluster.sh).
#
#   machine.sh up [N]        boot N machines os-0 … os-(N-1) (default 1), wait
#                            until each Node is Ready and nodekeeper.service is
#                            active in it, print the env lines
#   machine.sh exec NODE CMD…  run CMD inside the booted machine (nsenter into
#                            its PID 1's namespaces), e.g. `systemctl reboot`
#   machine.sh down          stop everything, remove every trace (idempotent)
#   machine.sh env           the shell-sourceable variables tests read (also in
#                            $NODEKEEPER_OSIMAGE_DIR/env while machines are up)
#   machine.sh status        exit 0 when every machine is booted and Ready
#   machine.sh supervise DIR the host side of one machine (`up` starts it):
#                            boots it, boots it again when nspawn exits 133
#                            (the machine asked to reboot), stops on any other
#                            exit or when DIR/halt appears
#
# Each machine: an overlay (lower: the cached image, read-only; upper:
# DIR/upper, its disk, kept across reboots) mounted at DIR/root and booted
# with `systemd-nspawn --boot --register=no --keep-unit` (this host's PID 1 is
# not systemd: no machined to register with, no unit to move into). Inside:
# systemd starts nk-cgroup-rw, containerd, the sandbox image import, the
# kubelet and nodekeeper as units of the image. A reboot is systemd's own
# (`systemctl reboot`: units stopped, nspawn exits 133); the next boot has a
# new boot ID (nspawn binds a fresh /proc/sys/kernel/random/boot_id) and a
# fresh /run, the same /etc and /var.
#
# What is per machine, written into DIR/root before the first boot (the
# image stays generic): the kubelet's kubeconfig (a client certificate for
# system:node:os-<i> signed by the cluster CA) and the CA, its ports and
# taints (/etc/kubernetes/kubelet.conf.d/10-machine.conf), its node label
# (/etc/default/kubelet), its pod network (/etc/cni/net.d), and
# drop-ins for the packaged nodekeeper.service: the machine's metrics port
# (every machine shares the host network; 127.0.0.1:9477 would collide) and
# the chosen profile's drop-in linked in. Once the Node is registered, nodekeeper's host kubeconfig
# (`nodekeeper host-kubeconfig os-<i>` with the cluster's admin kubeconfig,
# the README's systemd recipe) lands in /etc/nodekeeper/kubeconfig; the unit
# retries every 5 s until it is there.
#
# Living beside tests/realnode/node.sh (its real-<i> nodes and kube-proxy may
# run at the same time): everything this makes outside its folder is named
# apart from node.sh's. Cgroups /nkos-<run>-<i> (the machine's cgroup
# namespace root: its kubelet's "/" is there), bridges nkos<run>b<i>, pod
# subnets 10.89.x.0/24 (node.sh uses 10.88.x.0/24), kubelet ports from 11250
# and healthz ports from 11350 (node.sh: 10250, 10350), nodekeeper metrics
# from 19477, label nodekeeper.test/os-machine=true (node.sh's `down` deletes
# the Nodes labelled nodekeeper.test/real-node), ClusterRoleBinding
# nodekeeper-osimage-system-node. <run> is six hex digits of a hash of
# NODEKEEPER_OSIMAGE_DIR. No kube-proxy: the kubelets and nodekeeper reach
# the API server by its address; a pod needing Services relies on node.sh's
# kube-proxy when it runs.
#
# Outside its folder, `up` also changes (and `down` restores) the host
# sysctls the kubelet insists on (vm.overcommit_memory, vm.panic_on_oom,
# kernel.panic, kernel.panic_on_oops, kernel.keys.root_max*) and
# net.ipv4.ip_forward (CNI bridge): they are global, not per container, and
# /proc/sys is read-only inside nspawn, so they are set from outside, where a
# kubelet finds them already right and writes nothing. It also applies
# nodekeeper's CRDs, RBAC and admission policy (`nodekeeper crds`,
# `manifests --for rbac|admission`, as the tests do; left in place).
#
# Records, in DIR = $NODEKEEPER_OSIMAGE_DIR/os-<i> (host paths):
#   machine.log  `boot MS BOOT_ID` (the ID read from inside), `down MS
#                exit=RC` (MS: ms since the epoch, host clock)
#   console.log  the machine's console (systemd's boot and shutdown messages)
#   init.pid     the host PID of the current boot's PID 1 (systemd)
#   boot_id      the current boot's ID
#
# A machine may take nodekeeper from a systemd system extension instead
# (NODEKEEPER_OSIMAGE_SYSEXT=I:RAW, RAW from image/sysext.sh): before its
# first boot, os-I's own copy of the image loses the package (`dpkg
# --purge` in it: an image built without it) and gains RAW in
# /var/lib/extensions/, systemd-sysext.service enabled and a unit that
# reloads systemd after the merge (see sysext_machine). nspawn then gives
# that machine the host's loop devices: systemd-sysext mounts the image
# through one.
#
# Environment: NODEKEEPER_OSIMAGE_DIR (default ~/.cache/nodekeeper/osmachines),
# NODEKEEPER_OSIMAGE_PROFILE (nodekeeper.service profile: default, reboot or
# upgrade; default reboot), NODEKEEPER_OSIMAGE_TIMEOUT (seconds to wait for
# Ready, default 120), NODEKEEPER_OSIMAGE_TAINT (default
# nodekeeper.test/os-machine=true:NoSchedule, empty for none), and what
# image.sh reads (NODEKEEPER_OSIMAGE_NODEKEEPER, …), NODEKEEPER_CACHE_DIR,
# NODEKEEPER_CLUSTER_DIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster_sh=$here/../controlplane/cluster.sh
# kc, waits, ports, cgroups, mounts, sysctls, client credentials.
# shellcheck source=tests/machine-lib.sh
source "$here/../machine-lib.sh"
cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
cluster_dir=${NODEKEEPER_CLUSTER_DIR:-$cache_root/cluster}
dir=${NODEKEEPER_OSIMAGE_DIR:-$cache_root/osmachines}
profile=${NODEKEEPER_OSIMAGE_PROFILE:-reboot}
ready_timeout=${NODEKEEPER_OSIMAGE_TIMEOUT:-120}
taint=${NODEKEEPER_OSIMAGE_TAINT-nodekeeper.test/os-machine=true:NoSchedule}
sysext=${NODEKEEPER_OSIMAGE_SYSEXT:-}
label=nodekeeper.test/os-machine
run_id=$(printf '%s' "$dir" | sha1sum | cut -c1-6)
cgroup_prefix=nkos-$run_id-
# The sysctls the kubelet sets when they differ (setupKernelTunables), with
# its values, and the CNI bridge's forwarding.
kernel_tunables=(vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1
  kernel.keys.root_maxkeys=1000000 kernel.keys.root_maxbytes=25000000 net.ipv4.ip_forward=1)

log() { echo "osmachine: $*" >&2; }
die() { echo "osmachine: error: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

node_name() { echo "os-$1"; }
mdir() { echo "$dir/os-$1"; }
bridge_of() { echo "nkos${run_id}b$1"; }

taken_ports=" "

# The machine's PID 1 (systemd, host PID) of the current boot.
machine_init() {
  local pid
  pid=$(cat "$(mdir "$1")/init.pid" 2>/dev/null) || return 1
  [[ -n $pid ]] && running "$pid" && echo "$pid"
}

# Run a command in a machine: every namespace of its PID 1 (mount, PID, UTS,
# IPC, cgroup; the network is the host's anyway).
in_machine() {
  local init=$1
  shift
  nsenter -t "$init" -m -u -i -p -C -- "$@"
}

# ------------------------------------------------------------- supervisor

# Empty cgroups the last boot's kubelet and systemd left (cgroup v1 is not
# torn down with the namespace): removed so the next boot starts clean.
clean_cgroups() {
  local h
  for h in $(hierarchies); do
    [[ -d $h$cgroup ]] || continue
    find "$h$cgroup" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# Put this process (and so nspawn and the machine) into the machine's cgroup
# in every hierarchy. cpuset first needs cpus and mems, or joining fails
# with ENOSPC (and the machine would see the host's cpuset root).
enter_cgroups() {
  local h
  for h in $(hierarchies); do
    mkdir -p "$h$cgroup"
    if [[ -f $h$cgroup/cpuset.cpus && -z $(cat "$h$cgroup/cpuset.cpus") ]]; then
      cat "$h/cpuset.cpus" >"$h$cgroup/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h$cgroup/cpuset.mems"
    fi
    echo $BASHPID >"$h$cgroup/cgroup.procs"
  done
}

# The boot ID as the machine's own processes read it. nspawn binds a fresh
# one over /proc/sys/kernel/random/boot_id before it starts systemd; until
# then the file shows the host's.
read_boot_id() {
  local init=$1 host id _
  host=$(cat /proc/sys/kernel/random/boot_id)
  for _ in $(seq 100); do
    id=$(nsenter -t "$init" -m -- cat /proc/sys/kernel/random/boot_id 2>/dev/null) || id=""
    [[ -n $id && $id != "$host" ]] && { echo "$id"; return; }
    sleep 0.05
  done
  echo "unknown"
}

# The container's PID 1 among nspawn's children: the one that is PID 1 in
# its own PID namespace (NSpid ends in 1). nspawn first forks a helper that
# sets up the mounts and exits; the first child seen may be that helper.
find_init() {
  local n=$1 c _
  for _ in $(seq 500); do
    # shellcheck disable=SC2013 # one line of PIDs
    for c in $(cat "/proc/$n/task/$n/children" 2>/dev/null); do
      [[ $(awk '/^NSpid:/ {print $NF}' "/proc/$c/status" 2>/dev/null) == 1 ]] && { echo "$c"; return 0; }
    done
    running "$n" || return 1
    sleep 0.02
  done
  return 1
}

supervise() {
  cgroup=$(cat "$mdir_/cgroup")
  local name n rc init _
  name=$(cat "$mdir_/name")
  enter_cgroups
  local loop_binds l
  while :; do
    [[ -f $mdir_/halt ]] && exit 0
    clean_cgroups
    # A machine with a system extension: systemd-sysext attaches its image
    # to a free loop device (loop-control says which) and opens
    # /dev/loopN, which nspawn's /dev lacks: the host's nodes, bound in.
    # Made again before every boot where missing: the kernel removes a
    # loop device's node from /dev when the device is removed, as the last
    # boot's unmerge did.
    loop_binds=()
    if [[ -f $mdir_/sysext ]]; then
      loop_binds=(--bind=/dev/loop-control)
      for l in $(seq 0 15); do
        [[ -e /dev/loop$l ]] || mknod -m 0660 "/dev/loop$l" b 7 "$l"
        loop_binds+=("--bind=/dev/loop$l")
      done
    fi
    # SYSTEMD_NSPAWN_LOCK=0: no lock files under /run/systemd/nspawn/locks
    # to clean up. --capability=all: nk-cgroup-rw.service remounts the
    # cgroup controllers; the kubelet and runc need the rest. No --network-*
    # option: the host's network, like the realnode machines. /dev/kmsg: the
    # kubelet refuses to start without it (its OOM watcher reads it) and
    # nspawn gives a container none; the host's, read-only. The keyring
    # system calls: nspawn's seccomp filter refuses them with EPERM, and runc
    # (which tolerates only ENOSYS) then fails every container with "unable
    # to join session keyring".
    SYSTEMD_NSPAWN_LOCK=0 systemd-nspawn -q -D "$mdir_/root" --machine="$name" --boot \
      --register=no --keep-unit --capability=all --console=read-only --bind-ro=/dev/kmsg \
      --system-call-filter='add_key keyctl request_key' "${loop_binds[@]}" \
      </dev/null >>"$mdir_/console.log" 2>&1 &
    n=$!
    echo "$n" >"$mdir_/nspawn.pid"
    init=$(find_init "$n") || init=""
    if [[ -n $init ]]; then
      echo "$init" >"$mdir_/init.pid"
      read_boot_id "$init" >"$mdir_/boot_id.next"
      mv "$mdir_/boot_id.next" "$mdir_/boot_id"
      echo "boot $(now_ms) $(cat "$mdir_/boot_id")" >>"$mdir_/machine.log"
    fi
    rc=0
    wait "$n" || rc=$?
    echo "down $(now_ms) exit=$rc" >>"$mdir_/machine.log"
    : >"$mdir_/init.pid"
    # 133: the machine asked to reboot (as systemd-nspawn@.service's
    # RestartForceExitStatus=133). Anything else (poweroff is 0) stays off.
    ((rc == 133)) || exit 0
  done
}

# ---------------------------------------------------------------- host state

save_host_state() {
  [[ -f $dir/host.saved ]] && return
  mkdir -p "$dir"
  local t s
  for t in "${kernel_tunables[@]}"; do
    s=${t%%=*}
    [[ -e /proc/sys/${s//.//} ]] && echo "sysctl $s $(cat "/proc/sys/${s//.//}")"
  done >"$dir/host.saved.tmp"
  mv "$dir/host.saved.tmp" "$dir/host.saved"
}

set_kernel_tunables() {
  local t s v f
  for t in "${kernel_tunables[@]}"; do
    s=${t%%=*} v=${t#*=} f=/proc/sys/${s//.//}
    [[ -e $f ]] || continue
    [[ $(cat "$f") == "$v" ]] || echo "$v" >"$f" || die "cannot set $s=$v"
  done
}

# ------------------------------------------------------------------------ up

# What makes the generic image this machine (see the header).
provision() {
  local i=$1 d r
  d=$(mdir "$i")
  r=$d/root
  write_client_kubeconfig "$r/etc/kubernetes/kubelet.conf" "system:node:$(node_name "$i")" system:nodes
  install -m 0644 "$cluster_dir/pki/ca.crt" "$r/etc/kubernetes/pki/ca.crt"
  local taints=""
  if [[ -n $taint ]]; then
    local k=${taint%%=*} rest=${taint#*=}
    local v=${rest%%:*} e=${rest##*:}
    taints="registerWithTaints:
- {key: \"$k\", value: \"$v\", effect: \"$e\"}"
  fi
  cat >"$r/etc/kubernetes/kubelet.conf.d/10-machine.conf" <<EOF
# Written by tests/osimage/machine.sh: what this machine must not share with
# the others on the host network.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $(cat "$d/port")
healthzBindAddress: 127.0.0.1
healthzPort: $(cat "$d/healthz-port")
readOnlyPort: 0
$taints
EOF
  echo "KUBELET_EXTRA_ARGS=--node-labels=$label=true" >"$r/etc/default/kubelet"
  # The pod network: a bridge of its own, leases per boot (in /run).
  cat >"$r/etc/cni/net.d/10-nodekeeper.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "nkos$run_id-$i",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(bridge_of "$i")",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.89.$(cat "$d/subnet").0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "/run/cni-ipam"
      }
    }
  ]
}
EOF
  # nodekeeper.service as its package installed it, with drop-ins as an
  # operator adds them (README, Debian package): this machine's metrics
  # port (the packaged ExecStart with the address changed), and the chosen
  # profile's drop-in linked in.
  case $profile in
    default|reboot|upgrade) ;;
    *) die "NODEKEEPER_OSIMAGE_PROFILE must be default, reboot or upgrade (is $profile)" ;;
  esac
  local dropins=$r/etc/systemd/system/nodekeeper.service.d exec_start
  exec_start=$(installed_unit "$i" |
    sed -n 's/^ExecStart=\(.*\)--metrics-address [^ ]*\(.*\)$/\1--metrics-address 127.0.0.1:'"$(cat "$d/metrics-port")"'\2/p')
  [[ -n $exec_start ]] || die "the packaged nodekeeper.service has no ExecStart with --metrics-address"
  mkdir -p "$dropins"
  rm -f "$dropins"/*.conf
  printf '[Service]\nExecStart=\nExecStart=%s\n' "$exec_start" >"$dropins/10-machine.conf"
  case $profile in
    reboot) ln -s /usr/share/nodekeeper/systemd/reboot-cap-sys-admin.conf "$dropins/" ;;
    upgrade) ln -s /usr/share/nodekeeper/systemd/upgrade-host-root.conf "$dropins/" ;;
  esac
}

# The text of nodekeeper.service as machine $1 has it: its package's, or
# its system extension's (merged only once it boots).
installed_unit() {
  local d
  d=$(mdir "$1")
  if [[ -f $d/sysext ]]; then
    unsquashfs -cat "$d/root/var/lib/extensions/$(cat "$d/sysext")" usr/lib/systemd/system/nodekeeper.service
  else
    cat "$d/root/usr/lib/systemd/system/nodekeeper.service"
  fi
}

# Machine $1 takes nodekeeper from the system extension $2 instead of the
# package: its copy of the image loses the package (as if built without
# it) and is set up as an image for extensions is (Flatcar's, say):
# systemd-sysext.service enabled, the extension in /var/lib/extensions/
# under its own name (its release file carries that name), and a unit that
# reloads systemd once the extension is merged (the README's
# sysext-reload.service, taken from it). systemd 252 (Debian 12) merges
# without a reload, so the units the extension brings are loaded by nobody
# and their multi-user.target.wants link is read too late (systemd 255 and
# later reload by themselves; Flatcar's ensure-sysext.service does this
# for its own images).
sysext_machine() {
  local i=$1 raw=$2 d r
  d=$(mdir "$i")
  r=$d/root
  chroot "$r" dpkg --purge nodekeeper >/dev/null || die "dpkg --purge nodekeeper in $(node_name "$i")'s image failed"
  [[ ! -e $r/usr/bin/nodekeeper ]] || die "$(node_name "$i") still has /usr/bin/nodekeeper after the purge"
  install -D -m 0644 "$raw" "$r/var/lib/extensions/$(basename "$raw")"
  basename "$raw" >"$d/sysext"
  # The reload unit as the README gives it (its systemd system extension
  # section), so that what the README tells an operator is what boots.
  local unit
  unit=$(awk '/^# \/etc\/systemd\/system\/sysext-reload\.service/ {f = 1; next} f && /^```/ {exit} f' "$here/../../README.md")
  [[ $unit == *"[Service]"* ]] || die "README.md has no sysext-reload.service block (its systemd system extension section)"
  printf '%s\n' "$unit" >"$r/etc/systemd/system/sysext-reload.service"
  chroot "$r" systemctl enable -q systemd-sysext.service sysext-reload.service ||
    die "cannot enable systemd-sysext.service in $(node_name "$i")"
}

start_machine() {
  local i=$1 d
  d=$(mdir "$i")
  rm -f "$d/halt"
  # setsid + 9>&-: the supervisor outlives `up` and must not hold its lock.
  setsid bash "$here/machine.sh" supervise "$d" >>"$d/supervisor.log" 2>&1 </dev/null 9>&- &
  echo $! >"$d/supervisor.pid"
  disown $!
}

node_ready_or_dead() {
  node_ready "$1" && return 0
  alive "$(mdir "$1")/supervisor.pid" || die "the supervisor of machine $(node_name "$1") exited (see $(mdir "$1")/console.log)"
  return 1
}

nodekeeper_active() {
  local init
  init=$(machine_init "$1") || return 1
  [[ $(in_machine "$init" systemctl is-active nodekeeper.service 2>/dev/null) == active ]]
}

# nodekeeper's CRDs, RBAC and admission policy, as the tests apply them.
install_nodekeeper_api() {
  local nk=$1 target
  "$nk" crds | kc apply --server-side --force-conflicts -f - >/dev/null || die "cannot apply nodekeeper's CRDs"
  for target in rbac admission; do
    "$nk" manifests --for "$target" | kc apply --server-side --force-conflicts -f - >/dev/null ||
      die "cannot apply nodekeeper manifests --for $target"
  done
}

cmd_up() {
  local n=${1:-1}
  if ! [[ $n =~ ^[1-9][0-9]*$ ]] || ((n > 50)); then die "usage: machine.sh up [N], 1 <= N <= 50"; fi
  [[ $(id -u) == 0 ]] || die "machines need root"
  cluster_up || die "the control plane is not up: run tests/controlplane/cluster.sh up first"
  [[ -f $cluster_dir/pki/ca.key ]] || die "no cluster CA key at $cluster_dir/pki/ca.key"
  local c
  for c in openssl ss nsenter; do command -v "$c" >/dev/null || die "'$c' is missing"; done
  setup_kubectl
  local wanted="$n machine(s)"
  if [[ -n $sysext ]]; then
    [[ $sysext =~ ^[0-9]+:.+/nodekeeper-[^/]+\.raw$ && -f ${sysext#*:} ]] ||
      die "NODEKEEPER_OSIMAGE_SYSEXT must be I:PATH of a nodekeeper-*.raw (is $sysext)"
    ((${sysext%%:*} < n)) || die "NODEKEEPER_OSIMAGE_SYSEXT names machine ${sysext%%:*} of $n"
    command -v unsquashfs >/dev/null || die "unsquashfs is missing (apt-get install squashfs-tools)"
    wanted+=", os-${sysext%%:*} from $(basename "${sysext#*:}") $(sha256sum "${sysext#*:}" | cut -c1-16)"
  fi
  if [[ -f $dir/wanted && $(cat "$dir/wanted") == "$wanted" ]] && all_up; then
    log "already up: $n machine(s)"
    cmd_env
    return
  fi
  if [[ -e $dir ]]; then
    log "taking down what a previous up left"
    cmd_down
  fi

  local start=$SECONDS image
  image=$("$here/image.sh" build) || die "image.sh build failed"
  command -v systemd-nspawn >/dev/null || die "systemd-nspawn is missing (apt-get install systemd-container)"
  log "image $image ready in $((SECONDS - start)) s"
  mkdir -p "$dir"
  trap 'on_up_exit' EXIT
  save_host_state
  set_kernel_tunables
  echo "$n" >"$dir/count"
  echo "$wanted" >"$dir/wanted"
  echo "$image" >"$dir/image"
  echo "$profile" >"$dir/profile"

  grant_nodes_their_role nodekeeper-osimage-system-node || die "cannot create the ClusterRoleBinding for nodes"
  install_nodekeeper_api "$image/usr/bin/nodekeeper"

  local i d
  for i in $(seq 0 $((n - 1))); do
    d=$(mdir "$i")
    mkdir -p "$d/upper" "$d/work" "$d/root"
    node_name "$i" >"$d/name"
    echo "/$cgroup_prefix$i" >"$d/cgroup"
    free_subnet 10.89 >"$d/subnet" || die "no free 10.89.x.0/24 for $(node_name "$i")"
    free_port 11250; echo "$port" >"$d/port"
    free_port 11350; echo "$port" >"$d/healthz-port"
    free_port 19477; echo "$port" >"$d/metrics-port"
    mount -t overlay overlay -o "lowerdir=$image,upperdir=$d/upper,workdir=$d/work" "$d/root" ||
      die "cannot mount the overlay for $(node_name "$i")"
    [[ -z $sysext || $i != "${sysext%%:*}" ]] || sysext_machine "$i" "${sysext#*:}"
    provision "$i"
    start_machine "$i"
  done
  for i in $(seq 0 $((n - 1))); do
    wait_until "$ready_timeout" node_ready_or_dead "$i" || die "node $(node_name "$i") is not Ready within ${ready_timeout}s (see $(mdir "$i")/console.log, machine.sh exec $(node_name "$i") journalctl -u kubelet)"
    log "$(node_name "$i") Ready after $((SECONDS - start)) s"
  done
  # The README's systemd recipe, last step: the host kubeconfig, once the
  # Node exists (the token is bound to it).
  for i in $(seq 0 $((n - 1))); do
    d=$(mdir "$i")
    "$image/usr/bin/nodekeeper" host-kubeconfig "$(node_name "$i")" --kubeconfig "$cluster_dir/kubeconfig" \
      --out "$d/root/etc/nodekeeper/kubeconfig" >/dev/null 2>&1 || die "nodekeeper host-kubeconfig $(node_name "$i") failed"
  done
  for i in $(seq 0 $((n - 1))); do
    wait_until 60 nodekeeper_active "$i" || die "nodekeeper.service is not active in $(node_name "$i") within 60 s"
  done
  write_env
  trap - EXIT
  log "up: $n machine(s) Ready in $((SECONDS - start)) s"
  cmd_env
}

on_up_exit() {
  local rc=$?
  ((rc == 0)) && return
  log "up failed; the machines are left as they are for a look (machine.sh down removes them)"
}

all_up() {
  local i
  [[ -f $dir/env ]] || return 1
  for i in $(recorded); do
    alive "$(mdir "$i")/supervisor.pid" && machine_init "$i" >/dev/null && node_ready "$i" || return 1
  done
}

# ---------------------------------------------------------------------- env

write_env() {
  local i d
  {
    echo "# tests/osimage/machine.sh env: KEY='value' lines, values never hold a quote"
    echo "NODEKEEPER_OSIMAGE_DIR='$dir'"
    echo "NODEKEEPER_OSIMAGE_IMAGE='$(cat "$dir/image")'"
    echo "NODEKEEPER_OSIMAGE_PROFILE='$(cat "$dir/profile")'"
    echo "NODEKEEPER_OSIMAGE_COUNT='$(cat "$dir/count")'"
    echo "NODEKEEPER_OSIMAGE_NODES='$(for i in $(recorded); do printf '%s ' "$(node_name "$i")"; done | sed 's/ $//')'"
    echo "NODEKEEPER_OSIMAGE_LABEL='$label=true'"
    echo "NODEKEEPER_OSIMAGE_TAINT='$taint'"
    echo "NODEKEEPER_OSIMAGE_KUBECONFIG='$cluster_dir/kubeconfig'"
    for i in $(recorded); do
      d=$(mdir "$i")
      echo "# machine $i (paths on the host; ROOT is its / while it is up)"
      echo "NODEKEEPER_OSIMAGE_${i}_NAME='$(node_name "$i")'"
      echo "NODEKEEPER_OSIMAGE_${i}_DIR='$d'"
      echo "NODEKEEPER_OSIMAGE_${i}_ROOT='$d/root'"
      if [[ -f $d/sysext ]]; then
        echo "NODEKEEPER_OSIMAGE_${i}_INSTALL='sysext $(cat "$d/sysext")'"
      else
        echo "NODEKEEPER_OSIMAGE_${i}_INSTALL='package'"
      fi
      echo "NODEKEEPER_OSIMAGE_${i}_MANIFESTS='$d/root/etc/kubernetes/manifests'"
      echo "NODEKEEPER_OSIMAGE_${i}_MACHINE_LOG='$d/machine.log'"
      echo "NODEKEEPER_OSIMAGE_${i}_CONSOLE_LOG='$d/console.log'"
      echo "NODEKEEPER_OSIMAGE_${i}_KUBELET_PORT='$(cat "$d/port")'"
      echo "NODEKEEPER_OSIMAGE_${i}_HEALTHZ_PORT='$(cat "$d/healthz-port")'"
      echo "NODEKEEPER_OSIMAGE_${i}_METRICS_PORT='$(cat "$d/metrics-port")'"
      echo "NODEKEEPER_OSIMAGE_${i}_CGROUP='$(cat "$d/cgroup")'"
      echo "NODEKEEPER_OSIMAGE_${i}_BRIDGE='$(bridge_of "$i")'"
    done
  } >"$dir/env.tmp"
  mv "$dir/env.tmp" "$dir/env"
}

cmd_env() {
  [[ -f $dir/env ]] || die "no machines are up (machine.sh up)"
  cat "$dir/env"
}

cmd_status() {
  [[ -f $dir/count ]] || { echo "down"; return 1; }
  setup_kubectl
  local i ok=0 r init
  for i in $(recorded); do
    r=NotReady
    cluster_up && node_ready "$i" && r=Ready
    if init=$(machine_init "$i"); then
      echo "$(node_name "$i"): $r, PID 1 $init, boot $(cat "$(mdir "$i")/boot_id")"
    else
      echo "$(node_name "$i"): $r, not booted"
      ok=1
    fi
    [[ $r == Ready ]] || ok=1
  done
  return $ok
}

cmd_exec() {
  local node=${1:?usage: machine.sh exec NODE CMD...} i init found=""
  shift
  (($#)) || die "usage: machine.sh exec NODE CMD..."
  for i in $(recorded); do [[ $(node_name "$i") == "$node" ]] && found=$i; done
  [[ -n $found ]] || die "no machine named $node is up"
  init=$(machine_init "$found") || die "machine $node is not booted"
  exec 9>&-
  # The machine's environment, not the caller's (PATH of a Debian root).
  exec nsenter -t "$init" -m -u -i -p -C -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb "$@"
}

# ---------------------------------------------------------------------- down

kill_wait() {
  local pid=$1 _
  kill -KILL "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do running "$pid" || return 0; sleep 0.05; done
}

cmd_down() {
  [[ -e $dir ]] || { log "down"; return 0; }
  [[ $(id -u) == 0 ]] || die "down needs root"
  local d pid
  # Supervisors first (nothing boots again), then each machine's PID 1: the
  # kernel ends every process of its PID namespace, pods included; nspawn
  # then exits.
  for d in "$dir"/os-*; do
    [[ -d $d ]] || continue
    touch "$d/halt"
    [[ -f $d/supervisor.pid ]] && kill_wait "$(cat "$d/supervisor.pid")"
    [[ -s $d/init.pid ]] && kill_wait "$(cat "$d/init.pid")"
    [[ -f $d/nspawn.pid ]] && kill_wait "$(cat "$d/nspawn.pid")"
  done
  # Anything still in our cgroups (an init killed before its children).
  local pids g
  for _ in 1 2 3 4 5; do
    pids=$(for g in $(our_cgroups); do cat "$g/cgroup.procs" 2>/dev/null; done | sort -un)
    [[ -n $pids ]] || break
    # shellcheck disable=SC2086 # a list of PIDs
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  # nspawn's per-machine folder on the host (/run/systemd/nspawn/propagate).
  for d in "$dir"/os-*; do
    [[ -f $d/name ]] && rm -rf "/run/systemd/nspawn/propagate/$(cat "$d/name")"
  done
  local br
  for br in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep "^nkos${run_id}b[0-9]*\$" || true); do
    ip link delete "$br" 2>/dev/null || true
  done
  umount_ours
  for _ in $(seq 10); do
    local left=0
    for g in $(our_cgroups); do rmdir "$g" 2>/dev/null || left=1; done
    ((left)) || break
    sleep 0.3
  done
  [[ -z $(our_cgroups) ]] || log "warning: cgroups left: $(our_cgroups | tr '\n' ' ')"
  restore_sysctls
  if cluster_up; then
    setup_kubectl
    local nodes node
    nodes=$(kc get nodes -l "$label=true" -o 'jsonpath={.items[*].metadata.name}' 2>/dev/null) || true
    for node in $nodes; do
      kc delete pods --all-namespaces --field-selector "spec.nodeName=$node" --force --grace-period=0 --wait=false >/dev/null 2>&1 || true
    done
    [[ -n $nodes ]] && { kc delete nodes -l "$label=true" --wait=true --timeout=30s >/dev/null 2>&1 || log "warning: could not delete nodes $nodes"; }
    kc delete clusterrolebinding nodekeeper-osimage-system-node --ignore-not-found >/dev/null 2>&1 || true
  else
    log "the control plane is down: no Node to delete"
  fi
  umount_ours
  rm -rf --one-file-system "$dir" || log "warning: could not remove $dir"
  log "down"
}

lock() {
  mkdir -p "$cache_root"
  exec 9>"$cache_root/osmachines.lock"
  flock -w 300 9 || die "another machine.sh holds $cache_root/osmachines.lock"
}

case ${1:-} in
  up) shift; lock; cmd_up "$@" ;;
  down) lock; cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  exec) shift; cmd_exec "$@" ;;
  supervise) mdir_=$2; supervise ;;
  *) die "usage: machine.sh up [N] | exec NODE CMD... | down | env | status | supervise DIR" ;;
esac
