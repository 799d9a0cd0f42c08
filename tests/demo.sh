#!/usr/bin/env bash
# The README's live demo: node maintenance on the local control plane.
# Three kwok nodes, one nodekeeper agent per node, a Deployment of six pods
# with a PodDisruptionBudget; one node goes into maintenance (live progress),
# its pods move to the other nodes, and it comes out of maintenance again.
# Leaves the cluster running (just cluster-down stops it).
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
nk=target/debug/nodekeeper
logs=$(mktemp -d)
agents=()
cleanup() {
  for pid in "${agents[@]}"; do kill "$pid" 2>/dev/null || true; done
  "${kubectl[@]}" delete namespace demo --ignore-not-found --wait=false >/dev/null 2>&1 || true
  # Only the demo's own maintenance: never anyone else's.
  "${kubectl[@]}" delete nm demo-1 --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing the CRDs: nodekeeper crds | kubectl apply -f -"
$nk crds | "${kubectl[@]}" apply --server-side --force-conflicts -f - >/dev/null
"${kubectl[@]}" wait --for=condition=Established crd/nodemaintenances.nodemaintenance.medik8s.io >/dev/null

say "three simulated nodes, each with its own nodekeeper agent"
for n in demo-1 demo-2 demo-3; do
  "${kubectl[@]}" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $n
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, demo: "true", kubernetes.io/hostname: $n}
YAML
  $nk run --node "$n" --metrics-address 127.0.0.1:0 >"$logs/$n.log" 2>&1 &
  agents+=($!)
done
"${kubectl[@]}" wait --for=condition=Ready node/demo-1 node/demo-2 node/demo-3 >/dev/null
"${kubectl[@]}" get nodes -l demo=true

say "a Deployment of 6 pods and a PodDisruptionBudget (minAvailable 6)"
# A demo run just before may still be deleting its namespace: creating into
# a terminating namespace fails, and the drain would find nothing to do.
if "${kubectl[@]}" get namespace demo >/dev/null 2>&1; then
  "${kubectl[@]}" delete namespace demo --ignore-not-found --wait=false >/dev/null
  "${kubectl[@]}" wait --for=delete namespace/demo --timeout=120s >/dev/null
fi
"${kubectl[@]}" delete nm demo-1 --ignore-not-found --wait=true >/dev/null
"${kubectl[@]}" create namespace demo >/dev/null
"${kubectl[@]}" apply -f - >/dev/null <<'YAML'
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
"${kubectl[@]}" -n demo rollout status deploy/web --timeout=60s >/dev/null
"${kubectl[@]}" -n demo get pods -o wide

say "what draining demo-1 would do: nodekeeper drain --dry-run demo-1"
$nk drain --dry-run demo-1

say "nodekeeper maintain demo-1 --reason 'kernel update' --wait"
$nk maintain demo-1 --reason "kernel update" --wait &
maintain=$!
# Wait (at most 60 s) until the drain reports what blocks it.
for _ in $(seq 600); do
  blocked=$("${kubectl[@]}" get nm demo-1 -o jsonpath='{.status.lastError}' 2>/dev/null || true)
  [[ -n $blocked ]] && break
  sleep 0.1
done
say "the PDB allows no eviction (6 of 6 must stay); scaling web to 8 makes room"
"${kubectl[@]}" -n demo scale deploy/web --replicas=8 >/dev/null
wait "$maintain"

say "demo-1 is cordoned and tainted; its pods now run elsewhere"
"${kubectl[@]}" get nm
"${kubectl[@]}" get nodes -l demo=true
"${kubectl[@]}" -n demo get pods -o wide

say "nodekeeper unmaintain demo-1 --wait"
$nk unmaintain demo-1 --wait
"${kubectl[@]}" get nodes -l demo=true

say "done; agent logs are in $logs (just cluster-down stops the control plane)"
