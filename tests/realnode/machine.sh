#!/usr/bin/env bash
# A test machine (tests/realnode/node.sh up N --machine): a PID + mount
# namespace whose PID 1 is `machine.sh init`, running the node's own
# containerd and kubelet. It is what lets the tests reboot a real kubelet
# node for real, on a host they cannot reboot:
#
#   machine.sh supervise DIR  the host side, one per machine (node.sh starts
#                             it): boots the machine, waits for its PID 1 to
#                             end, records the end and boots it again, with a
#                             new boot ID and the same disks, until DIR/halt
#                             appears; while DIR/off exists it waits (the
#                             machine is "off")
#   machine.sh init DIR       PID 1 inside the machine (the supervisor runs it
#                             under `unshare --pid --mount --fork`)
#   machine.sh request-reboot DIR ARGS
#                             what `systemctl reboot` and `reboot` are inside
#                             the machine (DIR/reboot, bind-mounted over them,
#                             calls it): asks PID 1 to shut down and returns,
#                             as systemctl does
#
# What a machine has of its own, per boot (its mount namespace): /run and
# /dev/shm (fresh tmpfs, so /var/run/reboot-required is gone after a reboot,
# as on a real host), /proc (its PID namespace's), the boot ID (a file bound
# over /proc/sys/kernel/random/boot_id: the kubelet reports it as
# status.nodeInfo.bootID), and persistent across boots: /var (an overlay over
# the host's, upper layer in DIR/var), /etc/os-release (DIR/os-release: the
# kubelet's osImage; an "OS upgrade" rewrites it, in place, and reboots),
# containerd's store and the kubelet's folder (in DIR). It shares with the
# host: the network namespace (each machine has its own bridge and subnet),
# the rest of the file system, the cgroup v1 hierarchies (the kubelet's
# cgroup root is the machine's own; empty pod cgroups a boot leaves are
# removed before the next).
#
# Records, in DIR (host paths, read by the tests, never by nodekeeper):
#   machine.log  one line per event: `boot MS BOOT_ID`, `reboot-requested MS
#                ARGS`, `shutdown MS`, `down MS exit=RC` (MS: ms since epoch)
#   init.pid     the host PID of the current boot's PID 1
#   boot_id      the current boot's ID
# Knobs, files in DIR: `off` (do not boot), `halt` (supervisor ends),
# `shutdown-delay` (seconds PID 1 takes between a reboot request and going
# down, like systemd stopping its units; default 0).
set -euo pipefail

now_ms() { date +%s%3N; }
record() { echo "$* " >>"$dir/machine.log"; }

# ------------------------------------------------------------- supervisor

# Pod cgroups of the last boot (cgroup v1 is not namespaced here: they
# outlive the machine, empty): removed so the kubelet starts clean.
clean_cgroups() {
  local root h
  root=$(cat "$dir/cgroup-root")
  for h in /sys/fs/cgroup/*/; do
    [[ -L ${h%/} || ! -d $h${root#/} ]] && continue
    find "$h${root#/}" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

supervise() {
  local u child rc _
  while :; do
    while [[ -f $dir/off && ! -f $dir/halt ]]; do sleep 0.1; done
    [[ -f $dir/halt ]] && exit 0
    clean_cgroups
    cat /proc/sys/kernel/random/uuid >"$dir/boot_id.next"
    mv "$dir/boot_id.next" "$dir/boot_id"
    record "boot $(now_ms) $(cat "$dir/boot_id")"
    # --kill-child: if the supervisor is killed, its machine goes with it.
    unshare --pid --mount --fork --mount-proc --propagation private --kill-child=SIGKILL \
      -- bash "$0" init "$dir" >>"$dir/init.log" 2>&1 &
    u=$!
    child=""
    for _ in $(seq 100); do
      child=$(cat "/proc/$u/task/$u/children" 2>/dev/null | awk '{print $1}')
      [[ -n $child ]] && break
      sleep 0.02
    done
    echo "$child" >"$dir/init.pid"
    rc=0
    wait "$u" || rc=$?
    record "down $(now_ms) exit=$rc"
  done
}

# ------------------------------------------------------------------- init

shutting_down=0
shutdown() {
  ((shutting_down)) && return
  shutting_down=1
  record "shutdown $(now_ms)"
  local delay=0
  [[ -f $dir/shutdown-delay ]] && delay=$(cat "$dir/shutdown-delay")
  # Like systemd stopping its units: the machine runs on for a while after
  # a reboot was asked for.
  ((delay > 0)) && sleep "$delay"
  # PID 1 ends: the kernel kills everything else in the namespace,
  # containers included, as a power cut would.
  exit 0
}

init() {
  mount -t tmpfs -o mode=0755 tmpfs /run
  mount -t tmpfs -o mode=1777 tmpfs /dev/shm
  mount --bind "$dir/boot_id" /proc/sys/kernel/random/boot_id
  mount --bind "$dir/os-release" /etc/os-release
  mkdir -p "$dir/var/upper" "$dir/var/work"
  mount -t overlay overlay -o "lowerdir=/var,upperdir=$dir/var/upper,workdir=$dir/var/work" /var
  local p
  for p in /usr/bin/systemctl /bin/systemctl /usr/sbin/reboot /sbin/reboot; do
    [[ -e $p ]] && mount --bind "$dir/reboot" "$p"
  done
  trap shutdown TERM INT
  mkdir -p /run/nk
  # Like systemd's Restart=always: a service that exits is started again a
  # second later (the kubelet exits when containerd's CRI is not
  # initialised yet, "server is not initialized yet").
  local containerd=0 kubelet=0 _
  while :; do
    if ((containerd == 0)) || ! kill -0 "$containerd" 2>/dev/null; then
      ((containerd == 0)) || echo "init: containerd exited; starting it again" >&2
      "$dir/start-containerd" >>"$dir/containerd.log" 2>&1 &
      containerd=$!
      for _ in $(seq 150); do [[ -S $dir/containerd.sock ]] && break; sleep 0.1; done
    fi
    if ((kubelet == 0)) || ! kill -0 "$kubelet" 2>/dev/null; then
      ((kubelet == 0)) || echo "init: the kubelet exited; starting it again" >&2
      "$dir/start-kubelet" >>"$dir/kubelet.log" 2>&1 &
      kubelet=$!
    fi
    # PID 1 reaps every orphan; `wait -n` returns when a service exits or
    # a trapped signal comes (the trap ends the machine).
    wait -n || true
    sleep 1
  done
}

# ----------------------------------------------------------- reboot command

reboot_cmd() {
  case " $* " in
    *" reboot "* | " ") ;;
    *)
      echo "$(basename "$0"): a test machine only knows 'reboot' (asked: $*)" >&2
      exit 1
      ;;
  esac
  # Only ever a machine's PID 1: run anywhere else, this would signal the
  # host's.
  if ! tr '\0' ' ' </proc/1/cmdline | grep -qF "machine.sh init $dir"; then
    echo "$(basename "$0"): not inside test machine $dir (PID 1 is $(tr '\0' ' ' </proc/1/cmdline))" >&2
    exit 1
  fi
  record "reboot-requested $(now_ms) $*"
  kill -TERM 1
}

case ${1:-} in
  supervise) dir=$2; supervise ;;
  init) dir=$2; init ;;
  request-reboot) dir=$2; shift 2; reboot_cmd "$@" ;;
  *) echo "usage: machine.sh supervise DIR | init DIR | request-reboot DIR ARGS..." >&2; exit 2 ;;
esac
