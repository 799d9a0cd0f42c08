//! The node role's half of in-place upgrades, pure: once an UpgradePlan's
//! NodeMaintenance has drained the own node and the plan's status says
//! Upgrading, run the upgrade command — recorded on the node first
//! (`nodekeeper.io/upgrade-issued = <plan>/<version>/<boot>`, guarded), so
//! it runs at most once per plan, version and boot — and, when the plan
//! asks for it and the command succeeded, the reboot (through the reboot
//! feature's once-per-boot record). Back at the version (in a new boot,
//! when the plan reboots) and Ready, the agent gives its node back itself
//! when the plan has nothing left for the cluster role to do
//! ([`agent_gives_back`]): on a single-node cluster the cluster role's pod
//! may be waiting Pending on this very cordoned node.

use std::sync::Arc;
use std::time::Duration;

use crate::api::node::Node;
use kube::ResourceExt;
use serde_json::json;

use super::{at_version, recorded_token};
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::upgrade::*;
use crate::decide::disrupt::boot_id;
use crate::decide::maintenance::annotation;
use crate::decide::once_per_boot::{Ask, failure_in, issue, issued_in};
use crate::decide::reboot::facts::talos_release;
use crate::decide::{Effect, HostAction, HostRecord};

/// What the node role knows about its node's upgrade.
pub struct Snapshot<'a> {
    pub node: &'a Node,
    /// NodeMaintenances on this node.
    pub maintenances: Vec<&'a NodeMaintenance>,
    pub plans: &'a [Arc<UpgradePlan>],
}

/// The node role's effects for its own node's upgrade, in order.
pub fn decide(s: &Snapshot) -> Vec<Effect> {
    let node = s.node;
    let n = node.name_any();
    let Some(boot) = boot_id(node) else {
        return Vec::new();
    };
    if let Some(back) = given_back_after_upgrade(s, boot) {
        return back;
    }
    for m in crate::decide::rollout::drained_by(&s.maintenances, OWNER_KIND) {
        let Some(plan) = plan_of(s, m) else {
            continue;
        };
        // Type Job: the cluster role's Job upgrades the node, not its agent.
        if plan.spec.strategy.job().is_some() {
            continue;
        }
        // Only what the plan recorded: this node upgrading, admitted in
        // this boot (after a reboot the boot differs and nothing runs).
        let Some(e) = plan.entry(&n).filter(|e| {
            e.phase == UpgradePhase::Upgrading && e.boot_id_before.as_deref() == Some(boot)
        }) else {
            continue;
        };
        let version = e.version.as_deref().unwrap_or(plan.target_version());
        // What fills `{version}` in a root command is checked here too,
        // whoever wrote the plan's status.
        if crate::decide::version::Version::parse(version).is_err() {
            continue;
        }
        let t = recorded_token(node, &plan.name_any(), version, boot, e.attempt);
        let reboot_ask = Ask::upgrade(boot, &t);
        let strategy = &plan.spec.strategy;
        if annotation(node, ISSUED_ANNOTATION) == Some(t.as_str()) {
            // Issued in this boot, no result yet: the command runs, or ran,
            // as the host's process (an agent that restarted meanwhile
            // lost sight of it). Running it again attaches to that run by
            // its id and publishes its result; it never starts a second.
            // A Talos action is kept by the agent that ran it
            // (`effects::talos::Ran`): the same agent is given the result.
            // An agent restarted meanwhile calls machined again — the lost
            // agent's call was cancelled with it, and machined refuses a
            // second while one runs — never two at once.
            let result = annotation(node, RESULT_ANNOTATION).unwrap_or_default();
            if !result.starts_with(&format!("{t} ")) {
                return vec![run(node, &t, plan, version)];
            }
            // With a reboot to follow: only after the command succeeded,
            // and once per boot.
            let ok = result == format!("{t} ok");
            // machined's old upgrade call reboots by itself: no second one.
            let own_reboot = !matches!(
                upgrade_action(strategy, version, node),
                HostAction::TalosUpgrade { legacy: true, .. }
            );
            if strategy.reboots()
                && own_reboot
                && ok
                && !issued_in(node, &reboot_ask)
                && failure_in(node, &reboot_ask).is_none()
            {
                return issue(node, &reboot_ask, reboot_action(strategy, version, &n));
            }
            continue;
        }
        if at_version(node, &plan.spec.version_from, version) && !strategy.reboots() {
            continue;
        }
        // At most one command per node, version and boot, whichever plan
        // asks: another plan's failed attempt is not repeated by this one.
        // This plan's earlier attempt is (a retry: the spec changed).
        if issued_for(node, version, boot).is_some_and(|o| o != plan.name_any()) {
            continue;
        }
        return vec![
            Effect::PatchNode {
                node: n.clone(),
                resource_version: node.resource_version(),
                patch: json!({"metadata": {"annotations": {ISSUED_ANNOTATION: t}}}),
            },
            run(node, &t, plan, version),
        ];
    }
    Vec::new()
}

/// Whether the node agent gives its node back after `plan`'s upgrade,
/// with no cluster role needed: the agent ran the command (not a Job,
/// which the cluster role creates) and no after hook is left to run (the
/// cluster role runs them, as Jobs, before the node is given back). An
/// admission counts on it when the cluster role's own pod is evicted by
/// the drain (`rollout::own_node_hold`).
pub fn agent_gives_back(plan: &UpgradePlan) -> bool {
    plan.spec.strategy.job().is_none() && plan.spec.hooks.after.is_empty()
}

/// The upgrade the agent ran for its plan's maintenance succeeded, the
/// node reports the version — in a new boot when the plan reboots — and
/// is Ready: the cluster role's test of a verified upgrade
/// (`stages::upgrading`), so the agent gives the node back itself when
/// [`agent_gives_back`]. The cluster role, where it runs, records the
/// upgrade as verified on seeing the node back at the version.
fn given_back_after_upgrade(s: &Snapshot, boot: &str) -> Option<Vec<Effect>> {
    let node = s.node;
    if !crate::decide::node_ready(node) {
        return None;
    }
    crate::decide::rollout::drained_by(&s.maintenances, OWNER_KIND).find_map(|m| {
        let plan = plan_of(s, m)?;
        let e = plan
            .entry(&node.name_any())
            .filter(|e| matches!(e.phase, UpgradePhase::Upgrading | UpgradePhase::Verifying))?;
        let before = e.boot_id_before.as_deref()?;
        let version = e.version.as_deref().unwrap_or(plan.target_version());
        let t = recorded_token(node, &plan.name_any(), version, before, e.attempt);
        let ran = annotation(node, RESULT_ANNOTATION) == Some(format!("{t} ok").as_str());
        let back = agent_gives_back(plan)
            && ran
            && (before != boot || !plan.spec.strategy.reboots())
            && at_version(node, &plan.spec.version_from, version);
        back.then(|| crate::decide::rollout::give_back(m).into_iter().collect())
    })
}

/// The plan that owns maintenance `m`, if it still exists.
fn plan_of<'a>(s: &'a Snapshot, m: &NodeMaintenance) -> Option<&'a Arc<UpgradePlan>> {
    let owner = m.owner_references().iter().find(|o| o.kind == OWNER_KIND)?;
    s.plans.iter().find(|p| p.name_any() == owner.name)
}

/// The upgrade command of `plan` to `version` on node `n`, whose token is
/// `t`: its id on the host, and what its result records.
fn run(node: &Node, t: &str, plan: &UpgradePlan, version: &str) -> Effect {
    Effect::RunHost {
        node: node.name_any(),
        id: t.to_string(),
        action: upgrade_action(&plan.spec.strategy, version, node),
        record: HostRecord {
            annotation: RESULT_ANNOTATION,
            failed: format!("{t} failed: "),
            succeeded: Some(format!("{t} ok")),
        },
        timeout: Duration::from_secs(plan.spec.deadlines.upgrade_seconds.max(1) as u64),
    }
}

/// The plan that already issued the upgrade to `version` on this node in
/// `boot`, if one did.
pub fn issued_for(node: &Node, version: &str, boot: &str) -> Option<String> {
    let record = annotation(node, ISSUED_ANNOTATION)?;
    // `<plan>/<version>/<boot>[/<attempt>]`: no part holds a `/`.
    let parts: Vec<&str> = record.split('/').collect();
    match parts.as_slice() {
        [plan, v, b] | [plan, v, b, _] if *v == version && *b == boot => Some(plan.to_string()),
        _ => None,
    }
}

pub use crate::decide::command_check::Check;

/// What a check is of: the plan's name, spec generation and uid (a plan
/// re-created under the same name is checked afresh).
pub fn check_key(plan: &UpgradePlan) -> String {
    crate::decide::command_check::key(plan)
}

/// The agent's check of `plan` as recorded on `node`.
pub fn check_of(node: &Node, plan: &UpgradePlan) -> Check {
    crate::decide::command_check::recorded(node, CHECK_ANNOTATION, &check_key(plan))
}

/// The commands the agent must check before its node can be admitted: the
/// governing plan's upgrade command (and its reboot command, when it
/// reboots), expanded for this node, with the key to record the answer
/// under. `None` when there is nothing to check: no plan governs the node,
/// it is at the plan's version, or the agent found them runnable for this
/// spec. A failed check is looked at again each time (the program may have
/// been installed since); [`record_check`] writes only a changed answer.
pub fn to_check(node: &Node, plans: &[Arc<UpgradePlan>]) -> Option<(String, Vec<HostAction>)> {
    let plan = super::governing(node, plans)?;
    let spec = &plan.spec;
    let version = plan.target_version();
    // Nothing to check while a channel has named no version yet.
    if version.is_empty()
        || at_version(node, &spec.version_from, version)
        || spec.strategy.job().is_some()
    {
        return None;
    }
    if check_of(node, plan) == Check::Runnable {
        return None;
    }
    let n = node.name_any();
    let mut actions = vec![upgrade_action(&spec.strategy, version, node)];
    if spec.strategy.reboots() {
        actions.push(reboot_action(&spec.strategy, version, &n));
    }
    Some((check_key(plan), actions))
}

/// The upgrade itself: the command on the host, or Talos's upgrade calls
/// (the old one on a node whose osImage names Talos before 1.13).
fn upgrade_action(strategy: &Strategy, version: &str, node: &Node) -> HostAction {
    match &strategy.image {
        Some(image) if strategy.type_ == "Talos" => HostAction::TalosUpgrade {
            // An image tag: `+` → `-`, as SUC writes it.
            image: image.replace("{version}", &crate::decide::version::image_tag(version)),
            legacy: talos_release(node).is_some_and(|r| r < (1, 13)),
        },
        _ => HostAction::Command(expand(&strategy.command, version, &node.name_any())),
    }
}

/// The reboot after the upgrade: through Talos's API for type `Talos`.
fn reboot_action(strategy: &Strategy, version: &str, node: &str) -> HostAction {
    if strategy.type_ == "Talos" {
        HostAction::TalosReboot
    } else {
        HostAction::Command(expand(&strategy.reboot_command, version, node))
    }
}

/// Record the agent's answer on its node, unless it says so already.
pub fn record_check(node: &Node, key: &str, answer: &Result<(), String>) -> Option<Effect> {
    crate::decide::command_check::record(node, CHECK_ANNOTATION, key, answer)
}

/// Expand `{version}` and `{node}` in an argv template. Arguments are never
/// joined into a shell string.
pub fn expand(template: &[String], version: &str, node: &str) -> Vec<String> {
    template
        .iter()
        .map(|a| a.replace("{version}", version).replace("{node}", node))
        .collect()
}
