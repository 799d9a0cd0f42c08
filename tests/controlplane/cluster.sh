#!/usr/bin/env bash
# The local test control plane: etcd (or kine) + kube-apiserver + kube-controller-manager
# + kube-scheduler + kwok (simulated kubelets). Everything listens on loopback
# except the API server, which also serves on this machine's address so that
# pods on real nodes reach it through the `kubernetes` Service (see
# detect_advertise_address). Admission is the API server's default set, so
# pods get service-account tokens as in any cluster.
#
#   cluster.sh build    build (or find in the cache) the binaries, print their folder
#   cluster.sh build-kubelet  the same for a kubelet and a kube-proxy of the
#                       same release for real nodes (tests/realnode/node.sh)
#   cluster.sh up       build if needed, start everything, wait until it serves
#   cluster.sh down     stop everything and remove the cluster's state
#   cluster.sh status   exit 0 when a cluster is up and answering
#   cluster.sh logs     print the tail of every component's log
#
# The binaries come from tests/upstream/build.sh: one wrapper module for
# every upstream Go program the tests run, built with this machine's Go and
# cached outside the repo, so only the first run on a machine builds.
# NODEKEEPER_CONTROLPLANE_BIN names a folder of ready binaries instead (for
# example envtest assets plus a kwok build): it must hold kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok, etcd and kubectl;
# NODEKEEPER_KUBELET_BIN a folder holding kubelet and kube-proxy.
#
# NODEKEEPER_K8S=v1.34 (or v1.35, v1.36) runs that minor's kube-apiserver,
# kube-controller-manager and kube-scheduler (tests/upstream/build.sh
# controlplane-v1.34); the default is the main build's, v1.37.
#
# NODEKEEPER_FEATURE_GATES (e.g. NodeLifecycleConditions=true) is passed
# to kube-apiserver and kube-controller-manager as --feature-gates.
#
# NODEKEEPER_DATASTORE=kine stores the cluster in kine over sqlite, as k3s
# does by default, instead of etcd (tests/upstream/build.sh kine builds it;
# NODEKEEPER_KINE_BIN names a ready one). A running cluster of the other
# datastore is stopped and started afresh.
#
# The kubeconfig lands at $NODEKEEPER_CLUSTER_DIR/kubeconfig
# (default ~/.cache/nodekeeper/cluster/kubeconfig); component logs beside it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cache_root=${NODEKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekeeper}
cluster_dir=${NODEKEEPER_CLUSTER_DIR:-$cache_root/cluster}
# Test identities whose every request the audit log records (tests that
# count a process's requests run it as one of these).
audited=8
port=${NODEKEEPER_CLUSTER_PORT:-16443}
service_cidr=10.96.0.0/16
service_ip=10.96.0.1 # the `kubernetes` Service's ClusterIP: the range's first address
etcd_port=${NODEKEEPER_ETCD_PORT:-16379}

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }

datastore=${NODEKEEPER_DATASTORE:-etcd}
[[ $datastore == etcd || $datastore == kine ]] || die "NODEKEEPER_DATASTORE=$datastore: etcd or kine"
components=("$datastore" kube-apiserver kube-controller-manager kube-scheduler kwok)
# Every component any cluster may run, for stopping whatever runs.
every_component=(kwok kube-scheduler kube-controller-manager kube-apiserver etcd kine)

upstream=$here/../upstream/build.sh

k8s=${NODEKEEPER_K8S:-}
gates=${NODEKEEPER_FEATURE_GATES:-}
[[ -z $k8s || $k8s =~ ^v1\.[0-9]+$ ]] || die "NODEKEEPER_K8S=$k8s: a minor such as v1.34"

# The control plane's folder (kwok.yaml beside the binaries).
cmd_build() { "$upstream" "controlplane${k8s:+-$k8s}"; }

# The real nodes' kubelet and kube-proxy, of the control plane's release.
cmd_build_kubelet() { "$upstream" kubelet; }

kubeconfig() { echo "$cluster_dir/kubeconfig"; }

healthy() {
  [[ -f $cluster_dir/pki/token ]] || return 1
  curl -sf --max-time 2 --cacert "$cluster_dir/pki/ca.crt" \
    -H "Authorization: Bearer $(cat "$cluster_dir/pki/token")" \
    "https://127.0.0.1:$port/readyz" >/dev/null 2>&1
}

running() {
  local c
  for c in "${components[@]}"; do
    [[ -f $cluster_dir/$c.pid ]] && kill -0 "$(cat "$cluster_dir/$c.pid")" 2>/dev/null || return 1
  done
}

# The address the API server advertises: the endpoint of the `kubernetes`
# Service, to which kube-proxy on a real node (tests/realnode) sends what a
# pod addresses to the Service, as in any cluster. It must not be loopback
# (the API server refuses such an endpoint, and the kernel drops what a pod's
# packet would become), so it is this machine's primary IPv4 address, and
# the API server listens on every address (token and certificate
# authentication as on loopback; the cluster is throwaway). Without such an
# address the Service gets no endpoints: everything else works, pods off the
# host network cannot reach the API server.
detect_advertise_address() {
  local ipcmd="" addr="" c
  for c in "$(command -v ip || true)" /usr/sbin/ip /sbin/ip; do
    [[ -n $c && -x $c ]] && { ipcmd=$c; break; }
  done
  [[ -n $ipcmd ]] && addr=$("$ipcmd" -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1)
  if [[ -z $addr || $addr == 127.* ]]; then
    log "warning: no non-loopback IPv4 address with a route: the kubernetes Service gets no endpoints (pods off the host network cannot reach the API server)"
    addr=127.0.0.1
  fi
  echo "$addr" >"$cluster_dir/advertise-address"
}
advertise_address() { cat "$cluster_dir/advertise-address"; }

cmd_status() {
  if running && healthy; then
    echo "up: KUBECONFIG=$(kubeconfig)"
  else
    echo "down"
    return 1
  fi
}

# The client certificate the API server presents to admission webhooks
# (its AdmissionConfiguration's kubeConfigFile, user "*": every webhook),
# from a CA of its own: nodekeeper's webhook is tested answering only
# callers with it (`run --admission-client-ca pki/webhook-client-ca.crt`).
gen_webhook_client() {
  local p=$cluster_dir/pki
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=nodekeeper-test-webhook-client-ca" \
    -keyout "$p/webhook-client-ca.key" -out "$p/webhook-client-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver-webhook-client" \
    -keyout "$p/webhook-client.key" -out "$p/webhook-client.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$p/webhook-client.cnf"
  openssl x509 -req -in "$p/webhook-client.csr" -CA "$p/webhook-client-ca.crt" \
    -CAkey "$p/webhook-client-ca.key" -CAcreateserial -days 3650 \
    -extfile "$p/webhook-client.cnf" -out "$p/webhook-client.crt" 2>/dev/null
  cat >"$p/webhook-client.kubeconfig" <<EOF
apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: $p/webhook-client.crt
    client-key: $p/webhook-client.key
EOF
  cat >"$p/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $p/webhook-client.kubeconfig
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $p/webhook-client.kubeconfig
EOF
}

gen_pki() {
  local p=$cluster_dir/pki
  mkdir -p "$p"
  command -v openssl >/dev/null || die "openssl is needed to create the test cluster's certificates"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=nodekeeper-test-ca" \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$p/apiserver.key" -out "$p/apiserver.csr" 2>/dev/null
  # Clients reach the API server on loopback (kubeconfigs), at the advertised
  # address, and from pods at the `kubernetes` Service's ClusterIP (the
  # first address of --service-cluster-ip-range), which kube-proxy on the real
  # nodes translates to the advertised address.
  local san="IP:127.0.0.1,IP:$service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  [[ $(advertise_address) == 127.0.0.1 ]] || san+=",IP:$(advertise_address)"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$p/ext.cnf"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 3650 -extfile "$p/ext.cnf" -out "$p/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  openssl rand -hex 24 >"$p/token"
  openssl rand -hex 24 >"$p/bench-token"
  local i
  for i in $(seq 0 $((audited - 1))); do openssl rand -hex 24 >"$p/audited-token-$i"; done
  {
    echo "$(cat "$p/token"),nodekeeper-admin,nodekeeper-admin,system:masters"
    echo "$(cat "$p/bench-token"),nodekeeper-bench,nodekeeper-bench,system:masters"
    for i in $(seq 0 $((audited - 1))); do
      echo "$(cat "$p/audited-token-$i"),nodekeeper-audited-$i,nodekeeper-audited-$i,nodekeeper:audited"
    done
  } >"$p/tokens.csv"
  gen_webhook_client
  # The audit log records only the benchmark's identity and the audited
  # test identities: it is how benchmarks and tests count a process's API
  # requests without instrumenting it.
  cat >"$p/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [nodekeeper-bench]
- level: Metadata
  userGroups: ["nodekeeper:audited"]
- level: None
POLICY
}

write_kubeconfig() {
  write_kubeconfig_for "$cluster_dir/kubeconfig" nodekeeper-admin "$cluster_dir/pki/token"
  write_kubeconfig_for "$cluster_dir/kubeconfig-bench" nodekeeper-bench "$cluster_dir/pki/bench-token"
  local i
  for i in $(seq 0 $((audited - 1))); do
    write_kubeconfig_for "$cluster_dir/kubeconfig-audited-$i" "nodekeeper-audited-$i" "$cluster_dir/pki/audited-token-$i"
  done
}

write_kubeconfig_for() {
  local out=$1 user=$2 token=$3 ca
  ca=$(base64 -w0 <"$cluster_dir/pki/ca.crt")
  cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodekeeper-test
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $ca
users:
- name: $user
  user:
    token: $(cat "$token")
contexts:
- name: nodekeeper-test
  context: {cluster: nodekeeper-test, user: $user}
current-context: nodekeeper-test
EOF
  mv "$out.tmp" "$out"
}

start() {
  local name=$1
  shift
  setsid "$@" >"$cluster_dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$cluster_dir/$name.pid"
}

cmd_logs() {
  local c
  for c in "${components[@]}"; do
    [[ -f $cluster_dir/logs/$c.log ]] || continue
    echo "----- $c (last 25 lines of $cluster_dir/logs/$c.log) -----" >&2
    tail -n 25 "$cluster_dir/logs/$c.log" >&2
  done
}

fail_start() {
  echo "cluster: error: $*" >&2
  cmd_logs
  cmd_down >/dev/null 2>&1 || true
  exit 1
}

wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || fail_start "$what did not come up within ${limit}s"
    sleep 0.2
  done
}

etcd_healthy() { curl -sf --max-time 2 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"'; }
# kine answers health over gRPC only; a listening port is enough here, the
# API server's readyz checks the store itself.
kine_listening() { (exec 3<>"/dev/tcp/127.0.0.1/$etcd_port") 2>/dev/null; }

cmd_up() {
  # A cluster started by an older version of this script (no webhook
  # client certificate, audited users with rights of their own, kwok
  # without our stage) is started afresh.
  if running && healthy && [[ -f $cluster_dir/pki/admission.yaml ]] &&
    [[ -f $cluster_dir/kwok-stages.yaml ]] &&
    [[ $(cat "$cluster_dir/datastore" 2>/dev/null || echo etcd) == "$datastore" ]] &&
    [[ $(cat "$cluster_dir/k8s" 2>/dev/null) == "$k8s" ]] &&
    [[ $(cat "$cluster_dir/gates" 2>/dev/null) == "$gates" ]] &&
    ! grep -q 'system:masters,nodekeeper:audited' "$cluster_dir/pki/tokens.csv"; then
    echo "$(kubeconfig)"
    return
  fi
  local bins
  bins=$(cmd_build)
  cmd_down >/dev/null 2>&1 || true
  mkdir -p "$cluster_dir/logs"
  # A new cluster starts a new audit log: the old one's entries (and its
  # rotations at the API server's 100 MB limit) belong to the old cluster.
  rm -f "$cluster_dir"/logs/audit.log "$cluster_dir"/logs/audit-*.log
  : >"$cluster_dir/logs/.started"
  detect_advertise_address
  gen_pki
  write_kubeconfig
  local p=$cluster_dir/pki kc=$cluster_dir/kubeconfig
  log "starting control plane from $bins"

  start_datastore "$bins"
  start_apiserver "$bins"
  wait_for kube-apiserver 90 healthy

  # No serving ports for these two: nothing here scrapes them and fixed ports
  # would collide with a real cluster on the same machine.
  start kube-controller-manager "$bins/kube-controller-manager" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --leader-elect=false --secure-port=0 \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
    --controllers='*,-node-ipam-controller,-persistentvolume-binder-controller,-persistentvolume-attach-detach-controller,-persistentvolume-expander-controller,-ttl-controller' \
    --concurrent-deployment-syncs=10 --concurrent-replicaset-syncs=10 \
    --kube-api-qps=500 --kube-api-burst=1000 ${gates:+--feature-gates="$gates"}
  start kube-scheduler "$bins/kube-scheduler" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --leader-elect=false --secure-port=0 --kube-api-qps=500 --kube-api-burst=1000
  # kwok plays at most 4 pod and 4 node stages at once by default, each one
  # request: about 100 pods a second here, so bench-scale's 150 000 pods at
  # 5 000 nodes took over 35 minutes to run. 16 of each keep the API
  # server, not kwok, the limit (the stage files themselves stay kwokctl's).
  # A configuration file gets none of kwok's defaults, so every other
  # option it defaults is written out with kwok v0.8.0's default.
  cat >"$cluster_dir/kwok-options.yaml" <<'OPTIONS'
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: true
  enableContentionProfiling: false
  enableProfilingHandler: true
  manageAllNodes: false
OPTIONS
  # One stage of our own, after kwokctl's: a kubelet reports its running
  # pods Ready again when something else marked them not Ready (its status
  # manager rewrites a status that differs from its own within seconds),
  # and kwok's stages never look at a Running pod again. The node lifecycle
  # controller does mark them: a pod bound to a node it still thinks
  # NotReady (its view lags the node by up to its 5 s monitor period) is
  # marked not Ready — seen when a drain's pods landed on a node just back
  # from a simulated reboot: they stayed not Ready for good, and the next
  # drain's PodDisruptionBudget never allowed an eviction (the demo, 240 s).
  cat >"$cluster_dir/kwok-stages.yaml" <<'STAGES'
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready-again
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  # Not at once: the controller marks the pod again until its view of the
  # node catches up, and each round is two writes.
  delay:
    durationMilliseconds: 1000
  next:
    patches:
    - subresource: status
      root: status
      type: strategic
      template: |
        {{ $now := Now }}
        conditions:
        - lastTransitionTime: {{ $now | Quote }}
          status: "True"
          type: Ready
        - lastTransitionTime: {{ $now | Quote }}
          status: "True"
          type: ContainersReady
STAGES
  start kwok "$bins/kwok" --kubeconfig="$kc" --config="$bins/kwok.yaml" \
    --config="$cluster_dir/kwok-options.yaml" --config="$cluster_dir/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40 --cidr=10.244.0.0/16 --node-ip=127.0.0.1

  sleep 1
  running || fail_start "a component exited right after start"
  log "up in $SECONDS s; KUBECONFIG=$kc"
  echo "$kc"
}

# etcd, or kine over sqlite (k3s's default parameters, from kine's
# sqlite driver), on the same port. The data lives in memory when /dev/shm
# exists: the cluster is throwaway and fsync on a shared disk is the
# slowest part of every write.
start_datastore() {
  local bins=$1 data=$cluster_dir/$datastore-data
  if [[ -d /dev/shm && -w /dev/shm ]]; then
    data=/dev/shm/nodekeeper-$datastore-$(id -u)-$port
  fi
  echo "$data" >"$cluster_dir/data.path"
  echo "$datastore" >"$cluster_dir/datastore"
  echo "$k8s" >"$cluster_dir/k8s"
  echo "$gates" >"$cluster_dir/gates"
  rm -rf "$data"
  if [[ $datastore == kine ]]; then
    local kine
    kine=$("$upstream" kine) || fail_start "kine could not be built"
    mkdir -p "$data"
    start kine "$kine" --listen-address="127.0.0.1:$etcd_port" \
      --metrics-bind-address="127.0.0.1:$((etcd_port + 2))" \
      --endpoint="sqlite://$data/state.db?_journal_mode=WAL&_busy_timeout=30000&_synchronous=NORMAL&_txlock=immediate&_stmt_cache_size=20&cache=shared"
    wait_for kine 30 kine_listening
    return
  fi
  start etcd "$bins/etcd" --name=default --data-dir="$data" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$((etcd_port + 1))" \
    --initial-advertise-peer-urls="http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster="default=http://127.0.0.1:$((etcd_port + 1))" \
    --listen-metrics-urls="http://127.0.0.1:$((etcd_port + 2))" \
    --unsafe-no-fsync --quota-backend-bytes=4294967296
  wait_for etcd 30 etcd_healthy
}

# kube-apiserver, also restarted alone by `restart-apiserver` (tests that
# prove convergence across an API server restart).
start_apiserver() {
  local bins=$1 p=$cluster_dir/pki addr bind=0.0.0.0 reconciler=lease
  addr=$(advertise_address)
  # See detect_advertise_address. On loopback only, the Service has no
  # endpoints (an endpoint may not be a loopback address).
  [[ $addr != 127.0.0.1 ]] || { bind=127.0.0.1; reconciler=none; }
  start kube-apiserver "$bins/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address="$bind" --advertise-address="$addr" --secure-port="$port" \
    --endpoint-reconciler-type="$reconciler" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --client-ca-file="$p/ca.crt" --token-auth-file="$p/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-cluster-ip-range="$service_cidr" \
    --allow-privileged=true \
    --audit-policy-file="$p/audit-policy.yaml" --audit-log-path="$cluster_dir/logs/audit.log" \
    --audit-log-mode=blocking \
    --admission-control-config-file="$p/admission.yaml" ${gates:+--feature-gates="$gates"}
}

cmd_restart_apiserver() {
  running && healthy || die "the cluster is not up"
  local pid
  pid=$(cat "$cluster_dir/kube-apiserver.pid")
  kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 -- "-$pid" 2>/dev/null || true
  mv "$cluster_dir/logs/kube-apiserver.log" "$cluster_dir/logs/kube-apiserver.previous.log"
  start_apiserver "$(cmd_build)"
  wait_for kube-apiserver 90 healthy
  log "kube-apiserver restarted"
}

# A process that has not exited: an exited one stays a zombie until
# whichever process adopted it reaps it, and kill -0 still finds that.
running_pid() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ -n $state && $state != Z* ]]
}

cmd_down() {
  # Killed, not asked to stop: the cluster's state is thrown away, so a
  # graceful stop buys nothing, and it was slow. Asked one after another
  # they took 1.6-3 s each (10.6 s for a cluster; the suite takes four
  # down); asked all at once, kube-apiserver and etcd were still shutting
  # down after 5 s. Waits (5 s at most) until none runs, so its ports are
  # free when this returns.
  local c pid pids=()
  for c in "${every_component[@]}"; do
    if [[ -f $cluster_dir/$c.pid ]]; then
      pid=$(cat "$cluster_dir/$c.pid")
      kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 50); do
    local alive=""
    for pid in "${pids[@]}"; do running_pid "$pid" && alive=1; done
    [[ -n $alive ]] || break
    sleep 0.1
  done
  for c in "${every_component[@]}"; do
    rm -f "$cluster_dir/$c.pid"
  done
  local f
  for f in data.path etcd-data.path; do
    if [[ -f $cluster_dir/$f ]]; then
      rm -rf "$(cat "$cluster_dir/$f")"
      rm -f "$cluster_dir/$f"
    fi
  done
  rm -rf "$cluster_dir/etcd-data" "$cluster_dir/kine-data" "$cluster_dir/datastore" "$cluster_dir/k8s" "$cluster_dir/gates"
  log "down"
}

case ${1:-} in
  build) cmd_build ;;
  build-kubelet) cmd_build_kubelet ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  logs) cmd_logs ;;
  kubeconfig) kubeconfig ;;
  restart-apiserver) cmd_restart_apiserver ;;
  *) die "usage: $0 build|build-kubelet|up|down|status|logs|kubeconfig|restart-apiserver" ;;
esac
