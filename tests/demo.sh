#!/usr/bin/env bash
# The README's live demo, on the local control plane with three simulated
# (kwok) nodes, each with its own nodekeeper agent, and a cluster role
# beside them, as the shipped layouts run them:
#   1. maintenance: a drain blocked by a PodDisruptionBudget, then released;
#   2. a rolling reboot of the three nodes under a budget of one: each node
#      is cordoned, drained, rebooted (a simulated machine: the agent dies,
#      the node goes NotReady and comes back with a new boot ID) and given
#      back in turn, shown live, while a watch of its own counts how many
#      nodes were unavailable at once;
#   3. an upgrade plan with a before hook: per node a Job runs elsewhere
#      first, then the drain, the upgrade command, the new version reported.
# It can be run again at once (it resets what it made). It leaves the
# cluster running (just cluster-down stops it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A fresh machine may not have run tests/check: install what the demo needs
# (not the real node's packages).
tests/install-prereqs --demo
bins=$(tests/controlplane/cluster.sh build)
export KUBECONFIG
KUBECONFIG=$(tests/controlplane/cluster.sh up)
kubectl=("$bins/kubectl")
cargo build --quiet
nk=$PWD/target/debug/nodekeeper
work=$(mktemp -d)
nodes=(demo-1 demo-2 demo-3)
others=()
cleanup() {
  # The machines' server first (it restarts agents), then the agents (their
  # PIDs are in files: the server restarts them in a subshell).
  for pid in "${others[@]}"; do kill "$pid" 2>/dev/null || true; done
  for f in "$work"/*.pid; do [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null || true; done
  "${kubectl[@]}" delete namespace demo --ignore-not-found --wait=false >/dev/null 2>&1 || true
  # Only the demo's own objects: never anyone else's.
  "${kubectl[@]}" delete nm demo-1 --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "${kubectl[@]}" delete rebootpolicy demo --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "${kubectl[@]}" delete upgradeplan demo --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
k() { "${kubectl[@]}" "$@"; }

# wait_for WHAT SECONDS COMMAND...: run COMMAND every 0.1 s until it
# succeeds; fail the demo with WHAT after SECONDS.
wait_for() {
  local what=$1 limit=$2
  shift 2
  for _ in $(seq $((limit * 10))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "demo: timed out after ${limit}s waiting for $what" >&2
  exit 1
}

# A node's agent: its own host root (no sentinel file of this machine's)
# and command records, as /run would be on its host.
start_agent() {
  local n=$1
  mkdir -p "$work/$n.root/var/run"
  $nk run --node "$n" --host-root "$work/$n.root" --command-records "$work/$n.records" \
    --metrics-address 127.0.0.1:0 >>"$work/$n.log" 2>&1 &
  echo $! >"$work/$n.pid"
  disown # its death with the simulated power is no news for this shell
}

say "installing the CRDs: nodekeeper crds | kubectl apply -f -"
$nk crds | k apply --server-side --force-conflicts -f - >/dev/null
for crd in nodemaintenances.nodemaintenance.medik8s.io rebootpolicies.nodekeeper.io upgradeplans.nodekeeper.io; do
  k wait --for=condition=Established "crd/$crd" >/dev/null
done

say "three simulated nodes, each with its own nodekeeper agent, and the cluster role"
for n in "${nodes[@]}"; do
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $n
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, demo: "true", kubernetes.io/hostname: $n}
YAML
  # The version the "OS" reports (the upgrade below moves it to v2), and
  # uncordoned: a run stopped half-way may have left either.
  k label node "$n" demo.nodekeeper.io/os=v1 --overwrite >/dev/null
  # A kubelet reports the boot ID of its machine; kwok reports none. Without
  # one a reboot could not be verified (nodekeeper would refuse to start it).
  if [[ -z $(k get node "$n" -o jsonpath='{.status.nodeInfo.bootID}') ]]; then
    k patch node "$n" --subresource=status \
      -p "{\"status\": {\"nodeInfo\": {\"bootID\": \"boot-$RANDOM$RANDOM\"}}}" >/dev/null
  fi
  k uncordon "$n" >/dev/null
  start_agent "$n"
done
# The cluster role admits reboots and upgrades (one node at a time here);
# the agents drain, reboot and upgrade their own nodes. Scoped to the demo's
# nodes, with a leader Lease of its own.
$nk run --all-nodes --node-agents --node-selector demo=true --leader-namespace kube-system \
  --metrics-address 127.0.0.1:0 >"$work/cluster-role.log" 2>&1 &
others+=($!)
k wait --for=condition=Ready node/demo-1 node/demo-2 node/demo-3 >/dev/null
# What a previous run left, with the agents and the cluster role running to
# give back what it held: its plans, its maintenance, its namespace
# (creating into a namespace still being deleted fails, and the drain would
# find nothing to do).
k delete rebootpolicy demo --ignore-not-found --timeout=60s >/dev/null
k delete upgradeplan demo --ignore-not-found --timeout=60s >/dev/null
k delete nm demo-1 --ignore-not-found --timeout=60s >/dev/null
if k get namespace demo >/dev/null 2>&1; then
  k delete namespace demo --ignore-not-found --wait=false >/dev/null
  k wait --for=delete namespace/demo --timeout=120s >/dev/null
fi
k get nodes -l demo=true

say "a Deployment of 6 pods and a PodDisruptionBudget (minAvailable 6)"
k create namespace demo >/dev/null
k apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {demo: "true"}
      # Two pods per node, so demo-1 always has some to drain; a node in
      # maintenance (tainted) leaves the count.
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
           nodeTaintsPolicy: Honor, labelSelector: {matchLabels: {app: web}}}
      terminationGracePeriodSeconds: 0
      containers: [{name: web, image: registry.invalid/web:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: demo}
spec:
  # No eviction allowed at first, so the drain shows what blocks it; the
  # demo then scales the Deployment up, which makes room.
  minAvailable: 6
  selector: {matchLabels: {app: web}}
YAML
k -n demo rollout status deploy/web --timeout=60s >/dev/null
k -n demo get pods -o wide

say "1. maintenance — what draining demo-1 would do: nodekeeper drain --dry-run demo-1"
$nk drain --dry-run demo-1

say "nodekeeper maintain demo-1 --reason 'kernel update' --wait"
$nk maintain demo-1 --reason "kernel update" --wait &
maintain=$!
others+=($maintain)
blocked() { test -n "$(k get nm demo-1 -o jsonpath='{.status.lastError}')"; }
wait_for "the drain to report what blocks it" 60 blocked
say "the PDB allows no eviction (6 of 6 must stay); scaling web to 8 makes room"
k -n demo scale deploy/web --replicas=8 >/dev/null
wait "$maintain"

say "demo-1 is cordoned and tainted; its pods now run elsewhere"
k get nm
k get nodes -l demo=true
k -n demo get pods -o wide

say "nodekeeper unmaintain demo-1 --wait"
$nk unmaintain demo-1 --wait
k get nodes -l demo=true

# --- the simulated machines -------------------------------------------------

# A reboot: the power goes (the agent dies with it), kwok lets go of the
# node, which reports NotReady and, once back, a new boot ID; the machine is
# down for a second, then kwok takes the node back, it is Ready, and the
# agent starts again (as its systemd unit or DaemonSet would).
reboot_machine() {
  local n=$1
  local pid
  pid=$(cat "$work/$n.pid")
  kill -9 "$pid" 2>/dev/null || true
  wait_for "$n's agent to die with the power" 10 eval "! kill -0 $pid 2>/dev/null"
  k annotate node "$n" kwok.x-k8s.io/node- >/dev/null
  local now
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  k patch node "$n" --subresource=status -p "{\"status\": {
    \"nodeInfo\": {\"bootID\": \"boot-$RANDOM$RANDOM\"},
    \"conditions\": [{\"type\": \"Ready\", \"status\": \"False\", \"reason\": \"Rebooting\",
      \"message\": \"simulated machine is rebooting\", \"lastHeartbeatTime\": \"$now\",
      \"lastTransitionTime\": \"$now\"}]}}" >/dev/null
  sleep 1 # the machine is down for a second: simulated time, not a wait
  k annotate node "$n" kwok.x-k8s.io/node=fake >/dev/null
  wait_for "$n Ready after its reboot" 60 k wait --for=condition=Ready "node/$n" --timeout=1s
  start_agent "$n"
}

# An upgrade: the new "OS" reports its version (here a node label the
# plan's versionFrom reads).
upgrade_machine() {
  local n=$1 version=$2
  k label node "$n" "demo.nodekeeper.io/os=$version" --overwrite >/dev/null
}

# Serve the commands the agents run on their hosts: each appends a line to
# the node's file; every new line is one reboot or one upgrade.
serve_machines() {
  declare -A seen=()
  while :; do
    for n in "${nodes[@]}"; do
      for kind in reboots upgrades; do
        local f="$work/$n.$kind" have
        have=$( [[ -f $f ]] && wc -l <"$f" || echo 0)
        while (( ${seen[$n.$kind]:-0} < have )); do
          seen[$n.$kind]=$(( ${seen[$n.$kind]:-0} + 1 ))
          if [[ $kind == reboots ]]; then
            reboot_machine "$n"
          else
            upgrade_machine "$n" "$(sed -n "${seen[$n.$kind]}p" "$f")"
          fi
        done
      done
    done
    sleep 0.1
  done
}

# The live view: a line per node whenever its row of `nodekeeper status`
# changes (the SINCE column aside).
live_view() {
  local start=$SECONDS
  declare -A last=()
  while :; do
    while read -r line; do
      local n=${line%% *}
      [[ $n == demo-* ]] || continue
      local key
      key=$(tr -s ' ' <<<"$line" | sed -E 's/ [0-9]+[smhd]([0-9]+[smhd])* / /g')
      if [[ ${last[$n]:-} != "$key" ]]; then
        last[$n]=$key
        printf '  %3ss  %s\n' $((SECONDS - start)) "$line"
      fi
    done < <($nk status 2>/dev/null)
    sleep 0.2
  done
}

# An independent watch (kubectl's, not nodekeeper's status): every change
# of a demo node, as "name unschedulable ready"; a node is unavailable when
# cordoned or not Ready.
watch_nodes() {
  k get nodes -l demo=true --watch --output-watch-events=false -o \
    jsonpath='{.metadata.name} cordoned={.spec.unschedulable} ready={.status.conditions[?(@.type=="Ready")].status}{"\n"}' \
    >"$1" 2>/dev/null
}
# The most nodes unavailable at once in such a record.
most_unavailable() {
  awk '{ down[$1] = ($2 == "cordoned=true" || $3 != "ready=True"); n = 0; for (k in down) n += down[k]; if (n > max) max = n }
       END { print max + 0 }' "$1"
}

# A wave's observers: kubectl's node watch into the file $1 and the live
# view (its PID in $view, stopped when the wave is done).
watch_wave() {
  watch_nodes "$1" &
  others+=($!)
  live_view &
  view=$!
  others+=($view)
}

# Print a manifest and apply it.
show_and_apply() {
  local yaml
  yaml=$(cat)
  sed 's/^/    /' <<<"$yaml"
  k apply -f - >/dev/null <<<"$yaml"
}

serve_machines &
others+=($!)

# --- 2. a rolling reboot ----------------------------------------------------

say "2. a rolling reboot of the three nodes, one at a time (RebootPolicy, budget 1)"
boots_before=$(k get nodes -l demo=true -o jsonpath='{range .items[*]}{.metadata.name}={.status.nodeInfo.bootID} {end}')
show_and_apply <<YAML
apiVersion: nodekeeper.io/v1alpha1
kind: RebootPolicy
metadata: {name: demo}
spec:
  nodeSelector: {matchLabels: {demo: "true"}}
  budget: {maxUnavailable: 1}
  reboot:
    # On a real host: the default, systemctl reboot. Here: tell the
    # simulated machine.
    command: [/bin/sh, -c, 'echo reboot >> "\$0"', "$work/{node}.reboots"]
    returnTimeoutSeconds: 120
YAML
say "nodekeeper reboot-required demo-N (on a host: its /var/run/reboot-required); live: nodekeeper status, a line per change"
watch_wave "$work/reboot-watch"
for n in "${nodes[@]}"; do $nk reboot-required "$n" >/dev/null; done
# Done, and given back: no demo node cordoned.
all_schedulable() { test -z "$(k get nodes -l demo=true -o jsonpath='{.items[*].spec.unschedulable}')"; }
rebooted() { test "$(k get rebootpolicy demo -o jsonpath='{.status.done}')" = 3 && all_schedulable; }
wait_for "the three reboots" 240 rebooted
kill "$view" 2>/dev/null; wait "$view" 2>/dev/null || true
k get rebootpolicy demo
boots_after=$(k get nodes -l demo=true -o jsonpath='{range .items[*]}{.metadata.name}={.status.nodeInfo.bootID} {end}')
for n in "${nodes[@]}"; do
  before=$(tr ' ' '\n' <<<"$boots_before" | sed -n "s/^$n=//p")
  after=$(tr ' ' '\n' <<<"$boots_after" | sed -n "s/^$n=//p")
  reboots=$(wc -l <"$work/$n.reboots")
  echo "$n: rebooted $reboots time(s), boot ID $before → $after"
  if [[ $reboots != 1 || $before == "$after" ]]; then
    echo "demo: $n was not rebooted exactly once" >&2
    exit 1
  fi
done
echo "most nodes unavailable at once (kubectl's own watch): $(most_unavailable "$work/reboot-watch") of 3"
k get nodes -l demo=true

# --- 3. an upgrade with a before hook ---------------------------------------

say "3. an upgrade to v2 with a before hook (UpgradePlan, budget 1)"
k delete rebootpolicy demo --wait=true >/dev/null
show_and_apply <<YAML
apiVersion: nodekeeper.io/v1alpha1
kind: UpgradePlan
metadata: {name: demo}
spec:
  nodeSelector: {matchLabels: {demo: "true"}}
  version: v2
  versionFrom: {source: Label, key: demo.nodekeeper.io/os}
  strategy:
    type: InPlace
    # On a real host: your upgrade program. Here: tell the simulated machine.
    command: [/bin/sh, -c, 'echo "\$1" >> "\$0"', "$work/{node}.upgrades", "{version}"]
  budget: {maxUnavailable: 1}
  hooks:
    before:
      # Runs before each node is taken, on another node (a backup, a check).
      - name: backup
        namespace: demo
        deadlineSeconds: 60
        job:
          template:
            spec:
              restartPolicy: Never
              nodeSelector: {demo: "true"}
              tolerations: [{operator: Exists}]
              containers: [{name: backup, image: registry.invalid/backup:1}]
YAML
say "live: nodekeeper status, a line per change"
watch_wave "$work/upgrade-watch"
upgraded() { test "$(k get upgradeplan demo -o jsonpath='{.status.done}')" = 3 && all_schedulable; }
wait_for "the three upgrades" 240 upgraded
kill "$view" 2>/dev/null; wait "$view" 2>/dev/null || true
k get upgradeplan demo
say "the before hook's Jobs, one per node, each run before its node was taken"
k -n demo get jobs -L nodekeeper.io/upgrade-node
for n in "${nodes[@]}"; do
  echo "$n: upgrade command ran for $(paste -sd, "$work/$n.upgrades"); reports $(k get node "$n" -o jsonpath='{.metadata.labels.demo\.nodekeeper\.io/os}')"
done
echo "most nodes unavailable at once (kubectl's own watch): $(most_unavailable "$work/upgrade-watch") of 3"
k delete upgradeplan demo --wait=true >/dev/null

say "done; logs of the agents and the cluster role are in $work (just cluster-down stops the control plane)"
