//! Property test of the disruption decision core over random worlds:
//! nodes in two pools that need reboots, NotReady spells and reboots that
//! fail, up to three overlapping RebootPolicies with random budgets and up
//! to two overlapping UpgradePlans beside them (`worlds/upgrades.rs`: some
//! nodes cannot run the upgrade command, some upgrades fail, a plan may be
//! deleted mid-run; `worlds/jobs.rs`: some upgrade through a Job, some
//! have hook Jobs), nodes deleted now and then, an administrator's
//! NodeMaintenances coming and going, someone else (a person's cordon,
//! another drainer's `DrainInProgress`) holding a node for a while,
//! decisions taken on a stale copy of a policy or plan (the guarded status
//! write must refuse them), the notifier reading every status and the
//! cluster role's process dying now and then (`worlds/notices.rs`: told
//! at most once per hand-over, nothing stored lost), the cluster role
//! running on one of the nodes with replicas coming and going
//! (`worlds/own_node.rs`), pods that opt out of disruption started and
//! taken off by a person, reads of a node's pods failing
//! (`worlds/opted_out.rs`), and everything deleted at the end. Each step runs the same pure functions
//! the service calls (`decide`, `node::decide`, `orphans`) in a random
//! order and applies their effects to the world as the API server would
//! (resourceVersion guards included).
//!
//! Invariants, checked by the world and never read from the product's
//! status: a node has at most one NodeMaintenance a feature created, and
//! none is created on a node that already has one (so at most one
//! disruption at a time, across kinds); an admission never
//! leaves more of a policy's nodes unavailable than its budget; the
//! policy that admits a node is the oldest that selects it; no feature
//! takes a node someone else holds, nor one a pod's do-not-disrupt holds or
//! whose pods are not read, nor the cluster role's own node while
//! it says no (an upgrade never while the drain would evict its only pod); a node gets at
//! most one reboot command per boot, and none while a person has paused
//! it or withdrawn its need; and once every policy is gone, every node is
//! given back (no feature NodeMaintenance, nothing cordoned, nothing
//! planned: `worlds/planned.rs`).
//!
//! The generator is a seeded xorshift, not a crate: a failing case prints
//! its seed, and `NODEKEEPER_WORLD_SEED=N` replays it.

use std::collections::BTreeMap;

use crate::api::node::Node;

use super::world_tools::{
    Rng, all_worlds, budget_of, merge, pool_selector, replaying, world_seeds,
};
use super::*;
use crate::api::upgrade::UpgradePlan;
use crate::decide::Outcome;

mod faults;
use faults::Fault;
mod jobs;
mod marks;
use marks::MARK;
mod notices;
mod opted_out;
mod own_node;
mod people;
mod planned;
mod server;
mod upgrades;

/// How many worlds, and steps in each.
const WORLDS: u64 = 2000;
const STEPS: usize = 40;

struct World {
    rng: Rng,
    now: Timestamp,
    rv: u64,
    nodes: Vec<Node>,
    /// Steps until a rebooting node is back (with a new boot).
    down: BTreeMap<String, u32>,
    boots: BTreeMap<String, u32>,
    policies: Vec<RebootPolicy>,
    /// The copy of each policy as it was one step ago (a stale read).
    stale: BTreeMap<String, RebootPolicy>,
    nms: Vec<NodeMaintenance>,
    /// Reboot commands per host-run id (node, boot and ask).
    commands: BTreeMap<String, u32>,
    /// Reboot commands per (node, boot): (run, failed).
    boot_commands: BTreeMap<(String, String), (u32, u32)>,
    /// How often a person asked again (`reboot-required`) and it wrote.
    asked_again: usize,
    /// Hostile channel answers refused (none may reach an effect).
    hostile_refused: usize,
    plans: Vec<UpgradePlan>,
    stale_plans: BTreeMap<String, UpgradePlan>,
    /// Nodes whose host lacks the upgrade command.
    cannot_run: std::collections::BTreeSet<String>,
    /// Nodes whose agent cannot run the reboot command (installed without
    /// --reboot): never taken for a RebootPolicy.
    cannot_reboot: std::collections::BTreeSet<String>,
    /// Upgrade commands per (node, version, boot).
    upgrades: BTreeMap<(String, String, String), u32>,
    /// What the channel the plans may follow answered last.
    channel: Option<crate::api::upgrade::ChannelStatus>,
    /// The Jobs the API server holds, by `namespace/name` (`worlds/jobs.rs`).
    jobs: BTreeMap<String, jobs::WorldJob>,
    /// Upgrade Jobs completed per (node, version).
    job_upgrades: BTreeMap<(String, String), usize>,
    /// Hook Jobs created.
    hook_jobs: usize,
    /// Who set each (node, label key) in this step (fights).
    mark_writers: BTreeMap<(String, String), String>,
    /// Jobs a person deleted, with their plan and node: never created
    /// again while that admission stands.
    deleted_jobs: BTreeMap<String, (String, String)>,
    jobs_deleted: usize,
    /// The host's records of upgrade commands, by id (`effects::host_run`):
    /// running an id again attaches to its first run.
    host_runs: BTreeMap<String, bool>,
    /// What the run did, for the message of a broken invariant.
    trace: Vec<String>,
    /// MaintenancePlanned writes: (True, False).
    planned_writes: (usize, usize),
    /// The faults injected, and what the fault invariants track.
    faults: faults::Faults,
    /// Nodes whose admission the plan being run wrote (`owner/node`): the
    /// budget is checked when a node is admitted. A create that comes
    /// later (the first one failed) carries out an admission made before,
    /// whose slot the record held meanwhile.
    admitted_now: std::collections::BTreeSet<String>,
    /// How the world is unlike a test bench (`worlds/faults.rs`): store
    /// lag, each actor's own clock, drains that never end, reboots nobody
    /// asked for.
    real: faults::RealWorld,
    /// `NODEKEEPER_WORLD_TRACE` is set: every status entry is traced.
    verbose: bool,
    /// Nodes someone else holds (`worlds/people.rs`): cordoned by a person
    /// (true), or (false) drained by another tool (its `DrainInProgress`)
    /// or marked `karpenter.sh/do-not-disrupt` by a person.
    /// No feature may take one while it holds.
    held_by_others: BTreeMap<String, bool>,
    /// How often someone else took a node.
    others_took: usize,
    /// What the notifier told, and what the statuses stored
    /// (`worlds/notices.rs`).
    notices: notices::Notices,
    /// The node the cluster role runs on, if any, and whether it may be
    /// taken (`worlds/own_node.rs`).
    own: own_node::Own,
    /// Pods with `karpenter.sh/do-not-disrupt` (`worlds/opted_out.rs`).
    opted: opted_out::OptedOut,
}

fn labels_of(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

/// Does `p` select `node`? (The worlds' selectors are matchLabels only.)
fn selects(p: &RebootPolicy, node: &Node) -> bool {
    matches(p.spec.node_selector.as_ref(), node)
}

/// The test's own reading of a selector (matchLabels only; none selects
/// every node).
fn matches(sel: Option<&LabelSelector>, node: &Node) -> bool {
    sel.is_none_or(|s| {
        s.match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels_of(node).get(k) == Some(v))
    })
}

/// The oldest policy selecting `node`, by the test's own reading of the
/// rule (creation time, then name).
fn oldest_selecting<'a>(node: &Node, policies: &'a [RebootPolicy]) -> Option<&'a RebootPolicy> {
    policies
        .iter()
        .filter(|p| selects(p, node))
        .min_by_key(|p| {
            (
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                p.name_any(),
            )
        })
}

fn failed(m: &NodeMaintenance) -> bool {
    m.status.as_ref().and_then(|s| s.phase) == Some(Phase::Failed)
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let count = 2 + rng.below(5) as usize;
        let mut nodes = Vec::new();
        let mut boots = BTreeMap::new();
        for i in 0..count {
            let name = format!("n{i}");
            let mut n = node(&name, &format!("{name}-boot-0"));
            let pool = if rng.chance(50) { "a" } else { "b" };
            n.metadata.labels = Some(
                [
                    ("pool".to_string(), pool.to_string()),
                    (upgrades::VERSION.to_string(), "v1".to_string()),
                ]
                .into(),
            );
            if !rng.chance(70) {
                n = no_need(n);
            }
            boots.insert(name, 0);
            nodes.push(n);
        }
        let mut policies = Vec::new();
        for i in 0..1 + rng.below(3) {
            let mut p = policy(1 + rng.below(3) as i32);
            let name = format!("p{i}");
            p.metadata.name = Some(name.clone());
            p.metadata.uid = Some(format!("uid-{name}"));
            p.metadata.creation_timestamp = Some(Time(
                now()
                    .checked_sub(SignedDuration::from_secs(3600 - 60 * rng.below(30) as i64))
                    .unwrap_or_default(),
            ));
            p.spec.node_selector = pool_selector(&mut rng);
            // Half settle after their reboots: Settling holds the slot
            // and must give the node back whatever fails meanwhile.
            if rng.chance(50) {
                p.spec.gates.settle_seconds = 1 + rng.below(30) as i32;
            }
            // Marks, some on the key the plans use too (findings 2, 6).
            if rng.chance(50) {
                p.spec.node_labels.during = [(MARK.to_string(), "true".to_string())].into();
            }
            p.spec.prefer_no_schedule_while_waiting = rng.chance(40);
            policies.push(p);
        }
        let plans = upgrades::plans(&mut rng);
        // Only plans with a command check it (four in ten upgrade through
        // a Job): one node in six cannot run it.
        let cannot_run = nodes
            .iter()
            .map(|n| n.name_any())
            .filter(|_| rng.chance(16))
            .collect();
        let cannot_reboot = nodes
            .iter()
            .map(|n| n.name_any())
            .filter(|_| rng.chance(5))
            .collect();
        World {
            cannot_reboot,
            stale_plans: plans.iter().map(|p| (p.name_any(), p.clone())).collect(),
            plans,
            cannot_run,
            upgrades: BTreeMap::new(),
            channel: None,
            jobs: BTreeMap::new(),
            job_upgrades: BTreeMap::new(),
            hook_jobs: 0,
            host_runs: BTreeMap::new(),
            rng,
            now: now(),
            rv: 10,
            nodes,
            down: BTreeMap::new(),
            boots,
            stale: policies.iter().map(|p| (p.name_any(), p.clone())).collect(),
            policies,
            nms: Vec::new(),
            commands: BTreeMap::new(),
            boot_commands: BTreeMap::new(),
            asked_again: 0,
            hostile_refused: 0,
            deleted_jobs: Default::default(),
            mark_writers: BTreeMap::new(),
            jobs_deleted: 0,
            trace: Vec::new(),
            planned_writes: (0, 0),
            faults: faults::Faults::on(),
            admitted_now: Default::default(),
            real: Default::default(),
            verbose: std::env::var("NODEKEEPER_WORLD_TRACE").is_ok(),
            held_by_others: BTreeMap::new(),
            others_took: 0,
            notices: Default::default(),
            own: own_node::Own::none(),
            opted: Default::default(),
        }
        .with_real_world()
        .with_own_node()
    }

    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn arcs<T: Clone>(v: &[T]) -> Vec<Arc<T>> {
        v.iter().cloned().map(Arc::new).collect()
    }

    /// The cluster role's pass for one policy, on a fresh or stale copy.
    fn cluster(&mut self, i: usize) {
        let stale = self.rng.chance(15);
        let name = self.policies[i].name_any();
        let p = match self.stale.get(&name) {
            Some(old) if stale => old.clone(),
            _ => self.policies[i].clone(),
        };
        let notified = self.notice_policy(&p);
        let nodes = Self::arcs(&self.nodes);
        let nms = self.seen_by_cluster();
        let policies = Self::arcs(&self.policies);
        let no_pods = |_: &str| -> Vec<Arc<Pod>> { Vec::new() };
        let now = self.clock(faults::CLUSTER);
        let plan = decide(&Snapshot {
            policy: &p,
            nodes: &nodes,
            maintenances: &nms,
            policies: &policies,
            pods_on: &no_pods,
            node_pods: &|n| self.opted.pods_of(n),
            own_node: &|n| self.own.of(n),
            now,
            remote: false,
            failing: None,
            alerts: None,
            health: None,
            gates_unlisted: None,
            notified: notified.as_ref(),
        });
        if self.verbose {
            for e in &plan.effects {
                if let Effect::WritePolicyStatus { status, .. } = e {
                    for n in &status.nodes {
                        self.trace.push(format!(
                            "  {name} says {}: {:?} boot {:?} need {:?} at {}",
                            n.name, n.phase, n.boot_id_before, n.need, self.now
                        ));
                    }
                }
            }
        }
        self.check_liveness(&name, &plan);
        self.check_own_node(&format!("policy {name}"), true, &plan.effects);
        self.check_opted_out(&format!("policy {name}"), now, &plan.effects);
        self.run(&format!("policy {name}"), &plan.effects);
    }

    /// The node role of node `i`.
    fn agent(&mut self, i: usize) {
        let n = self.nodes[i].clone();
        if self.down.contains_key(&n.name_any()) {
            return;
        }
        let policies = Self::arcs(&self.policies);
        let name = n.name_any();
        if let Some((key, _)) = node::to_check(&n, &policies) {
            let answer = if self.cannot_reboot.contains(&name) {
                Err("systemctl: not found".to_string())
            } else {
                Ok(())
            };
            if let Some(e) = node::record_check(&n, &key, &answer) {
                self.run(&format!("agent {name}"), &[e]);
            }
        }
        let n = self.nodes[i].clone();
        let on = self.seen_by_agents(&n.name_any());
        let effects = node::decide(&node::Snapshot {
            node: &n,
            maintenances: on,
            policies: &policies,
            host_needs: None,
            now: self.clock(&n.name_any()),
        });
        self.run(&format!("agent {}", n.name_any()), &effects);
        self.upgrade_agent(i);
    }

    /// What the rest of the cluster does in a step: drains finish, nodes
    /// are cordoned while held, machines come back, people act.
    fn settle(&mut self) {
        self.real.created_now.clear();
        self.real.unanswered.clear();
        self.reboot_out_of_band();
        self.settle_jobs();
        self.resolve_channel();
        // A drain on a node whose pod never leaves Terminating never ends.
        let stuck = self.real.stuck.clone();
        for m in self
            .nms
            .iter_mut()
            .filter(|m| !failed(m) && !stuck.contains(&m.spec.node_name))
        {
            m.status = Some(NodeMaintenanceStatus {
                phase: Some(Phase::Succeeded),
                ..Default::default()
            });
        }
        // A Failed NodeMaintenance (invalid options) never cordoned.
        let held: Vec<String> = self
            .nms
            .iter()
            .filter(|m| !failed(m))
            .map(|m| m.spec.node_name.clone())
            .collect();
        let mut back = Vec::new();
        for (n, left) in self.down.iter_mut() {
            *left -= 1;
            if *left == 0 {
                back.push(n.clone());
            }
        }
        for n in &back {
            self.down.remove(n);
            let b = self.boots.entry(n.clone()).or_default();
            *b += 1;
            let boot = format!("{n}-boot-{b}");
            if let Some(x) = self.nodes.iter_mut().find(|x| x.name_any() == *n)
                && let Some(info) = x.status.as_mut().and_then(|s| s.node_info.as_mut())
            {
                info.boot_id = boot;
            }
        }
        let rv = self.bump();
        // A NotReady spell now and then, on any node.
        let ready_flips: Vec<usize> = (0..self.nodes.len())
            .filter(|_| self.rng.chance(5))
            .collect();
        for x in &mut self.nodes {
            let name = x.name_any();
            let down = self.down.contains_key(&name);
            if let Some(spec) = x.spec.as_mut() {
                let by_hand = self.held_by_others.get(&name) == Some(&true);
                spec.unschedulable = (held.contains(&name) || by_hand).then_some(true);
            }
            if let Some(c) = x.status.as_mut().and_then(|s| s.conditions.as_mut()) {
                c[0].status = if down { "False" } else { "True" }.into();
            }
            x.metadata.resource_version = Some(rv.clone());
        }
        for i in ready_flips {
            if let Some(c) = self.nodes[i]
                .status
                .as_mut()
                .and_then(|s| s.conditions.as_mut())
            {
                c[0].status = "False".into();
            }
        }
        self.forget_ended_admissions();
        self.people();
        self.own_node_moves();
        self.notifier_step();
        self.admin_plans();
        self.stale = self
            .policies
            .iter()
            .map(|p| (p.name_any(), p.clone()))
            .collect();
        self.stale_plans = self
            .plans
            .iter()
            .map(|p| (p.name_any(), p.clone()))
            .collect();
        self.maybe_delete_plan();
        self.opted_out_pods_change();
        self.now = self
            .now
            .checked_add(SignedDuration::from_secs(1 + self.rng.below(20) as i64))
            .unwrap_or(self.now);
    }

    fn step(&mut self) {
        // 0: a policy's pass, 1: a plan's, 2: a node's agent, 3: the
        // MaintenancePlanned pass.
        let mut actors: Vec<(u8, usize)> = (0..self.policies.len())
            .map(|i| (0, i))
            .chain((0..self.plans.len()).map(|i| (1, i)))
            .chain((0..self.nodes.len()).map(|i| (2, i)))
            .chain(std::iter::once((3, 0)))
            .collect();
        // Fisher-Yates: a random interleaving of the cluster role's
        // decisions and the agents'.
        for i in (1..actors.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            actors.swap(i, j);
        }
        for (who, i) in actors {
            match who {
                0 => self.cluster(i),
                1 if i < self.plans.len() => self.plan_pass(i),
                1 => {}
                2 => self.agent(i),
                _ => self.planned_pass(),
            }
        }
        self.check_given_back();
        self.check_visibly_held();
        self.settle();
        self.mark_writers.clear();
    }
}

#[test]
fn random_worlds_with_faults_keep_one_owner_budgets_one_reboot_per_need_and_give_every_node_back() {
    let seeds = world_seeds(WORLDS);
    let mut commands = 0;
    let mut totals = BTreeMap::new();
    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    for seed in seeds {
        let mut w = World::new(seed);
        replaying(
            seed,
            &mut w,
            |w| &w.trace,
            8,
            |w| {
                for _ in 0..STEPS {
                    w.step();
                }
                w.assert_nothing_lost();
                // Faults stop; whatever failed meanwhile must converge.
                w.faults.on = false;
                // Every policy and plan goes; what they held comes back.
                w.policies.clear();
                w.plans.clear();
                w.nms.retain(|m| !m.name_any().starts_with("admin-"));
                w.others_let_go();
                for _ in 0..5 {
                    let effects = orphans(&World::arcs(&w.nms), &[]);
                    w.run("give-back", &effects);
                    let nodes = World::arcs(&w.nodes);
                    let mut marks = crate::decide::reboot::orphaned_marks(&nodes, &[]);
                    marks.extend(crate::decide::upgrade::orphaned_marks(&nodes, &[]));
                    w.run("marks give-back", &marks);
                    w.give_back_plans();
                    w.settle();
                    w.nms.retain(|m| !m.name_any().starts_with("admin-"));
                    w.others_let_go();
                }
                assert!(
                    w.nms.is_empty(),
                    "left after every policy went: {:?}",
                    w.nms.iter().map(|m| m.name_any()).collect::<Vec<_>>()
                );
                assert!(
                    w.nodes
                        .iter()
                        .all(|n| !crate::decide::disrupt::unschedulable(n)),
                    "a node left cordoned"
                );
                w.assert_no_marks_left();
                w.assert_nothing_planned();
            },
        );
        commands += w.commands.len();
        *totals.entry("asked again").or_default() += w.asked_again;
        *totals.entry("held by someone else").or_default() += w.others_took;
        *totals.entry("notified").or_default() += w.notices.told();
        *totals.entry("notifier hand-overs").or_default() += w.notices.handovers;
        *totals.entry("cluster role's node taken").or_default() += w.own.taken;
        *totals.entry("cluster role's node waited for").or_default() += w.own.waited;
        *totals.entry("opted-out pods started").or_default() += w.opted.started;
        *totals.entry("taken once a pod's hold ended").or_default() += w.opted.taken_after;
        *totals.entry("retried in one boot").or_default() +=
            w.boot_commands.values().filter(|(run, _)| *run > 1).count();
        upgrades::tally(&w, &mut totals);
        jobs::tally(&w, &mut totals);
        for (k, n) in &w.faults.refused {
            *faults.entry(*k).or_default() += n;
        }
    }
    // The worlds must exercise reboots, not only waiting.
    println!(
        "{WORLDS} worlds of {STEPS} steps: {commands} reboot commands, {totals:?}; faults injected: {faults:?}"
    );
    if all_worlds() {
        assert!(
            commands > WORLDS as usize,
            "only {commands} reboots in all worlds"
        );
        // And upgrades, some of them on hosts that cannot run them.
        assert!(
            totals.values().all(|n| *n > WORLDS as usize / 10),
            "too few of each in all worlds: {totals:?}"
        );
    }
}
