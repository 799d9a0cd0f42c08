//! # nodekeeper — architecture map
//!
//! ## Bird's-eye view
//! One static binary that keeps Kubernetes nodes healthy through their whole
//! life. `nodekeeper run` is a service that owns one node (node mode, the
//! default: a static pod, a systemd unit or a DaemonSet pod on that node) and
//! reconciles everything nodekeeper is asked to do to it in one loop. The
//! other subcommands are the operator's CLI and the deployment generator.
//!
//! ## Entry points
//! - `main.rs`: parses flags (argh), initialises logging, calls
//!   [`cli::dispatch`], prints an error as one line and exits non-zero.
//! - [`cli`]: the flag structs and their validated runtime configs
//!   (`run`, `maintain`, `unmaintain`, `drain --dry-run`, `crds`,
//!   `manifests`, `host-kubeconfig`, `version`).
//! - [`agent::run`]: the service loop.
//!
//! ## Code map
//! - [`agent`]: wires the one loop: a kube-runtime `Controller` whose object
//!   is the **Node**; pods and NodeMaintenances are reflected into stores that
//!   serve both as triggers (mapped to the node they affect) and as the
//!   reconciler's snapshot. Node mode field-selects its own Node and the pods
//!   bound to it; cluster mode (`--all-nodes`) holds the leader Lease.
//! - [`reconcile`]: per node, snapshot → [`decide::decide`] → perform one
//!   step → repeat until the decision is to wait. Steps are small idempotent
//!   writes (each guarded by resourceVersion); our writes are folded back via
//!   a mutation cache so a lagging watch never makes us repeat a step.
//! - [`decide`]: the pure decision function. `Snapshot` in, `Step` out
//!   (`Fail`, `AddFinalizer`, `Begin`, `AcquireLease`, `ApplyToNode`,
//!   `Drain`, `WriteStatus`, `RemoveFromNode`, `Finish`, `Wait`). All
//!   NodeMaintenance behaviour lives here and is unit-tested there.
//! - [`drain`]: pure drain policy: each pod's [`drain::Fate`] (kubectl drain
//!   semantics as NMO sets them) and PDB matching for the dry-run plan.
//! - [`evict`]: the drain's side effects: concurrent eviction/delete calls
//!   guarded by pod UID, turned into `Outcome`s.
//! - [`lease`]: the medik8s node lease and cluster mode's leader election.
//! - [`nodemaintenance`]: the `NodeMaintenance` API types (medik8s's exact
//!   shape) and its constants: finalizer, taints, label, lease, annotations.
//! - [`commands`]: the operator CLI (`maintain --wait` progress line,
//!   `unmaintain`, `drain --dry-run` table, `host-kubeconfig`).
//! - [`runtime`]: smol executors with every future inside
//!   `async_compat::Compat`; signal handling.
//! - [`connect`]: credentials, reachability and start-up checks.
//! - [`error`]: the single error enum; `Display` is the one line users see.
//! - [`manifests`]: every deployment artifact (CRDs, RBAC, the own-node
//!   admission policy, DaemonSet, cluster-mode Deployment, k3s folder, static
//!   pod, systemd unit and env file, Talos extension, Containerfile), rendered
//!   from the same types and constants with one set of [`manifests::Options`];
//!   the copies in `k3s-manifests/` and `image/` are its output, and a test
//!   fails when they drift. The RBAC is one table of (resource, verbs, why).
//! - [`metrics`]: `/metrics`, `/healthz`, `/readyz` on `--metrics-address`,
//!   a hand-written HTTP/1.0 responder on smol's TCP listener.
//! - `image/oci-archive.sh`: the OCI image archives (agent image, Talos
//!   extension) from tar, gzip and sha256sum, reproducibly; `tests/image.rs`
//!   unpacks them as a runtime would and runs the binary from them.
//! - [`yaml`], [`logging`]: small utilities.
//! - `tests/`: integration tests against a real control plane (etcd,
//!   kube-apiserver, kube-controller-manager, kube-scheduler, kwok) started by
//!   `tests/controlplane/cluster.sh`; `tests/support/` is the one helper tests
//!   use to reach it.
//!
//! ## Cross-cutting concerns
//! **Architecture invariant:** every future that touches kube is polled
//! inside `async_compat::Compat`, and [`runtime`] is the only module that
//! starts futures (`runtime::block_on`, `runtime::spawn`). We depend on no
//! tokio runtime of our own; kube's tokio-based client gets its reactor from
//! `Compat`, and polling it anywhere else panics with "no reactor running".
//!
//! **Architecture invariant:** `decide.rs` and `drain.rs` perform no I/O and
//! read no clock; only `reconcile.rs`, `evict.rs` and `lease.rs` write to the
//! API server on the service's behalf.
//!
//! **Architecture invariant:** everything needed to resume lives in the API
//! server: NodeMaintenance status, the node annotations
//! `nodekeeper.io/maintenance` (whose changes the node carries) and
//! `nodekeeper.io/cordoned-by-maintenance` (present only if we cordoned), and
//! the lease. In-memory state (eviction backoff, lease renewal time) only
//! saves requests; losing it on restart costs at most one repeated request.
//!
//! **Architecture invariant:** no `unwrap`/`expect` on runtime paths; errors
//! are [`error::Error`] values with context, rendered as one line.
//!
//! **Who handles a NodeMaintenance whose node does not exist?** No agent owns
//! such a node. In node mode every agent treats these objects as its own
//! node's business after a 5 s grace (time for a real owner to act), checks
//! with a GET that the node is missing, and writes the Failed status (or
//! finishes a deletion) guarded by resourceVersion: exactly one agent wins.
//! In cluster mode the first node by name is the anchor that does this.
//!
//! ## Changes from the design direction (../shared/design.md)
//! - The test cluster is started by our own launcher script instead of
//!   `kwokctl --runtime binary`: kwokctl wants to download or locate its own
//!   component versions and kubectl; five processes, a CA and a token file are
//!   less code than adapting it, and the launcher prints component log tails
//!   when start-up fails.
//! - etcd comes from the `go.etcd.io/etcd/server/v3` module at the version
//!   kube-apiserver v1.37 requires (v3.7.0), built in the same wrapper module,
//!   not from Debian: Debian 12's etcd-server 3.4.23 starts, but lacks
//!   RequestWatchProgress, so kube-apiserver 1.37 answers watch-list streams
//!   with a 500 and serves no consistent reads from its cache — not the
//!   production behaviour our watches must be tested against.
//! - Kubernetes is v1.37.1, not the newest patch v1.37.2: the module proxy
//!   serves v1.37.2's go.mod but refuses its source zip.
//! - A reconcile loops decide → perform → decide within one call instead of
//!   one step per requeue: a cordon is one round-trip after the object
//!   appears, and a 110-pod drain is not paced by requeue latency.
//! - kube's client retries 429s internally (up to 15 times, backing off to
//!   minutes); we switch that off, because for an eviction a 429 is the PDB's
//!   answer that the drain must see, report and back off from itself.
//! - Host modes (static pod, systemd, Talos) authenticate as the node
//!   agent's ServiceAccount with a token bound to their Node
//!   (`host-kubeconfig`), not with the kubelet's credentials or a client
//!   certificate: the API server then names the node in the token's user
//!   info, exactly as for a DaemonSet pod's token, so one admission policy
//!   confines both, and the token dies with the Node object.
//! - The image is built by a 100-line script (tar, gzip, sha256sum) instead
//!   of buildah or umoci: no daemon, no user namespaces or storage driver to
//!   set up on CI, reproducible bytes. Its name, `localhost/nodekeeper:VER`,
//!   is a fully qualified reference that needs no registry, so an OS image
//!   can preload it and the manifests run it with `IfNotPresent`.
//! - The Talos extension takes its kubeconfig and node name from an
//!   `ExtensionServiceConfig` (Talos 1.7+) rather than a file baked into the
//!   OS image: credentials are per node, the extension image is not.
//! - Pods are slimmed before they enter the store (only what the drain reads)
//!   to keep the agent's memory flat with 110 pods per node.

pub mod agent;
pub mod cli;
pub mod commands;
pub mod connect;
pub mod decide;
pub mod drain;
pub mod error;
pub mod evict;
pub mod fresh;
pub mod lease;
pub mod logging;
pub mod manifests;
pub mod metrics;
pub mod nodemaintenance;
pub mod reconcile;
pub mod runtime;
pub mod yaml;
