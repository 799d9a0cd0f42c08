# nodekeeper's tasks. `tests/check` is the whole gate (what CI runs); the
# recipes here are its parts.

set shell := ["bash", "-euo", "pipefail", "-c"]

musl := "x86_64-unknown-linux-musl"
static_bin := "target/" + musl + "/release/nodekeeper"
static_bin_arm64 := "target/aarch64-unknown-linux-musl/release/nodekeeper"

# List the recipes.
default:
    @just --list

# Debug build of the binary.
build:
    cargo build

# Static musl release binary, size-tuned; fails if it is not static or over 8 MB.
# A binary this machine built from the same source is reused (tests/build-static).
[doc('Static musl release binary (reused if built from the same source); fails if not static or over 8 MB.')]
build-static:
    @tests/build-static >/dev/null

# The same for arm64 (aarch64-unknown-linux-musl, cross-compiled; the tests run it under qemu-user).
[doc('Static arm64 binary (cross-compiled, reused if built from the same source); fails if not static or over 8 MB.')]
build-static-arm64:
    @tests/build-static arm64 >/dev/null

# Both, in one cargo run: their single-threaded LTO stages share the two cores.
[doc('Static amd64 and arm64 binaries in one cargo run (each reused if built from the same source).')]
build-static-all:
    @tests/build-static amd64 arm64 >/dev/null

# fmt, clippy and the docs (the architecture map's links among them), warnings are errors.
[doc("fmt, clippy and cargo doc (the architecture map's links among them), warnings are errors.")]
lint:
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

# All tests: unit tests and integration tests on the local control plane,
# one real node, three machines that reboot for real (kubelet +
# containerd, tests/realnode/node.sh) and two that boot a real Debian image
# with systemd as PID 1 (tests/osimage), started for the run and stopped
# after it. They run the static binary's image. tests/run-suite runs the test modules
# in six lanes at once, each lane on a control plane of its own (which
# modules may share one: its header; one lane stores its cluster in kine
# as k3s does, one runs Kubernetes v1.34); `just test --serial` runs them one
# after another on one cluster, as `cargo test` would.
[doc('All tests: unit, integration on the local control plane, real nodes and rebooting machines.')]
test *args: build-static-all cluster-up
    #!/usr/bin/env bash
    set -euo pipefail
    trap 'tests/realnode/node.sh down; tests/osimage/machine.sh down; tests/controlplane/cluster.sh down' EXIT
    export NODEKEEPER_IMAGE_BIN="$PWD/{{static_bin}}"
    export NODEKEEPER_ARM64_BIN="$PWD/{{static_bin_arm64}}"
    tests/run-suite {{args}}

# The version lane (the core of each feature: NMO's scenarios, the
# manifests, the schema's refusals, lifecycle conditions, a reboot wave,
# an upgrade plan) on every supported minor, one after another; each
# minor's control plane is built once per machine (~6 min each, cold).
[doc('The core tests on Kubernetes v1.34, v1.35, v1.36 and v1.37, one after another.')]
test-versions: build-static-all
    #!/usr/bin/env bash
    set -euo pipefail
    export NODEKEEPER_IMAGE_BIN="$PWD/{{static_bin}}"
    for v in v1.34 v1.35 v1.36 v1.37; do
      echo "== test-versions: Kubernetes $v" >&2
      tests/run-suite --lane version --k8s "$v"
    done

# OCI image archives without a container daemon (agent image and Talos
# extension, each for linux/amd64 and linux/arm64) into target/image, plus
# the Containerfile's build context.
[doc('OCI image archives (agent image, Talos extension) into target/image, no daemon needed.')]
image: build-static-all
    image/oci-archive.sh {{static_bin}} target/image {{static_bin_arm64}}

# Debian packages of the static binaries into target/packages:
# nodekeeper_VERSION_amd64.deb and _arm64.deb (image/deb.sh says what is in
# them; the tests check them with dpkg, systemd-analyze and lintian).
[doc('Debian packages (amd64, arm64) of the static binaries into target/packages.')]
deb: build-static-all
    image/deb.sh target/packages {{static_bin}} {{static_bin_arm64}}

# systemd system extension images of the static binaries into
# target/packages: nodekeeper-VERSION-x86-64.raw and -arm64.raw (squashfs;
# image/sysext.sh says what is in them).
[doc('systemd-sysext images (x86-64, arm64) of the static binaries into target/packages.')]
sysext: build-static-all
    image/sysext.sh target/packages {{static_bin}} {{static_bin_arm64}}

# The release folder target/release-dist/: both static binaries, the image
# and Talos extension archives, the .debs and sysext images, the Helm chart
# packaged, the k3s folder as a tarball, an SBOM per binary and SHA256SUMS;
# the same bytes from any checkout of one commit (image/release.sh).
[doc('Release folder target/release-dist/: binaries, archives, packages, chart, k3s tarball, SBOMs, SHA256SUMS.')]
release: build-static-all
    image/release.sh target/release-dist {{static_bin}} {{static_bin_arm64}}

# Every benchmark: start-up and sizes, then the drain, a reboot wave, an upgrade plan and a node replacement on the local control plane.
bench: bench-startup bench-drain bench-reboot bench-upgrade bench-replace

# Sizes (binary, image archives) and start-up time of version and manifests; prints a table.
bench-startup: image
    NODEKEEPER_BIN={{static_bin}} cargo bench --bench startup

# Drain benchmark (110 pods; cordon and drain latency, agent RSS, API requests)
# for the static binary we ship; prints a table, asserts nothing.
[doc('Drain benchmark: 110 pods, cordon and drain latency, agent RSS, API requests.')]
bench-drain: build-static cluster-up
    NODEKEEPER_BIN={{static_bin}} cargo bench --bench drain

# 100 drains in one pair of agents: each agent's RSS before its drains, and
# the growth per drain; prints a curve. ~10 min.
[doc('100 drains in one pair of agents: RSS before each drain, growth per drain (~10 min).')]
bench-drain-soak: build-static cluster-up
    NODEKEEPER_BIN={{static_bin}} NODEKEEPER_DRAIN_SOAK=100 cargo bench --bench drain

# Reboot wave benchmark (20 simulated machines, maxUnavailable 4): wave time
# against the ideal, admission latency, requests per reboot, RSS; prints a
# table, asserts nothing.
[doc('Reboot wave: 20 simulated machines, wave time vs ideal, admission latency, requests, RSS.')]
bench-reboot: build-static cluster-up
    NODEKEEPER_BIN={{static_bin}} cargo bench --bench reboot

# Upgrade benchmark (10 simulated hosts in 2 groups, maxUnavailable 2, a
# 2 s before hook, 3 s upgrades): plan time against the ideal, per-node
# overhead, requests per node, RSS; prints a table, asserts nothing.
[doc('Upgrade plan: 10 simulated hosts in 2 groups, plan time vs ideal, overhead, requests, RSS.')]
bench-upgrade: build-static cluster-up
    NODEKEEPER_BIN={{static_bin}} cargo bench --bench upgrade

# Replacement benchmark (10 nodes behind the simulated cloud, 2 s join
# delay): rollout time against the ideal for maxSurge 1 and 3, requests
# per replaced node, RSS; prints a table, asserts nothing.
[doc('Node replacement: 10 nodes, simulated cloud, rollout time vs ideal for maxSurge 1 and 3, requests.')]
bench-replace: build-static cluster-up
    NODEKEEPER_BIN={{static_bin}} cargo bench --bench replace

# Scale benchmark (1000 kwok nodes, 30 000 pods): the cluster role's memory
# per store, start-to-ready and cordon latency in that cluster; then 100
# node agents: idle API requests, memory per agent, 100 maintenances at
# once. Prints a table, asserts nothing; takes several minutes.
[doc('1000 nodes, 30 000 pods: cluster-role memory, start, cordon; 100 node agents (several minutes).')]
bench-scale: build-static cluster-up
    NODEKEEPER_BIN={{static_bin}} cargo bench --bench scale

# Live demo on the local control plane: maintenance, a rolling reboot, an upgrade (leaves it running).
demo:
    tests/demo.sh

# Build (first time) and start the local control plane; prints the kubeconfig path.
cluster-up:
    @tests/controlplane/cluster.sh up

# Stop the local control plane and drop its state.
cluster-down:
    @tests/controlplane/cluster.sh down

# Print the control plane's component log tails.
cluster-logs:
    @tests/controlplane/cluster.sh logs
