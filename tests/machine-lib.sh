# What the test machines' scripts share (sourced by tests/realnode/node.sh
# and tests/osimage/machine.sh; not run on its own): the cluster's kubectl,
# processes and waits, ports, cgroups, mounts and sysctls of a run, and
# client credentials signed by the test cluster's CA. Each script sets
# what these read first: cluster_sh, cluster_dir, dir (the run's folder),
# cgroup_prefix, node_name, log and die.

kc() { "$kubectl" --kubeconfig="$cluster_dir/kubeconfig" "$@"; }

setup_kubectl() {
  local bins
  bins=$("$cluster_sh" build 2>/dev/null) || die "cannot find the control plane's binaries (tests/controlplane/cluster.sh build)"
  kubectl=$bins/kubectl
}

cluster_up() { "$cluster_sh" status >/dev/null 2>&1; }

recorded() { [[ -f $dir/count ]] && seq 0 $(($(cat "$dir/count") - 1)); }

# A process that exists and is not a zombie (this host's PID 1 reaps lazily).
running() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && ${st:0:1} != Z && ${st:0:1} != X ]]
}

alive() { [[ -f $1 ]] && running "$(cat "$1")"; }

wait_until() {
  local limit=$1
  shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

free_port() {
  port=$1
  while [[ $taken_ports == *" $port "* ]] || ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do
    port=$((port + 1))
  done
  taken_ports+="$port "
}

node_ready() {
  [[ $(kc get node "$(node_name "$1")" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

restore_sysctls() {
  [[ -f $dir/host.saved ]] || return 0
  local kind name value
  while read -r kind name value; do
    [[ $kind == sysctl ]] || continue
    local f=/proc/sys/${name//.//}
    if [[ -e $f && $(cat "$f") != "$value" ]]; then
      echo "$value" >"$f" 2>/dev/null || log "warning: could not restore $name=$value"
    fi
  done <"$dir/host.saved"
}

# The cgroup hierarchies' roots: /sys/fs/cgroup/ alone on a cgroup v2 host;
# on v1 (this machine) each controller's, and the hybrid "unified" one.
hierarchies() {
  if [[ $(stat -fc %T /sys/fs/cgroup/ 2>/dev/null) == cgroup2fs ]]; then
    echo /sys/fs/cgroup/
    return
  fi
  local h t
  for h in /sys/fs/cgroup/*/; do
    [[ -L ${h%/} ]] && continue # cpu -> cpu,cpuacct and the like
    t=$(stat -fc %T "$h" 2>/dev/null) || continue
    [[ $t == cgroupfs || $t == cgroup2fs ]] && echo "$h"
  done
  return 0
}

umount_ours() {
  local round mounts m
  for round in 1 2 3 4 5; do
    # mountinfo's 5th field, octal escapes decoded; deepest first.
    mounts=$(awk '{print $5}' /proc/self/mountinfo | grep -F -- "${dir%%[^A-Za-z0-9/._-]*}" |
      while read -r m; do printf '%b\n' "$m"; done |
      grep -F -- "$dir/" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-) || true
    [[ -n $mounts ]] || return 0
    while read -r m; do
      umount "$m" 2>/dev/null || { ((round < 5)) || umount -l "$m" 2>/dev/null || true; }
    done <<<"$mounts"
  done
}

# A client certificate signed by the cluster CA for USER (in GROUP, if
# given), and a kubeconfig using it at FILE.
write_client_kubeconfig() {
  local file=$1 user=$2 group=${3:-} p=$cluster_dir/pki server work subject
  subject="/CN=$user"
  [[ -z $group ]] || subject="/O=$group$subject"
  work=$(mktemp -d)
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/client.key" 2>/dev/null
  openssl req -new -key "$work/client.key" -subj "$subject" -out "$work/client.csr" 2>/dev/null
  printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$work/ext.cnf"
  openssl x509 -req -in "$work/client.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" \
    -set_serial "0x$(openssl rand -hex 12)" -days 30 -extfile "$work/ext.cnf" -out "$work/client.crt" 2>/dev/null ||
    { rm -rf "$work"; die "cannot sign $user's client certificate with $p/ca.key"; }
  server=$(sed -n 's/^ *server: *//p' "$cluster_dir/kubeconfig" | head -n1)
  install -D -m 0600 /dev/stdin "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodekeeper-test
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$p/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$work/client.crt")
    client-key-data: $(base64 -w0 <"$work/client.key")
contexts:
- name: nodekeeper-test
  context: {cluster: nodekeeper-test, user: "$user"}
current-context: nodekeeper-test
EOF
  rm -rf "$work"
}

our_cgroups() {
  local h
  for h in $(hierarchies); do
    compgen -G "$h$cgroup_prefix*" >/dev/null || continue
    find "$h$cgroup_prefix"* -depth -type d 2>/dev/null
  done
  return 0
}

# The system:node ClusterRole for the group system:nodes, in a binding named
# NAME and labelled as the run's (the test API server has no Node
# authorizer). Fails if kubectl does.
grant_nodes_their_role() {
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: $1
  labels: {$label: "true"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:nodes"}
EOF
}

# The first x of PREFIX.x.0/24 that no route uses and this `up` has not
# taken (the global taken_subnets), taken and printed; fails when none is
# left. (A bridge gets its route once its first pod starts.)
free_subnet() {
  local prefix=$1 x=0
  while [[ $taken_subnets == *" $x "* ]] || ip -4 route show | grep -q "^${prefix//./\\.}\.$x\."; do
    x=$((x + 1))
    ((x < 256)) || return 1
  done
  taken_subnets+="$x "
  echo "$x"
}
taken_subnets=" "
