//! The random worlds' UpgradePlans: up to two overlapping plans (random
//! pools, versions and budgets) beside the RebootPolicies, decided by
//! `upgrade::decide` on fresh or stale copies, their nodes upgraded by
//! the node role's `upgrade::node` (its command check first), a plan now
//! and then deleted mid-run; some follow a channel whose answer changes
//! mid-rollout (a newer release, a pulled one, a failed question); some
//! upgrade through a Job and have hook Jobs (`worlds/jobs.rs`). Invariants: a plan takes only a node its
//! agent said can run the command (a Job strategy needs none), the oldest
//! plan selecting it, within its budget; at most one upgrade command per
//! node, version and boot.

use std::collections::BTreeMap;

use crate::api::node::Node;
use serde_json::json;

use super::super::world_tools::Rng;
use super::*;
use crate::api::upgrade::{CHECK_ANNOTATION, RESULT_ANNOTATION, UpgradePlan, UpgradePlanSpec};
use crate::decide::HostAction;
use crate::decide::upgrade::{self, channel, node as upgrade_node};

/// The label the worlds' nodes report their version in.
pub(super) const VERSION: &str = "version";

/// Up to two plans, created at random times over random pools.
pub(super) fn plans(rng: &mut Rng) -> Vec<UpgradePlan> {
    let mut plans = Vec::new();
    for i in 0..rng.below(3) {
        let (strategy, hooks) = super::jobs::strategy_and_hooks(rng);
        let mut spec = json!({
            "version": if rng.chance(50) { "v2" } else { "v3" },
            "versionFrom": {"source": "Label", "key": VERSION},
            "strategy": strategy,
            "hooks": hooks,
            "budget": {"maxUnavailable": 1 + rng.below(2)},
        });
        // A channel instead of a version, now and then.
        if rng.chance(30) {
            spec["channel"] = json!(CHANNEL);
            if let Some(o) = spec.as_object_mut() {
                o.remove("version");
            }
        }
        // Marks: the `during` key the policies use too, half the time.
        if rng.chance(50) {
            spec["nodeLabels"] = json!({"during": {"example.com/maintenance": "true"}});
        }
        spec["preferNoScheduleWhileWaiting"] = json!(rng.chance(40));
        let spec: UpgradePlanSpec = serde_json::from_value(spec).unwrap_or_else(|e| panic!("{e}"));
        let name = format!("u{i}");
        let mut p = UpgradePlan::new(&name, spec);
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.generation = Some(1);
        p.metadata.resource_version = Some("1".into());
        p.metadata.creation_timestamp = Some(Time(
            now()
                .checked_sub(SignedDuration::from_secs(3600 - 60 * rng.below(30) as i64))
                .unwrap_or_default(),
        ));
        p.spec.node_selector = pool_selector(rng);
        plans.push(p);
    }
    plans
}

/// The channel of the plans that follow one.
const CHANNEL: &str = "https://channel.invalid/stable";

/// What a hostile channel answers: a command, an image reference, a label
/// breaker. Each carries [`MARKER`], which no effect may ever carry.
const HOSTILE: [&str; 3] = [
    "https://channel.invalid/releases/v2;%20touch%20%2Ftmp%2Fpwned",
    "https://channel.invalid/releases/$(pwned)",
    "https://channel.invalid/releases/v2@sha256:pwned%0Aevil",
];

/// The part of every hostile answer that must never reach an effect.
pub(super) const MARKER: &str = "pwned";

fn plan_selects(p: &UpgradePlan, node: &Node) -> bool {
    matches(p.spec.node_selector.as_ref(), node)
}

impl World {
    /// The cluster role's pass for one plan (fresh or stale), then the
    /// give-back of nodes whose plan is gone.
    pub(super) fn plan_pass(&mut self, i: usize) {
        let stale = self.rng.chance(15);
        let name = self.plans[i].name_any();
        let p = match self.stale_plans.get(&name) {
            Some(old) if stale => old.clone(),
            _ => self.plans[i].clone(),
        };
        let notified = self.notice_plan(&p);
        let nodes = Self::arcs(&self.nodes);
        let nms = self.seen_by_cluster();
        let plans = Self::arcs(&self.plans);
        let no_pods = |_: &str| -> Vec<Arc<Pod>> { Vec::new() };
        let now = self.clock(super::faults::CLUSTER);
        let plan = upgrade::decide(&upgrade::Snapshot {
            plan: &p,
            nodes: &nodes,
            maintenances: &nms,
            jobs: &self.jobs_seen(),
            job_errors: &Default::default(),
            pods_on: &no_pods,
            node_pods: &|n| self.opted.pods_of(n),
            own_node: &|n| self.own.of(n),
            now,
            plans: &plans,
            failing: None,
            alerts: None,
            health: None,
            gates_unlisted: None,
            notified: notified.as_ref(),
            channel: p.spec.channel.as_ref().and(self.channel.as_ref()),
        });
        let agent_gives_back = upgrade::node::agent_gives_back(&p);
        self.check_own_node(&format!("plan {name}"), agent_gives_back, &plan.effects);
        self.check_opted_out(&format!("plan {name}"), now, &plan.effects);
        self.run(&format!("plan {name}"), &plan.effects);
        self.give_back_plans();
    }

    pub(super) fn give_back_plans(&mut self) {
        let effects = upgrade::orphans(&Self::arcs(&self.nms), &Self::arcs(&self.plans));
        self.run("plan give-back", &effects);
    }

    /// The node role's upgrade half on node `i`: check the governing
    /// plan's command, then run what is due.
    pub(super) fn upgrade_agent(&mut self, i: usize) {
        let n = self.nodes[i].clone();
        let name = n.name_any();
        let plans = Self::arcs(&self.plans);
        if let Some((key, _)) = upgrade_node::to_check(&n, &plans) {
            let answer = if self.cannot_run.contains(&name) {
                Err("/sbin/upgrade: not found".to_string())
            } else {
                Ok(())
            };
            if let Some(e) = upgrade_node::record_check(&n, &key, &answer) {
                self.run(&format!("agent {name}"), &[e]);
            }
        }
        let n = self.nodes[i].clone();
        let on = self.seen_by_agents(&name);
        let effects = upgrade_node::decide(&upgrade_node::Snapshot {
            node: &n,
            maintenances: on,
            plans: &plans,
        });
        self.run(&format!("agent {name}"), &effects);
    }

    /// A plan taking `n`: its agent said the command runs there, it is the
    /// oldest plan selecting it, and its budget holds.
    pub(super) fn check_plan_admission(&mut self, who: &str, n: &Node, owner: &str) {
        let node = n.name_any();
        let Some(p) = self.plans.iter().find(|p| p.name_any() == owner) else {
            return;
        };
        // An upgrade Job needs no command on the host: nothing to check.
        assert!(
            p.spec.strategy.job().is_some()
                || upgrade_node::check_of(n, p) == upgrade_node::Check::Runnable,
            "{who} took {node} without its agent saying the command runs there"
        );
        let governor = self
            .plans
            .iter()
            .filter(|q| plan_selects(q, n))
            .min_by_key(|q| {
                (
                    q.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    q.name_any(),
                )
            })
            .map(|q| q.name_any());
        assert_eq!(
            governor.as_deref(),
            Some(owner),
            "{node} taken by {owner}, not by the oldest plan selecting it"
        );
        let budget = budget_of(&p.spec.budget.max_unavailable);
        let selected: Vec<&Node> = self.nodes.iter().filter(|x| plan_selects(p, x)).collect();
        let down = selected
            .iter()
            .filter(|x| x.name_any() == node || self.unavailable(x))
            .count();
        self.trace.push(format!("{who} takes {node} ({down} down)"));
        // Checked when admitted; a create that comes later carries out an
        // earlier admission, whose record held the slot meanwhile.
        assert!(
            !self.admitted_now.contains(&format!("{owner}/{node}"))
                || self.unavailable(n)
                || down <= budget,
            "{owner} took {node}: {down} of its nodes unavailable, budget {budget}"
        );
    }

    /// The API server's side of a plan's status write (guarded).
    pub(super) fn write_plan_status(
        &mut self,
        who: &str,
        plan: &str,
        resource_version: &Option<String>,
        status: &crate::api::upgrade::UpgradePlanStatus,
    ) -> Result<(), String> {
        let rv = self.bump();
        let Some(p) = self.plans.iter_mut().find(|p| p.name_any() == plan) else {
            return Err("plan gone".into());
        };
        if resource_version.is_some() && *resource_version != p.metadata.resource_version {
            return Err(format!("{who}: status write on a stale plan refused"));
        }
        let was = |n: &str| {
            p.status
                .iter()
                .flat_map(|s| s.nodes.iter())
                .find(|e| e.name == n)
                .map(|e| e.phase.admitted())
        };
        let admitted: Vec<String> = status
            .nodes
            .iter()
            .filter(|e| e.phase.admitted() && was(&e.name) != Some(true))
            .map(|e| format!("{plan}/{}", e.name))
            .collect();
        self.admitted_now.extend(admitted);
        p.status = Some(status.clone());
        p.metadata.resource_version = Some(rv);
        Ok(())
    }

    /// The host's side of an upgrade command: counted per node, version
    /// and boot; it succeeds most of the time (the node then reports the
    /// version), and its result is recorded as the agent would.
    pub(super) fn run_upgrade(&mut self, who: &str, e: &Effect) -> Result<(), String> {
        let Effect::RunHost {
            node,
            action: HostAction::Command(argv),
            id,
            ..
        } = e
        else {
            return Ok(());
        };
        // A second run of one id attaches to the first (the host's record)
        // and publishes its result again: not a second command.
        if let Some(ok) = self.host_runs.get(id).copied() {
            self.trace
                .push(format!("{node}: upgrade command {id} attached to, ok={ok}"));
            let outcome = crate::decide::Outcome::HostRan {
                ok,
                output: if ok { String::new() } else { "exit 1".into() },
            };
            if let Some(follow) = crate::decide::once_per_boot::after_command(e, &outcome) {
                self.apply(who, &follow)?;
            }
            return Ok(());
        }
        let version = argv.get(1).cloned().unwrap_or_default();
        let boot = self
            .nodes
            .iter()
            .find(|n| n.name_any() == *node)
            .and_then(|n| boot_id(n).map(str::to_string))
            .unwrap_or_default();
        let count = self
            .upgrades
            .entry((node.clone(), version.clone(), boot))
            .or_default();
        *count += 1;
        assert!(
            *count <= 1,
            "{node}: a second upgrade command to {version} in one boot"
        );
        let ok = !self.rng.chance(15);
        self.host_runs.insert(id.clone(), ok);
        self.trace
            .push(format!("{node}: upgrade command to {version}, ok={ok}"));
        let outcome = crate::decide::Outcome::HostRan {
            ok,
            output: if ok { String::new() } else { "exit 1".into() },
        };
        if ok && let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == *node) {
            n.metadata
                .labels
                .get_or_insert_default()
                .insert(VERSION.into(), version);
        }
        if let Some(follow) = crate::decide::once_per_boot::after_command(e, &outcome) {
            self.apply(who, &follow)?;
        }
        Ok(())
    }

    /// The channel's resolver: it names v2 after a while, now and then a
    /// newer release (v3) or back (a release pulled), mid-rollout, and
    /// sometimes fails to answer or answers something hostile (the version
    /// it named is kept). Each answer is a `302` read and recorded as the
    /// service reads and records it.
    pub(super) fn resolve_channel(&mut self) {
        let roll = self.rng.below(100);
        let named = self.channel.as_ref().and_then(|c| c.version.clone());
        let version = match (named.as_deref(), roll) {
            (None, 0..60) => Some("v2"),
            (None, _) => None,
            (Some("v2"), 0..4) => Some("v3"),
            (Some(_), 0..2) => Some("v2"),
            (Some(v), _) => Some(v),
        };
        let location = match roll {
            95..97 => Some(HOSTILE[self.rng.below(HOSTILE.len() as u64) as usize].to_string()),
            97.. => None,
            _ => version.map(|v| format!("https://channel.invalid/releases/{v}")),
        };
        let answer = match &location {
            Some(l) => channel::version_of(CHANNEL, 302, Some(l)),
            None => Err("GET https://channel.invalid/stable: 503".to_string()),
        };
        if roll >= 95 || version.is_some() {
            self.hostile_refused += usize::from((95..97).contains(&roll) && answer.is_err());
            let mut status = self
                .channel
                .clone()
                .unwrap_or(crate::api::upgrade::ChannelStatus {
                    url: CHANNEL.into(),
                    ..Default::default()
                });
            let old = status.version.clone();
            channel::record(&mut status, answer, self.now);
            if status.version != old {
                self.trace
                    .push(format!("the channel names {:?}", status.version));
            }
            self.channel = Some(status);
        }
    }

    /// Now and then a plan is deleted mid-run (its nodes are given back).
    pub(super) fn maybe_delete_plan(&mut self) {
        if !self.plans.is_empty() && self.rng.chance(3) {
            let i = self.rng.below(self.plans.len() as u64) as usize;
            let gone = self.plans.remove(i);
            self.trace.push(format!("plan {} deleted", gone.name_any()));
        }
    }
}

/// Upgrade commands are told from reboot commands by what they record.
pub(super) fn is_upgrade(e: &Effect) -> bool {
    matches!(e, Effect::RunHost { record, .. } if record.annotation == RESULT_ANNOTATION)
}

/// How many upgrade commands ran in all worlds, and how many nodes said
/// their command could not run (the worlds must exercise both).
pub(super) fn tally(w: &World, totals: &mut BTreeMap<&'static str, usize>) {
    *totals.entry("upgrade commands").or_default() += w.upgrades.len();
    *totals.entry("hostile channel answers refused").or_default() += w.hostile_refused;
    *totals.entry("MaintenancePlanned=True writes").or_default() += w.planned_writes.0;
    *totals.entry("MaintenancePlanned=False writes").or_default() += w.planned_writes.1;
    *totals.entry("nodes that cannot run").or_default() += w
        .nodes
        .iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CHECK_ANNOTATION))
                .is_some_and(|v| v.contains("cannot run"))
        })
        .count();
}
