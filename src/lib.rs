//! # nodekeeper — architecture map
//!
//! ## Bird's-eye view
//! One static binary that keeps Kubernetes nodes healthy through their whole
//! life. `nodekeeper run` is a service that reconciles every nodekeeper API
//! in **one loop**, in one of two **roles**: the node role owns one node (a
//! static pod, a systemd unit or a DaemonSet pod on that node); the cluster
//! role (`--all-nodes`, leader-elected) sees every node and is the single
//! writer of cluster-wide decisions. The other subcommands are the
//! operator's CLI and the deployment generator.
//!
//! Every disruption has the same life — take the node, drain it, act,
//! verify, give it back — and **NodeMaintenance is the drain primitive**: a
//! feature takes a node by creating a NodeMaintenance it owns and gives it
//! back by deleting it, so at most one disruption holds a node and
//! `kubectl get nm` shows everything nodekeeper does.
//!
//! The loop, per node: **snapshot → decide → plan → execute → record**.
//! `decide` is pure (snapshot and time in, a step and its [`decide::Plan`]
//! of [`decide::Effect`]s out); **one executor** ([`service::executor`])
//! carries out every feature's plans: effects one after another, or at
//! once where the plan says they are independent (`Plan::together`: a new
//! maintenance's finalizer and lease, so the cordon waits two round trips,
//! not three), each outcome into the mutation cache and the feature's hook
//! (per-node memory, metrics, a follow-up), the first error ending the
//! plan; a hook before each effect lets a feature skip it or carry it out
//! itself (replacement's background instance deletes). A create whose
//! answer was lost (a timeout, a 5xx) is read as existing until the store
//! shows it, so a second feature never takes the node meanwhile. No
//! feature performs effects on its own.
//!
//! **One reboot per need, no clock read.** A need carries the boot it was
//! stamped in (`reboot-needed-boot`) and the policy's status the stamp each
//! reboot answers: a need from an earlier boot, or the stamp a verified
//! reboot answered, is served, whoever rebooted the machine and however
//! far the stampers' clocks are from the cluster role's.
//!
//! **The give-back rule.** A plan may record "given back" (Settling, Done,
//! Failed) before the writes that give the node back, and any of those may
//! fail. Decisions are level-triggered: every phase that says given back
//! re-asserts its give-back (our NodeMaintenance deleted, the need it
//! served cleared) on every pass until the world agrees; an admission whose
//! create failed is carried out later only while no other disruption took
//! the node. No wake-up is ever "now" (100 ms floor, and passes that keep
//! asking for "soon" are spaced out): the one-thread executor also drives
//! the HTTP/2 connection, the leader lease and `/healthz`.
//!
//! ## Entry points
//! - `main.rs`: parses flags (argh), initialises logging, calls
//!   [`cli::dispatch`], prints an error as one line and exits non-zero.
//! - [`cli::dispatch`]: validates raw flags into configs and runs a command.
//! - [`service::run`]: the service loop.
//! - [`api::crds_yaml`] and [`deploy::render`]: everything `kubectl apply` gets.
//!
//! ## Code map
//! - `api/`: the CRD types, one file per API family
//!   ([`api::nodemaintenance`]: medik8s's exact shape, its constants and the
//!   owner label and drain-option annotations features use;
//!   [`api::reboot`]: `RebootPolicy` and the node annotations reboots read
//!   and write; [`api::upgrade`]: `UpgradePlan`, its node annotations and
//!   Job labels; [`api::mutex`]: the node-upgrade mutex operator's three
//!   kinds, served as a drop-in, and views of OpenShift's
//!   MachineConfigPool and ClusterVersion; [`api::constellation`]:
//!   Constellation's five node-operator kinds, their node annotations, and
//!   the `Kind` effects name them by; [`api::pod`]: the slim pod every
//!   store holds), and [`api::common`] for the building blocks every feature
//!   shares (node names, [`api::common::DrainOptions`] with its
//!   [`api::common::Escalation`], and the API shapes of
//!   [`api::common::Budget`], [`api::common::Window`], [`api::common::Gates`],
//!   [`api::common::DrainSpec`]).
//! - `decide/`: pure decisions. [`decide::maintenance`] is the
//!   NodeMaintenance life: `decide` picks the [`decide::maintenance::Step`],
//!   `plan` spells out its effects, `after` follows up an outcome (a lease
//!   held elsewhere). [`decide::drain`]: which pods go and how (kubectl
//!   drain semantics), PDB blockers, the eviction retry schedule.
//!   [`decide::foreign`]: who looks after objects whose node has no agent,
//!   with jittered backoff. [`decide::reboot`]: the cluster role's admission
//!   and per-node steps of a RebootPolicy (`stages.rs`), what it reads off
//!   nodes (`facts.rs`), and the node role's half (`node.rs`: mark need,
//!   issue the reboot once per boot). [`decide::budget`] (every unavailable
//!   node counts; topology and control-plane limits) and [`decide::window`]
//!   (IANA zones, wrapping, DST, the next boundary) serve every feature,
//!   as do [`decide::health`] (the health gate's verdict on a node that
//!   came back: its readiness, the named workloads' rollout state, the
//!   alert gate), [`decide::notify`] (which status entry is news to the
//!   notifier, and each target's message) and [`decide::marking`] (labels during and after, the
//!   soft taint while a node waits; level-triggered, written only where a
//!   node differs).
//!   [`decide::upgrade`]: the cluster role's admission and per-node stages
//!   of an UpgradePlan (`stages.rs`), its hook Jobs (`hooks.rs`), the
//!   upgrade Job of `strategy.type: Job` (`upgrade_job.rs`: pinned to the
//!   drained node, which its drain leaves alone), the channel's answer
//!   (`channel.rs`) and the
//!   node role's half (`node.rs`: the upgrade command once per plan,
//!   version and boot, then the reboot). [`decide::mutex`]: the mutex
//!   operator's validation, node lists and run. What features share:
//!   [`decide::claim`]: one node agent per node (each claims its node;
//!   the earlier one reports a second). [`decide::node_conditions`]: the
//!   KEP-5683 Node lifecycle conditions (MaintenanceInProgress,
//!   DrainInProgress, Drained) the NodeMaintenance life publishes for
//!   every disruption, withdrawn before the uncordon, and
//!   MaintenancePlanned (`planned.rs`), which the cluster role alone
//!   publishes from every feature's records (waiting reboots and
//!   upgrades, outdated nodes to replace).
//!   [`decide::disrupt`] (node facts admissions read, the NodeMaintenance a
//!   feature takes a node with, orphans) and [`decide::jobs`] (env appended,
//!   kept off the node, a Job's state). `decide/mod.rs` holds the closed
//!   set of effects, outcomes and [`decide::NodeMemory`].
//!   [`decide::replace`]: rolling replacement (Constellation's classification,
//!   surge with recorded request ids, pairing, label inheritance, the donor
//!   taken through a NodeMaintenance and deleted through a Leave
//!   PendingNode), with the other kinds' lifecycles in `lifecycle.rs`;
//!   provider answers come in as `Facts`, asked for by `questions`.
//!   [`decide::admission`]: the opt-in webhook's refusals (NMO's, plus the
//!   control-plane quorum), the caBundle instances share, rotation time.
//! - `effects/`: [`effects::Interpreter`], the one place that writes to the
//!   API server on the loop's behalf; [`effects::evict`] (concurrent
//!   evictions guarded by pod UID), [`effects::lease`] (taking and giving
//!   back a lease: the medik8s node lease, the leader lease) and
//!   [`effects::leader`] (the cluster role's election, its gate and
//!   hand-over), [`effects::events`] (Events for `kubectl
//!   describe`, repeats counted as a series, at most 128 remembered) and
//!   [`effects::host`] and [`effects::host_run`], the only modules that
//!   touch the machine: checks (sentinel command, can-run) with a timeout
//!   as this process's children (in PID 1's mount namespace through
//!   `nodekeeper host-exec`), reboot and upgrade commands as the host's own
//!   processes (`nodekeeper host-run`: PID 1's namespaces and cgroups, a
//!   detached supervisor, the result in a record on the host by the
//!   command's id, so an agent restarted mid-command attaches instead of
//!   running it twice), the sentinel file; a host path under `--host-root` resolves every symlink
//!   inside that root (`effects::host::in_root`: the kernel would follow
//!   `/var/run -> /run` from the container's root). [`effects::provider`] runs the provider plugin (one JSON
//!   request, one answer, a timeout, every failure one line);
//!   [`effects::talos`] is the other way a node agent touches its host:
//!   on Talos (no shell, no systemd) a reboot or upgrade is a call of
//!   machined's API on its unix socket, one gRPC call per HTTP/2
//!   connection on hyper, with the wire format (hand-written protobuf,
//!   framing, status) in [`effects::talos_wire`]; which path a node takes
//!   is the decision's ([`decide::HostAction`], from `reboot.method`,
//!   `strategy.type` and the node's osImage), never a run-time fallback;
//!   [`effects::http`] is the small HTTP/1.1 client (plain or rustls) for
//!   what is not the API server: a notification's POST, a channel's GET;
//!   [`effects::prometheus`] asks a gate's Prometheus for its active alerts
//!   (plain HTTP, a deadline, every failure one line); `objects.rs`
//!   writes Constellation's kinds and the autoscaler Deployment untyped.
//! - `service/`: wiring the loop ([`service::run`]). Each file imports
//!   only from those listed before it:
//!   [`service::watch`] (the generic watch machinery: list semantics,
//!   backoff, slimming, untyped watches and their triggers, reading them
//!   typed with their failures, latches over several watches, the pass
//!   loop every scheduler task runs — nothing feature-specific),
//!   [`service::requests`] (a layer under kube's client that counts every
//!   API request and bounds its wait for an answer), [`service::fresh`] and [`service::stores`] (the
//!   mutation cache: our writes, and the objects our writes deleted, until
//!   the watch agrees; the order NodeMaintenances arrived in: same-second
//!   ties go to the first stored), [`service::roles`] (scope and the anchor
//!   node), [`service::context`] (stores, the interpreter, per-node memory
//!   and its pruning, the give-back of orphaned maintenances),
//!   [`service::executor`] (the one plan executor, the wake-up floor),
//!   [`service::cluster`] (the cluster role's one scheduler, and the
//!   per-object failure memory every pass reports through; its last step,
//!   [`service::planned`], publishes MaintenancePlanned),
//!   [`service::alerts`] (Prometheus's answers for alert gates, asked in the
//!   background so no pass waits on Prometheus) and [`service::health`]
//!   (the health gates' workloads, listed untyped in the background only
//!   while a node of the object holds a slot), [`service::notifier`] (the
//!   objects' notifications: the events their status entries say, one
//!   queue and task per target so a dead webhook delays only its own, a
//!   Secret read per delivery, the outcome handed to the next decision for
//!   `status.notifications`) and [`service::channels`] (UpgradePlan
//!   channels, asked in the background at an interval), one module per
//!   feature's half in the loop ([`service::reboots`], [`service::upgrades`],
//!   [`service::mutex`], [`service::replace`]: each the cluster role's pass
//!   over its objects and, for reboots and upgrades, the node role's own
//!   step; none calls another feature's pass), [`service::reconcile`] (the
//!   node controller's reconcile: one node's maintenance, and in the node
//!   role its own reboot and upgrade step; at most 128 at once, so a start
//!   on thousands of nodes queues references, not reconciles), credentials, the HTTP/2 client
//!   and start-up checks ([`service::connect`]), `/metrics`, `/healthz` (a
//!   watchdog on loop progress) and `/readyz` ([`service::metrics`]: what
//!   is counted, the exposition text, the HTTP server). Labelled counts
//!   live where the counting happens ([`counts`]: API requests, Events by
//!   reason, provider calls), so no layer needs the server's handle.
//!   Beside the loop, like metrics: the opt-in NodeMaintenance webhook
//!   ([`service::admission`]: TLS with a CA it generates, its reads straight
//!   from the API server, the caBundle of its own configuration kept by a
//!   watch of that one object, its CA taken out again as it stops),
//!   independent of stores and leadership so every replica answers.
//! - `cli/`: raw flags → validated configs per command family
//!   ([`cli::run`], [`cli::status`]: `status [--watch]`, `reboot-required`;
//!   [`cli::maintenance`]: `maintain --wait` progress, `unmaintain`, `drain
//!   --dry-run`; [`cli::deploy`]: `crds`, `manifests`, `host-kubeconfig`;
//!   `host-exec` and `host-run` in `cli/mod.rs`).
//! - `deploy/`: every deployment artifact, rendered from the code's types
//!   and constants with one set of [`deploy::Options`]; [`deploy::TARGETS`]
//!   is the one list of targets. `rbac.rs` (identities, the RBAC table with
//!   a reason per verb, the own-node admission policy), `workloads.rs`
//!   (DaemonSet, Deployment, static pod, each with its security profile, and
//!   the `--reboot` profile: host PID and three capabilities; `--upgrade`:
//!   privileged, host root said plainly),
//!   `host.rs` (systemd, Talos, Containerfile), `webhook.rs` (the opt-in
//!   webhook's configuration by loopback URL or Service, and its one
//!   named-object permission), `helm.rs` (the chart: the same objects as
//!   JSON templates, placeholders replaced by template actions, one render
//!   per shape-changing choice picked by `if`, a values schema),
//!   `monitoring.rs` (alerting rules, PrometheusRule and PodMonitor, the
//!   Grafana dashboard; every expression names a metric the exposition
//!   writes). The CRDs
//!   are embedded as compact JSON and printed as YAML (`api::crds_yaml`).
//!   `k3s-manifests/` and
//!   `image/` hold its output; a test fails when they drift. The k3s files
//!   are numbered in the order they must apply (`kubectl apply -f` takes a
//!   folder's files in lexical order).
//! - [`runtime`] (smol executors inside `Compat`, signals, [`runtime::Latch`]),
//!   [`error`] (the one error enum, one line each), [`yaml`], [`logging`].
//! - `tests/`: integration tests against a real control plane (etcd,
//!   kube-apiserver, kube-controller-manager, kube-scheduler, kwok) started
//!   by `tests/controlplane/cluster.sh`; `tests/support/` is the one helper
//!   tests use to reach it. Beside the kwok nodes, a real node
//!   (`tests/realnode/node.sh`: kubelet, containerd, runc, one kube-proxy)
//!   runs what kwok cannot show: the static pod and the DaemonSet recipes as
//!   the README writes them, real drains, runtime restarts
//!   (`tests/real_node.rs`). `tests/bench/` holds the benchmarks.
//!   `tests/run-suite` runs the test binaries in three lanes at once, each
//!   on a control plane of its own: what must see a cluster alone
//!   (unscoped cluster roles, API server restarts, the webhook, the chart,
//!   alerts), the real machines, and the binaries scoped to their own
//!   namespace and nodes.
//!
//! ## Invariants
//! **Architecture invariant:** nothing under `decide/` performs I/O or reads
//! a clock; time comes in through the snapshot. Policy (retry schedules,
//! failure counting, escalation, backoff) lives there, with unit tests.
//!
//! **Architecture invariant:** only [`effects`] writes to the API server on
//! the loop's behalf. A write that replaces what another writer may have
//! written (statuses, admissions, a Deployment's replicas, a pool's pause)
//! carries the resourceVersion it was decided on, and a delete the UID;
//! creates are idempotent by a deterministic name (a 409 is done). The one
//! deliberate exception: merge patches of node labels and annotations only
//! nodekeeper writes (the mutex operator's rule labels, the provider's
//! facts replacement puts on a new node), which cannot clobber another
//! writer's keys and would only conflict with every kubelet heartbeat if
//! guarded. (Replacement's pairing annotations stay guarded: a pair decided
//! on a stale copy must not be written.) The interpreter holds
//! no policy, and starts no effect once the cluster role's lease is in
//! doubt ([`effects::leader::LeaderGate`]). (The webhook's caBundle write is
//! not the loop's: it lives with the server in [`service::admission`], also
//! guarded by resourceVersion.) Status is written by server-side
//! apply with one field manager, [`effects::FIELD_MANAGER`]; keys the new
//! status drops are sent null, so a key another writer set cannot make the
//! loop rewrite the same status forever.
//!
//! **Architecture invariant:** every future that touches kube is polled
//! inside `async_compat::Compat`, and [`runtime`] is the only module that
//! starts futures (`runtime::block_on`, `runtime::spawn`). We depend on no
//! tokio runtime of our own; kube's tokio-based client gets its reactor from
//! `Compat`, and polling it anywhere else panics with "no reactor running".
//!
//! **Architecture invariant:** nothing waits on kube-runtime's
//! `Store::wait_until_ready`: it wakes one waiter only, and the controller is
//! already one. Readiness is a [`runtime::Latch`] per watched kind.
//!
//! **Architecture invariant:** everything needed to resume lives in the API
//! server: NodeMaintenance status, the node annotations
//! `nodekeeper.io/maintenance` (whose changes the node carries) and
//! `nodekeeper.io/cordoned-by-maintenance` (present only if we cordoned), the
//! lease; for reboots, the RebootPolicy status (the admission record, written
//! before a node is taken), the boot ID on the reboot's NodeMaintenance, and
//! `nodekeeper.io/reboot-issued` on the node (the boot a reboot was issued
//! in, written before the command runs); for upgrades, the UpgradePlan
//! status (admission, the hook Job started, recorded before it is created)
//! and `nodekeeper.io/upgrade-issued` (plan, version and boot, written
//! before the command runs); for the mutex operator's runs, the run
//! config's `status.progress`; for replacement, the node annotations
//! (group, image, heir, donor, obsolete), the NodeVersion's
//! `nodekeeper.io/surge-requests` (written before the provider is asked),
//! PendingNodes (a Join per surge node, a Leave per instance to delete, with
//! `nodekeeper.io/delete-issued`) and the NodeVersion-owned maintenances.
//!
//! **Architecture invariant:** never a double reboot. A reboot is issued
//! only while the node runs the boot recorded at admission and no reboot was
//! issued in that boot; completion is a new boot ID and Ready, never
//! assumed.
//!
//! **Architecture invariant:** nothing a feature starts runs twice for one
//! step: hook and rule Jobs are named from the admission (owner, node,
//! stage, version, generation), so a repeated create is a 409; an upgrade
//! command runs at most once per node, version and boot, whichever plan
//! asks (`nodekeeper.io/upgrade-issued`; another plan waits with
//! `IssuedThisBoot`).
//!
//! **Architecture invariant:** a node is never taken for a host command
//! that cannot run. The node role checks the governing plan's commands on
//! its host before admission (`nodekeeper.io/upgrade-command-check`) and the
//! plan admits only on its `ok`; host commands (sentinel, reboot, upgrade)
//! run beside the loop with a deadline, and a reboot signal the agent
//! cannot read is recorded on its node (`nodekeeper.io/reboot-sentinel-failed`)
//! for the policy to report. The agent reports through its own node's
//! `nodekeeper.io/*` annotations only, so it needs no write access to any
//! policy.
//!
//! **Architecture invariant:** one owner per node. Every feature takes a
//! node with a NodeMaintenance; of the objects of one kind that select a
//! node, the oldest governs it (`decide::reboot::node::governing`,
//! `decide::upgrade::governing`, the oldest NodeVersion) and the others
//! report it by name (`OtherPolicy`, `OtherPlan`); across kinds a node
//! with a NodeMaintenance that has not Failed is held (`InMaintenance`), and
//! an administrator's preempts a feature's. A selector that cannot be used
//! selects nothing. `decide/reboot/tests/worlds.rs` checks this over random
//! worlds of RebootPolicies, UpgradePlans and administrators'
//! maintenances, with faults injected (refused and half-done writes,
//! reboot commands that fail yet happen), and that every finished node is
//! given back, one reboot per need, and no decision spins; the README's
//! "Who owns a node" table is the user's
//! version. Objects that name what does not exist (a NodeVersion, a
//! Deployment, a node) report it on themselves; names that reach a URL are
//! refused by the schema and checked again before the request is built.
//!
//! **Architecture invariant:** the cluster role is the only writer of
//! admissions, and each admission is written guarded by the policy's
//! resourceVersion before its NodeMaintenance exists: two decisions cannot
//! both take one slot. In-memory state (eviction backoff, lease renewal
//! time, our recent writes, per-object failures and refused Jobs, provider
//! answers) only saves requests, is keyed by something that can disappear
//! (a node, an object, a providerID) and pruned when it does; losing it
//! costs at most one repeated request.
//!
//! **Architecture invariant:** one leader acts. Its identity is unique per
//! process (`POD_NAME`, else the host name and a random suffix); it renews
//! every 3 s and may start effects only within 10 s of its last successful
//! renewal (the lease lasts 15 s), so an old leader starts nothing once a
//! new one could have begun. A standby counts the 15 s from when it saw
//! the lease's record last change, by its own monotonic clock (client-go's
//! rule), so skewed wall clocks cannot shorten them. A late renewal only closes the gate: the
//! scheduler tasks skip their passes until one succeeds (every try is
//! bounded by the deadline), and a renewal that fails past the deadline or
//! finds another holder ends the process with its own error.
//!
//! **Architecture invariant:** no `unwrap`/`expect` on runtime paths; errors
//! are [`error::Error`] values with context, rendered as one line.
//!
//! ## Cross-cutting concerns
//! **Who handles a NodeMaintenance whose node does not exist?** No agent owns
//! such a node. The cluster role acts at once from its anchor (the first
//! node by name), so where one runs it settles these objects before any
//! node agent's grace ends. The node role is the fallback: every agent
//! treats these objects as its own node's business after a 5 s grace, checks with a GET that the node is
//! missing (never for a name no node can have), and writes the Failed status
//! (or finishes a deletion) guarded by resourceVersion: exactly one agent
//! wins. Failed looks back off per object, 5 s doubling to 5 min, ±20 %
//! jitter per agent.
//!
//! **Liveness.** The anchor is reconciled at least every 30 s (a heartbeat
//! trigger); `/healthz` fails after 90 s without a finished reconcile, so
//! kubelet or systemd restarts a wedged agent. A cluster role with no node
//! in scope has nothing to reconcile and counts as idle, not wedged. Shutdown waits 10 s for
//! reconciles in flight, then stops without them.
//!
//! **Priority.** An administrator's NodeMaintenance (no owner label)
//! preempts one a feature holds a node with: the feature's fails with
//! reason `Preempted` and the administrator's takes over the cordon.
//!
//! **The cluster role's scheduler** ([`service::cluster`]). Cluster-wide
//! work never rides on a node's reconcile: one task runs passes over every
//! RebootPolicy, UpgradePlan and mutex object, kicked by the watches of the
//! kinds they read (nodes, NodeMaintenances, policies, plans, Jobs, the
//! mutex kinds; pods only while a blocking-pod gate reads them), one pass
//! at a time, kicks during a pass folded into one more, with its own
//! wake-up time. Each object is decided on its own: one whose decision
//! fails gets a `ReconcileFailed` event and a `Reconciled=False` condition
//! naming the cause, is retried 5 s doubling to 5 min (at once if it
//! changes), and every other object goes on. A conflict (409) is decided
//! again soon, 200 ms doubling to 5 s; eight in a row count as a failure
//! (another writer fighting over the object). A blocking-pod gate whose
//! pods are not listed holds only its own object's admissions (Waiting,
//! `Gate`); nodes already taken go on. Replacement has its own task
//! (a provider call may take its whole timeout), kicked by its kinds, nodes
//! and NodeMaintenances; it hands orphaned maintenances to the anchor's
//! reconcile through the controller. Its rounds wait (2 s at most) for the
//! watches to show their writes and deletes, and ask the provider only what
//! a decision reads: a PendingNode whose status records its goal reached
//! is answered by that record. A round's provider calls run at once and
//! end the round, except instance deletes: a cloud's may take minutes, and
//! nothing in the round needs the answer (the delete is recorded on its
//! PendingNode first), so each runs on a task of its own, its key kept in
//! flight (the decision waits for it; its state is not asked meanwhile)
//! and its answer recorded and kicking the task. A restart forgets the
//! calls in flight; the recorded issue time then governs, as after any
//! crash. A round also waits for the NodeMaintenances it created to show
//! (the next would create them again).
//!
//! **Reboots across roles.** The cluster role decides (admission, verify,
//! give back), the node role acts on its host (need from the sentinel, the
//! reboot command) and drains through the NodeMaintenance as for any
//! maintenance. With `--node-agents` the cluster role drains nothing itself;
//! without node agents it drains every node and reboots through the
//! policy's `remoteCommand`. A pool-scoped cluster role (`--node-selector`)
//! handles only policies whose matchLabels include its pool's labels. A
//! pass also gives back the nodes of policies that are gone (their
//! NodeMaintenances are owned by the Node too, so the garbage collector
//! keeps them), after a GET confirms the owner is gone.
//!
//! **Upgrades across roles.** As reboots: the cluster role admits, runs
//! hook Jobs (off the node) and verifies; the node agent runs the upgrade
//! command on its host, in the background (a long upgrade must not stall
//! the loop or trip `/healthz`), and records its result on the node.
//! UpgradePlans are decided in the scheduler's pass after RebootPolicies:
//! one writer of admissions at a time. A node that fails after its drain
//! stays in maintenance; a spec change (new generation) retries it.
//!
//! **The mutex operator's flow** spans the cluster (ClusterVersion, pools),
//! so only a cluster role without `--node-selector` runs it, and only when
//! `nodekeeper crds --mutex` was applied; MachineConfigPool and
//! ClusterVersion are watched only if served.
//!
//! **What each role watches.** A node agent watches its own Node, the pods
//! bound to it and the NodeMaintenances naming it (field selectors; the
//! CRD declares `spec.nodeName` selectable), so a 5 000-node cluster costs
//! it what a 5-node one does; NodeMaintenances naming a node without an
//! agent are the cluster role's (`decide::foreign`) or the webhook's. The
//! cluster role watches every node (slim) and NodeMaintenance, but pods
//! only where it acts (`service::pod_watches`): a node's pods while it
//! drains that node (a `spec.nodeName` watch started by the reconcile that
//! finds a NodeMaintenance there, after whose first list it decides, and
//! stopped by the one that finds none), and each blocking-pod gate's pods
//! by its selector while a policy or plan names it. Its memory grows with
//! the nodes (7.4 KiB each) and the nodes in disruption, not with the pods.
//! A leader that stops hands its Lease over once its effects in flight are
//! done (up to 5 s; otherwise it lets the lease expire) by clearing its
//! holder, and a standby that watches the Lease leads at once. Each pool
//! (`--node-selector`) has a Lease of its own.
//!
//! **Surviving an API server restart.** Watches re-list with consistent
//! reads and retry after 0.5 s doubling to 5 s, each on its own: their
//! errors never reach the Controller, whose trigger backoff (up to 30 s)
//! would hold back every other watch's events meanwhile. HTTP/2 response
//! bodies end after their first error (kube-runtime waits for a failed watch
//! stream to end, and a dead HTTP/2 stream otherwise repeats its error for
//! ever). Measured: the loop sees changes again within 0.1 s of the
//! restarted API server answering (it was deaf for minutes before).
//!
//! ## Changes from the design direction (../shared/design.md)
//! - Per-owner drain options travel as annotations
//!   (`nodekeeper.io/drain-timeout-seconds`, `nodekeeper.io/drain-on-timeout`)
//!   rather than a spec extension field: the CRD stays medik8s's shape, and
//!   only nodekeeper's own features write them; a bad value fails the object
//!   with the annotation named.
//! - `decide` returns a step and `plan` turns it into effects: the step is
//!   what a reviewer reads and the unit tests pin; the plan is what the
//!   interpreter does.
//! - The test cluster is started by our own launcher script instead of
//!   `kwokctl --runtime binary`: kwokctl wants to download or locate its own
//!   component versions and kubectl; five processes, a CA and a token file are
//!   less code than adapting it, and the launcher prints component log tails
//!   when start-up fails.
//! - etcd comes from the `go.etcd.io/etcd/server/v3` module at the version
//!   kube-apiserver v1.37 requires (v3.7.0), not from Debian: Debian 12's
//!   etcd-server 3.4.23 lacks RequestWatchProgress, so kube-apiserver 1.37
//!   answers watch-list streams with a 500.
//! - Kubernetes is v1.37.1, not the newest patch v1.37.2: the module proxy
//!   serves v1.37.2's go.mod but refuses its source zip.
//! - A reconcile loops decide → perform → decide within one call instead of
//!   one step per requeue: a cordon is one round-trip after the object
//!   appears, and a 110-pod drain is not paced by requeue latency.
//! - The kube `Client` is built on our own connector stack
//!   ([`service::connect::client`]): kube-client 5 offers only HTTP/1.1,
//!   where each request in flight holds a TLS connection; ours offers h2 by
//!   ALPN (falling back to HTTP/1.1) with kube's base-URI, auth and header
//!   layers, and runs hyper's connection tasks on smol.
//! - kube's client retries 429s internally (up to 15 times, backing off to
//!   minutes); we switch that off, because for an eviction a 429 is the PDB's
//!   answer that the drain must see, report and back off from itself.
//! - Host modes (static pod, systemd, Talos) authenticate as the node
//!   agent's ServiceAccount with a token bound to their Node
//!   (`host-kubeconfig`), so one admission policy confines every mode.
//! - The image is built by a 100-line script (tar, gzip, sha256sum) instead
//!   of buildah or umoci: no daemon, reproducible bytes.
//! - Pods are read into our own slim type ([`api::pod::Pod`]: metadata, node
//!   name, grace period, phase), not `k8s_openapi`'s, whose inline size alone
//!   is 2.4 KiB: a cluster role holds every pod in the cluster. Managed
//!   fields and unread annotations are dropped before a pod enters the
//!   store, managed fields and image lists before a node does. `just
//!   bench-scale` measures what each store costs over 1000 nodes and 30 000
//!   pods.
//! - A reconcile looks up the node's pods only when a maintenance needs
//!   them, by a scan under the store's lock that clones only the matches:
//!   every pod event reconciles its node, and the cluster role's store is
//!   the whole cluster's.
//! - The reboot admission record is the RebootPolicy's status, not a lock
//!   object (kured's DaemonSet annotation) or per-node labels (FLUO): one
//!   guarded write per decision, readable by `kubectl get rp -o yaml`.
//! - Settling holds the node's slot (from verification until
//!   `settleSeconds` pass) rather than pausing all admissions: with budget N
//!   the other N-1 slots keep rolling.
//! - The reboot DaemonSet reaches the host with host PID and setns
//!   (`host-exec`, three capabilities) rather than `privileged` and nsenter;
//!   upgrades get a profile of their own that is privileged, since package
//!   managers need host root.
//! - A node is admitted for a reboot or an upgrade only after its agent said
//!   it can run the command (`decide::command_check`): asked before the
//!   drain, not discovered after it.
//! - Upgrades run the command from the node agent on the host, not as a
//!   privileged Job on the node (system-upgrade-controller): no image pull
//!   before the network is up, and the once-per-boot record is the agent's.
//!   Hook Jobs run *off* the node, as the mutex operator's do.
//! - Every Job nodekeeper creates carries `app.kubernetes.io/managed-by:
//!   nodekeeper`, the one label the cluster role watches Jobs by.
//! - The cluster role's cluster-wide work has its own scheduler task rather
//!   than the design's anchor-node reconcile: a node controller's reconcile
//!   runs per node event, and every pod event anywhere started a pass.
//! - Two NodeVersions share the autoscaler: it runs only when every
//!   NodeVersion the role governs is done (each reads the others' status),
//!   so no NodeVersion writes back what another wrote.
//! - Provider reads carry their cache rule ([`decide::replace::Read`]):
//!   answers that cannot change are kept while their node exists, a group's
//!   image for 60 s, errors for 10 s, states never.

pub mod api;
pub mod cli;
pub mod counts;
pub mod decide;
pub mod deploy;
pub mod effects;
pub mod error;
pub mod logging;
pub mod runtime;
pub mod service;
pub mod yaml;

#[cfg(test)]
mod architecture_tests;
