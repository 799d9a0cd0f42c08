//! # nodekeeper — architecture map
//!
//! ## Bird's-eye view
//! One static binary that keeps Kubernetes nodes healthy through their whole
//! life. `nodekeeper run` is a service that reconciles every nodekeeper API
//! in **one loop**, in one of two **roles**: the node role owns one node (a
//! static pod, a systemd unit, a DaemonSet pod or a Talos extension on that
//! node); the cluster role (`--all-nodes`, leader-elected) sees every node
//! and is the single writer of cluster-wide decisions. The other
//! subcommands are the operator's CLI and the deployment generator.
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
//! carries out every feature's plans, each outcome into the mutation cache
//! and the feature's hook; the first error ends the plan, and the next pass
//! decides again from what the API server says. Decisions are
//! level-triggered: every phase that says "given back" re-asserts its
//! give-back until the world agrees, and a node is taken again (a new
//! version, a retry) only once the last attempt's NodeMaintenance is gone;
//! a write whose answer was lost is read as done (a create as existing
//! until the store shows it, a lease as held until released), and no
//! wake-up is ever "now".
//!
//! ## Entry points
//! - `main.rs`: flags (argh), logging, [`cli::dispatch`]; an error is one line
//!   and a non-zero exit.
//! - [`service::run`] with a [`service::config::RunConfig`]: the loop.
//! - [`api::crds_yaml`] and [`deploy::render`]: everything `kubectl apply` gets.
//!
//! ## Code map
//! Layers, each importing only from those before it: `api` → `decide` →
//! `effects` → `service` → `deploy` → `cli`.
//! - `api/`: the CRD types, one file per API family ([`api::nodemaintenance`]
//!   in medik8s's exact shape; [`api::reboot`]; [`api::upgrade`];
//!   [`api::mutex`] and [`api::constellation`], served for their projects;
//!   [`api::pod`] and [`api::node`], the slim pod and node every store
//!   and decision holds (only the fields decisions read); [`api::drain_rule`],
//!   Cluster API's MachineDrainRule for every drain) and [`api::common`], the
//!   blocks every feature shares (budgets, windows, gates, drain settings,
//!   node labels, notifications). Field documentation is the schemas'.
//! - `decide/`: pure decisions. [`decide::maintenance`] is the
//!   NodeMaintenance life; [`decide::drain`] which pods go and how (kubectl
//!   drain's rules, PDB blockers, retries), [`decide::drain_rules`] each
//!   pod's DrainRule placement and the tier draining now, and
//!   [`decide::drain_plan`] the two together as one drain's plan, which the
//!   maintenance acts on and `drain --dry-run` prints; [`decide::reboot`] and
//!   [`decide::upgrade`] the cluster role's admissions and per-node stages
//!   and the node role's half (`node.rs`), both built of one skeleton's
//!   parts in [`decide::rollout`] (the reasons both report, the agent's
//!   command check, settling, the marks, the end of a pass: a fix to
//!   those is made there, once); [`decide::once_per_boot`] the
//!   record of a host reboot per boot and ask, which both use;
//!   [`decide::version`] the one check of every value that fills
//!   `{version}`; [`decide::replace`] rolling
//!   replacement; [`decide::mutex`] the mutex operator's runs. Shared:
//!   [`decide::budget`], [`decide::window`], [`decide::health`],
//!   [`decide::marking`], [`decide::notify`], [`decide::disrupt`] (node facts,
//!   why a node waits, the NodeMaintenance a feature takes a node with),
//!   [`decide::do_not_disrupt`] (Karpenter's opt-out on nodes and pods, which
//!   admissions and drains honour), [`decide::volumes`] (which volumes a
//!   node must see detached before a feature powers it off),
//!   [`decide::elsewhere`] (whether another node could run a pod: a
//!   reboot does not wait on the PDB of a pod with nowhere to go),
//!   [`decide::selector`] (matching and checking label selectors), [`decide::jobs`],
//!   [`decide::claim`], [`decide::foreign`], [`decide::node_conditions`]
//!   (KEP-5683), [`decide::admission`] (the webhook's refusals),
//!   [`decide::command_check`] (whether a node's agent can run a policy's
//!   commands, asked before the node is taken).
//!   `decide/mod.rs` holds the closed set of effects and outcomes.
//! - `effects/`: [`effects::Interpreter`], the one place that writes to the
//!   API server on the loop's behalf; [`effects::evict`], [`effects::lease`],
//!   [`effects::gate`] (whether a leader may still act), [`effects::events`];
//!   what touches a host: [`effects::host`] and [`effects::host_run`]
//!   (commands as the host's own processes with a record per command id),
//!   [`effects::talos`] (machined's API on its socket, its wire format in
//!   [`effects::talos_wire`]); Constellation's objects and the autoscaler
//!   Deployment written untyped (`effects::objects`); and the outside:
//!   [`effects::provider`] (the cloud plugin), [`effects::prometheus`],
//!   [`effects::http`] (notifications, channels).
//! - `service/`: the loop's wiring. [`service::run`] reads as its stages
//!   (clients, role, side servers, election, watches, context, the cluster
//!   role's tasks, the medik8s leases it may hold from before a restart,
//!   the node controller, shut-down); [`service::watched`]
//!   (every watched kind: its selection, its store, what it wakes),
//!   [`service::watch`] (watch machinery),
//!   [`service::passes`] (the scheduler loop: kicks, one pass at a time, wake
//!   floors), [`service::leader`] (election and hand-over), [`service::requests`], [`service::fresh`] and
//!   [`service::stores`] (the mutation cache), [`service::roles`],
//!   [`service::context`] (state only), [`service::executor`],
//!   [`service::contain`] (one object's failure stays with it),
//!   [`service::cluster`] (the
//!   cluster role's one scheduler; [`service::planned`] last), background
//!   answers no pass waits for (one cache, [`service::background`], for
//!   [`service::alerts`], [`service::health`] and [`service::channels`];
//!   the queues of [`service::notifier`]; what a rollout's gates
//!   read of them, once for both: [`service::gate_answers`]), one module per feature's
//!   half ([`service::reboots`], [`service::upgrades`], [`service::mutex`],
//!   [`service::replace`]), `service::node_controller` (what triggers a
//!   node's reconcile, how many run at once, how one is retried) and
//!   [`service::reconcile`] (one node's reconcile, with the DrainRules and
//!   namespace labels its drain reads from [`service::drain_rules`]),
//!   [`service::connect`] (credentials, the HTTP/2 client, start-up checks),
//!   [`service::node_pods`] (the pods of nodes a reboot or upgrade is about
//!   to take, read for do-not-disrupt), [`service::volumes`] (a drained
//!   node's VolumeAttachments, read while a feature's maintenance waits
//!   for them), [`service::own_node`] (where this process runs, and
//!   whether the cluster role may take that node), [`service::elsewhere`] (the other nodes a reboot's drain
//!   asks about: the store, or a paged read where the role sees fewer),
//!   [`service::kubeconfig`] (kubeconfig files read as kube-client reads them,
//!   through one untyped [`service::yaml_tree`] for the binary's size),
//!   [`service::metrics`], and beside the loop the opt-in webhook
//!   ([`service::admission`]).
//! - `deploy/`: every deployment artifact rendered from the code's types and
//!   constants ([`deploy::TARGETS`]; RBAC from one table, [`deploy::GRANTS`]);
//!   `k3s-manifests/` and `image/` hold its output, checked by a test.
//! - `cli/`: raw flags → validated configs per command family.
//! - [`runtime`] (one smol executor inside `Compat`: a node agent's tasks on
//!   its main thread only, the cluster role's on a helper thread too;
//!   signals, [`runtime::Latch`]),
//!   [`error`], [`yaml`], [`logging`], [`counts`].
//! - `tests/`: integration tests against a real control plane, real
//!   kubelets, rebooting machines and OS images (`tests/README.md`).
//!
//! ## Invariants
//! Each names the test that holds it.
//!
//! - **`decide/` performs no I/O and reads no clock**: time comes in
//!   through the snapshot (`architecture_tests::decide_performs_no_io_and_reads_no_clock`).
//! - **Layers import downwards only**
//!   (`architecture_tests::layers_import_downwards_only`); **within a
//!   layer, modules import each other without cycles** (a module and its
//!   submodules counted as one;
//!   `architecture_tests::modules_within_a_layer_import_each_other_without_cycles`),
//!   and **this map
//!   names every module** of `decide/`, `effects/` and `service/`
//!   (`architecture_tests::every_module_is_named_in_the_map`); its links
//!   are checked by `cargo doc` in `just lint`. **No source file is
//!   longer than 600 lines** (its unit tests aside): one that grows is
//!   split by what it holds, the parts its child modules
//!   (`architecture_tests::no_source_file_is_longer_than_600_lines`).
//! - **Only [`effects`] writes to the API server** on the loop's behalf
//!   (`architecture_tests::only_effects_write_to_the_api_server`). A write
//!   that replaces what another writer may have written carries the
//!   resourceVersion it was decided on, a delete the UID; creates are
//!   idempotent by a deterministic name. Status is server-side applied by
//!   one field manager; keys it drops are sent null. The exceptions: merge
//!   patches of node labels and annotations only nodekeeper writes.
//! - **Only [`runtime`] starts futures**, inside `Compat`, where kube's
//!   tokio-based client finds its reactor; we run no tokio runtime
//!   (`architecture_tests::only_runtime_starts_futures`).
//! - **Nothing waits on kube-runtime's `Store::wait_until_ready`** (it wakes
//!   one waiter only, and the controller is one): readiness is a
//!   [`runtime::Latch`] per watched kind
//!   (`architecture_tests::no_store_waits_until_ready`).
//! - **Everything needed to resume lives in the API server**: statuses (the
//!   admission records, written before a node is taken), node annotations
//!   (the maintenance, who cordoned, reboot and upgrade issued per boot,
//!   command results), leases, replacement's records
//!   (`tests/reboot_chaos.rs`, `upgrade::sigkill_mid_hook_and_mid_upgrade_repeats_nothing`,
//!   `maintenance::agent_killed_mid_drain_converges_after_restart`).
//! - **Never a double reboot; nothing runs twice for one step; a person's
//!   request is an epoch**: a reboot only in the boot recorded at admission
//!   and not yet issued in it for the same ask (`<boot>@need=<stamp>`: a
//!   `reboot-required` after a failure is a new ask and runs once more);
//!   Jobs named from the admission, and a Job a person deleted never
//!   created again (`JobDeleted`); an upgrade command once per node,
//!   version, boot and attempt, attached to (not restarted) by an agent that restarts
//!   (`reboot_chaos::crashes_at_every_stage_and_an_apiserver_restart_converge_without_a_double_reboot`,
//!   `real_machines::an_agent_killed_at_the_worst_moment_reboots_its_machine_once`,
//!   `decide::reboot::tests::worlds::random_worlds_with_faults_keep_one_owner_budgets_one_reboot_per_need_and_give_every_node_back`,
//!   `reboot::reboot_required_after_a_failed_reboot_runs_the_command_again`,
//!   `upgrade::a_k3s_version_tags_the_image_as_suc_does_and_a_deleted_upgrade_job_stays_deleted`).
//! - **A node mark has one owner**: each `nodeLabels` key and soft taint is
//!   recorded on the node as its object's; no object writes another's, and
//!   marks of an object that no longer governs the node are removed,
//!   level-triggered ([`decide::marking`];
//!   `reboot::two_features_share_a_mark_without_a_fight_and_a_deleted_policy_takes_its_marks`,
//!   the random worlds above). An object asking for a key another owns is
//!   *withheld* that key and says so (`MarksWithheld`, `MarkOwnedBy`), but
//!   does not wait for it: an `after` key is kept by its owner for good, so
//!   waiting on it would hold the node for ever (a change from the first
//!   design, which had the second object wait).
//! - **Notifications at least once, nothing recorded lost**: the notifier
//!   reads statuses, never effects; a new leader resumes after the stored
//!   `status.notifications.through` (a record without one: nothing told
//!   yet, all news), so an event told just before a leader died may be
//!   told once more ([`decide::notify`]; the random worlds' notifier).
//! - **Nothing from outside reaches an argv, an image or a label
//!   unchecked**: `{version}` is filled only with a [`decide::version::Version`]
//!   (`decide::upgrade::channel::tests::an_answer_that_is_not_a_version_is_refused`,
//!   `upgrade::a_channels_redirect_changes_the_version_the_plan_upgrades_to`).
//! - **Another project's clients cannot take our fields**: what nodekeeper
//!   adds to a peer's API (NodeVersion's `nodeSelector`, surge, timeouts)
//!   is recorded where that peer's typed clients keep it (an annotation)
//!   and a write that drops it is read as a loss, reported, not obeyed
//!   (`decide::replace::fields`;
//!   `replace::a_node_version_written_back_by_constellations_client_keeps_its_pool_and_says_so`).
//! - **One owner per node, budgets at every admission, every node given
//!   back**: one live NodeMaintenance per node; the oldest object of a kind
//!   governs (for NodeVersions, a pure share of the nodes:
//!   `decide::replace::shares`); an administrator's preempts a feature's (the random worlds
//!   above, with refused and half-done writes injected, Job strategies,
//!   hook Jobs and channels that move mid-rollout).
//! - **Nothing cordoned or leased for ever**: the NodeMaintenance life
//!   under refused and lost writes, restarts that lose the node's memory,
//!   nodes deleted and registered again; no uncordon while a maintenance
//!   holds the node or is about to
//!   (`decide::maintenance::tests::world::random_maintenance_worlds_never_uncordon_a_held_node_and_give_every_node_back`).
//! - **A node is never taken for a host command that cannot run**: its agent
//!   checks the command before admission
//!   (`upgrade::a_command_that_does_not_exist_drains_no_node`).
//! - **One leader acts**: it may start effects only within 10 s of its last
//!   renewal of a 15 s lease; a standby counts by its own monotonic clock
//!   (`cluster_role::two_cluster_roles_on_one_host_elect_one_leader`,
//!   `cluster_role::a_leader_that_cannot_renew_stops_within_its_renew_deadline`).
//! - **Bad input touches no node** and reports itself on its object, or the
//!   schema refuses it naming the field
//!   (`catalogue::every_bad_object_is_refused_or_reported_and_touches_no_node`).
//! - **An idle process makes no requests but its lease's**
//!   (`cluster_idle::an_idle_cluster_role_with_every_kind_and_bad_objects_makes_only_its_lease_requests`).
//! - **What we ship is what we test**: every integration test runs
//!   nodekeeper with the shipped identities and fails on any `forbidden` in
//!   its log (`tests/support`'s `Agent`), the checked-in manifests equal the
//!   generator's output (`deploy::tests`, `tests/manifests.rs`), the README's
//!   flag, target and RBAC tables equal the code's
//!   (`cli::tests::checked_in_readme_tables_match_the_code`).
//!
//! ## Cross-cutting concerns
//! - **Roles.** Reboots and upgrades: the cluster role decides (admission,
//!   verification, give-back), the node role acts on its host and drains
//!   through the NodeMaintenance; with `--node-agents` the cluster role
//!   drains nothing, without agents it drains every node (reboots through
//!   `reboot.remoteCommand`, upgrades as `Job`s). A pool (`--node-selector`)
//!   has its own leader Lease and handles the objects whose selector names
//!   its labels. The mutex operator's flow runs only in an unscoped role.
//! - **The cluster role's scheduler** ([`service::cluster`]): one task runs
//!   passes over every RebootPolicy, UpgradePlan and mutex object, kicked
//!   by the watches of what they read, kicks during a pass folded into one
//!   more. One object's failure gets an event and `Reconciled=False` and is
//!   retried with backoff (reset by a spec edit, never by the object's own
//!   status write, [`service::failing`]); every other object goes on. Replacement has its
//!   own task (a provider call may take its timeout).
//! - **What each role watches**: a node agent its own Node, the pods bound
//!   to it and the NodeMaintenances naming it (field selectors); the cluster
//!   role every node (slim) and NodeMaintenance, and pods only where it acts
//!   ([`service::pod_watches`]). Both watch RebootPolicies and UpgradePlans
//!   whole, and DrainRules (an agent only from its first drain with a
//!   pod a rule could place, [`service::stores::OnDemand`]: restarted by
//!   its node's reboot, it neither lists them nor renews their watch every
//!   290 s until it drains).
//! - **Orphans**: a NodeMaintenance whose node does not exist is the cluster
//!   role's at once (from its anchor node), every agent's after a grace,
//!   one winner by resourceVersion ([`decide::foreign`]).
//! - **Liveness**: `/healthz` fails after 90 s without a finished reconcile;
//!   watches retry each on its own, so an API server restart is seen again
//!   within about 0.1 s of it answering. Every read answered 429 or 5xx
//!   with a `Retry-After` is asked again after it, ten times, as client-go
//!   does ([`service::read_again`]): a CRD created a moment ago answers
//!   "storage is (re)initializing" until its watch cache is ready. The
//!   start-up checks (server, node, CRDs: a wrong setting ends the start
//!   with one line) are more patient still: any 429 or 5xx, for up to a
//!   minute ([`service::connect::patiently`]).
//! - **Three layers of tests.** Pure decisions with seeded random worlds
//!   (`decide/`, no I/O); the executor, the interpreter and the per-object
//!   containment against a scripted API server, a kube `Client` over an
//!   in-process tower service that answers from a script and records every
//!   request (`service::scripted_tests`, milliseconds); and the real
//!   control plane, kubelets and rebooting machines (`tests/`, minutes).
//!   A property of one pass's requests belongs in the middle layer.
//!
//! ## Deliberate choices
//! - Per-owner drain options travel as NodeMaintenance annotations: the
//!   CRD keeps medik8s's shape.
//! - The kube `Client` runs on our own connector ([`service::connect`]):
//!   HTTP/2 by ALPN, so watches and every eviction share one connection;
//!   kube's 429 retries are off (a 429 is a PDB's answer the drain reports).
//!   Pod watches read apart: the node role's over HTTP/1.1 (a 110-pod
//!   drain's events outran the API server's HTTP/2 writer), the cluster
//!   role's per drained node over HTTP/2 connections of up to 80 watches
//!   (`service::pod_watches`: a connection per watch was most of a burst's
//!   memory); the leader's Lease has a connection of its own.
//! - Pods and nodes are held slim (a node: metadata, spec, conditions and
//!   system info); a health gate's workloads are read into the fields it
//!   judges by as each list page is parsed; Jobs and the mutex kinds
//!   untyped: the cluster
//!   role holds every node, and the binary's size budget is 8 MiB. Work
//!   that waits for a shared limit waits before it exists: an eviction
//!   takes its permit before its task is spawned, so 100 drains at once
//!   hold 110 requests, not 3 000 parked tasks.
//! - The reboot admission record is the RebootPolicy's status (one guarded
//!   write), not a lock object; settling holds one slot, not every slot.
//! - Host commands run as the host's processes (`host-run`: PID 1's
//!   namespaces and cgroups, a record per command), never inside the agent's
//!   container; the reboot profile reaches the host with host PID and three
//!   capabilities, only the upgrade profile is privileged.
//! - Notifications and channels are read from statuses and URLs in the
//!   background; no decision waits on the network.
//! - Watches list with a consistent read (an `Any` list can loop on 410
//!   after an API server restart), but for one: the pods of a node the
//!   cluster role starts to drain come from the watch cache as it is, as
//!   one streaming watch (`sendInitialEvents`; a list and a watch where
//!   the server refuses it), looked at again from the cache after any
//!   error, never through a consistent list (with a field selector it reads
//!   every pod from etcd) — the first eviction does not wait for the cache
//!   to catch up with etcd, and a drain costs one request less. At most
//!   three nodes' pods are read at once: priority and fairness prices each
//!   read by every pod in the cluster, and 100 at once held every seat
//!   the maintenances' own writes needed ([`service::pod_watches`]).

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
