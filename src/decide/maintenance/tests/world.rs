//! Property test of the NodeMaintenance life over random worlds: one node
//! (schedulable, or cordoned by a person before anything began), up to
//! three NodeMaintenances created and deleted at random times (a person's,
//! or a feature's that a person's preempts), pods that
//! leave at once, after a few steps in Terminating, or only once their
//! PodDisruptionBudget relents, the medik8s lease now and then held by
//! another operator, and a clock that moves 1-20 s a step. Each step runs
//! the node's reconcile as the service does (`decide`, `plan`, the effects
//! with their outcomes folded into the node's memory, `after`, until the
//! decision waits) and applies the effects as the API server would,
//! resourceVersion guards included. Every write may fail: refused (409,
//! 500, 403), or unanswered, done on the server or not; a failure ends the
//! pass, as the executor's error does. Now and then the process restarts
//! and loses its memory (eviction attempts, the lease's renewal time).
//!
//! Each pod has a DrainRule behaviour and tier of the world's own table
//! (`world_rules.rs`; rules that overlap the table's and must lose to them
//! now and then beside), and WaitCompleted pods finish by themselves now
//! and then. Some pods carry Karpenter's `karpenter.sh/do-not-disrupt`
//! (`"true"`, or a duration that runs out a few steps in), which a person
//! takes off now and then. Half the pods mount a volume: attached while the pod runs, and
//! detached a few steps after it is gone (now and then many steps); a read
//! of the node's attachments fails now and then.
//!
//! Invariants, checked on the world's own reading and never from the
//! product's status: the node is not uncordoned while a NodeMaintenance on
//! it is live (not deleting, not Failed), begun or about to; a cordon a person
//! set before any maintenance is never lifted; no pod is evicted or deleted
//! unless a live NodeMaintenance drains the node, nor one the table says
//! stays (Skip, WaitCompleted), nor one whose do-not-disrupt holds or one of a later tier while a pod of an
//! earlier one is still there, nor again by a feature's drain one whose
//! PDB refused and no other node can run (`decide::elsewhere`); a feature's NodeMaintenance never says
//! Succeeded (its owner's reboot next) while a volume no running pod on
//! the node uses is still attached; a pass ends in a wait
//! within a bounded number of steps (no busy loop); and once every
//! NodeMaintenance is deleted and the faults stop, within a few passes
//! every one is gone (finalizer dropped), the node is back as the person
//! left it (schedulable, no taint, label or annotation of ours) and the
//! lease is not ours.
//!
//! A failing world prints its seed; `NODEKEEPER_WORLD_SEED=N` replays it.

use std::collections::BTreeMap;

use super::world_rules::WorldRules;
use super::*;
use crate::decide::NodeMemory;
use crate::decide::drain::Removal;
use crate::decide::reboot::tests::world_tools::{Rng, all_worlds, merge, replaying, world_seeds};
use k8s_openapi::jiff::SignedDuration;

const WORLDS: u64 = 3000;
const STEPS: usize = 30;
/// Steps one pass may take before it counts as a busy loop (the service
/// stops at 20 and looks again in 5 s).
const MAX_STEPS: usize = 20;
/// Passes after everything is deleted for the world to be given back.
const SETTLE_PASSES: usize = 8;

/// How a write failed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Refused,
    Lost,
    AppliedLost,
}

/// A pod of the node and how it leaves.
#[derive(Debug, Clone)]
struct WorldPod {
    pod: Arc<Pod>,
    /// Its PodDisruptionBudget refuses evictions until it relents.
    blocked: bool,
    /// Steps left in Terminating once removal was accepted.
    terminating: Option<u32>,
    /// No other node can run it (`decide::elsewhere`).
    nowhere: bool,
    /// An eviction of it was refused (its PDB), and the drainer was told.
    refused: bool,
}

struct MaintenanceWorld {
    rng: Rng,
    now: Timestamp,
    rv: u64,
    /// `None`: deleted (its pods and the NodeMaintenances it owns go with
    /// it); the kubelet registers it again a few steps later.
    node: Option<Node>,
    /// Steps until a deleted node registers again.
    node_back_in: u32,
    nodes_made: u32,
    /// A person cordoned the node before any maintenance began.
    admin_cordoned: bool,
    nms: Vec<NodeMaintenance>,
    pods: Vec<WorldPod>,
    /// The pods' DrainRules and the world's table of them.
    rules: WorldRules,
    /// Volumes attached to the node: the claim (`ns/name`), and once its
    /// pod is gone, steps until the driver has detached it.
    attached: Vec<(String, Option<u32>)>,
    /// The medik8s lease: holder and until when.
    lease: Option<(String, Timestamp)>,
    memory: NodeMemory,
    faults_on: bool,
    /// Faults injected and pods removed, for the test's line.
    tally: BTreeMap<&'static str, usize>,
    created: usize,
    trace: Vec<String>,
}

impl MaintenanceWorld {
    fn new(seed: u64) -> MaintenanceWorld {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut n = node();
        n.metadata.uid = Some("uid-n1".into());
        n.metadata.resource_version = Some("1".into());
        let admin_cordoned = rng.chance(20);
        if admin_cordoned {
            n.spec = Some(NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            });
        }
        let mut arcs: Vec<Arc<Pod>> = (0..rng.below(5))
            .map(|i| pod(&format!("p{i}"), "ReplicaSet"))
            .collect();
        let rules = WorldRules::random(&mut rng, &mut arcs);
        for p in arcs.iter_mut() {
            if rng.chance(20) {
                let value = if rng.chance(50) { "true" } else { "45s" };
                let mut pod = (**p).clone();
                pod.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(crate::api::pod::DO_NOT_DISRUPT.into(), value.into());
                pod.status.get_or_insert_default().start_time = Some(Time(ts(0)));
                *p = Arc::new(pod);
            }
        }
        let mut attached = Vec::new();
        for (i, p) in arcs.iter_mut().enumerate() {
            if rng.chance(50) {
                let mut pod = (**p).clone();
                pod.spec.get_or_insert_default().claims = vec![format!("c{i}")];
                attached.push((format!("ns/c{i}"), None));
                *p = Arc::new(pod);
            }
        }
        let pods = arcs
            .into_iter()
            .map(|pod| WorldPod {
                pod,
                blocked: rng.chance(25),
                terminating: None,
                nowhere: rng.chance(15),
                refused: false,
            })
            .collect();
        let lease = rng
            .chance(10)
            .then(|| ("another-operator".to_string(), ts(120)));
        MaintenanceWorld {
            rng,
            now: ts(10),
            rv: 10,
            node: Some(n),
            node_back_in: 0,
            nodes_made: 1,
            admin_cordoned,
            nms: Vec::new(),
            pods,
            rules,
            attached,
            lease,
            memory: NodeMemory::default(),
            faults_on: true,
            tally: BTreeMap::new(),
            created: 0,
            trace: Vec::new(),
        }
    }

    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn cordoned(&self) -> bool {
        self.node
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            == Some(true)
    }

    /// A NodeMaintenance that holds the node: begun, not deleting, not
    /// Failed.
    fn live(&self) -> Option<&NodeMaintenance> {
        self.nms.iter().find(|m| {
            !m.is_deleting() && matches!(m.phase(), Some(Phase::Running | Phase::Succeeded))
        })
    }

    fn fault(&mut self, e: &Effect) -> Option<Fault> {
        if !self.faults_on || matches!(e, Effect::Event { .. }) {
            return None;
        }
        let roll = self.rng.below(100);
        let (f, kind) = match roll {
            0..3 => (Fault::Refused, "409/500/403"),
            3..5 => (Fault::Lost, "timeout"),
            5..7 => (Fault::AppliedLost, "applied, then timeout"),
            _ => return None,
        };
        *self.tally.entry(kind).or_default() += 1;
        Some(f)
    }

    /// Where NodeMaintenance `nm` is, if it exists and is at
    /// `resource_version` (when one is given): else the 404 or 409.
    fn guarded(
        &self,
        nm: &str,
        resource_version: &Option<String>,
        what: &str,
    ) -> Result<usize, String> {
        let i = self
            .nms
            .iter()
            .position(|m| m.name_any() == nm)
            .ok_or_else(|| format!("NodeMaintenance {nm} not found (404)"))?;
        if resource_version.is_some() && *resource_version != self.nms[i].metadata.resource_version
        {
            return Err(format!("{what} on a stale {nm} refused (409)"));
        }
        Ok(i)
    }

    /// The API server's (and kubelet's) side of one effect.
    fn apply(&mut self, e: &Effect) -> Result<Outcome, String> {
        match e {
            Effect::PatchNode {
                resource_version,
                patch,
                ..
            } => {
                let Some(node) = self.node.clone() else {
                    return Err("node not found (404)".into());
                };
                if resource_version.is_some() && *resource_version != node.metadata.resource_version
                {
                    return Err("node patch on a stale node refused (409)".into());
                }
                let was = self.cordoned();
                let mut v = serde_json::to_value(&node).map_err(|e| e.to_string())?;
                merge(&mut v, patch);
                let after: Node = serde_json::from_value(v).map_err(|e| e.to_string())?;
                let now_cordoned = after.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                if was && !now_cordoned {
                    // Not while one holds it, nor while one is about to
                    // (a successor: pods would land only to be evicted).
                    let waiting = self
                        .nms
                        .iter()
                        .find(|m| !m.is_deleting() && m.phase() != Some(Phase::Failed));
                    assert!(
                        waiting.is_none(),
                        "uncordoned while NodeMaintenance {} holds the node or is about to",
                        waiting.map(|m| m.name_any()).unwrap_or_default()
                    );
                    assert!(
                        !self.admin_cordoned,
                        "lifted the cordon a person set before any maintenance"
                    );
                }
                let mut after = after;
                after.metadata.resource_version = Some(self.bump());
                self.node = Some(after.clone());
                Ok(Outcome::NodeWritten(Box::new(after)))
            }
            Effect::PatchNodeStatus { patch, .. } => {
                let rv = self.bump();
                let Some(node) = self.node.as_mut() else {
                    return Err("node not found (404)".into());
                };
                apply_conditions(node, patch);
                node.metadata.resource_version = Some(rv);
                Ok(Outcome::Done)
            }
            Effect::WriteStatus {
                nm,
                resource_version,
                status,
                ..
            } => {
                let rv = self.bump();
                let i = self.guarded(nm, resource_version, "status write")?;
                self.check_volumes(&self.nms[i], status);
                let m = &mut self.nms[i];
                m.status = Some((**status).clone());
                m.metadata.resource_version = Some(rv);
                Ok(Outcome::MaintenanceWritten(Box::new(m.clone())))
            }
            Effect::SetFinalizers {
                nm,
                resource_version,
                finalizers,
                owners,
            } => {
                let rv = self.bump();
                let i = self.guarded(nm, resource_version, "finalizer write")?;
                let m = &mut self.nms[i];
                if m.is_deleting() && !finalizers.is_empty() && m.finalizers().is_empty() {
                    return Err(format!("{nm} is being deleted: no new finalizer (422)"));
                }
                m.metadata.finalizers = Some(finalizers.clone());
                if let Some(o) = owners {
                    m.metadata.owner_references = Some(o.clone());
                }
                m.metadata.resource_version = Some(rv.clone());
                if m.is_deleting() && finalizers.is_empty() {
                    self.nms.remove(i);
                    self.trace.push(format!("{nm} gone"));
                    return Ok(Outcome::MaintenanceGone {
                        name: nm.clone(),
                        resource_version: Some(rv),
                    });
                }
                Ok(Outcome::MaintenanceWritten(Box::new(m.clone())))
            }
            Effect::TakeLease { .. } => {
                let ours = crate::api::nodemaintenance::LEASE_HOLDER;
                match &self.lease {
                    Some((holder, until)) if holder != ours && *until > self.now => {
                        Ok(Outcome::LeaseHeldBy(holder.clone()))
                    }
                    _ => {
                        let until = self
                            .now
                            .checked_add(SignedDuration::from_secs(i64::from(LEASE_SECONDS)))
                            .unwrap_or(self.now);
                        self.lease = Some((ours.to_string(), until));
                        Ok(Outcome::LeaseHeld { until })
                    }
                }
            }
            Effect::ReleaseLease { .. } => {
                if self
                    .lease
                    .as_ref()
                    .is_some_and(|(h, _)| h == crate::api::nodemaintenance::LEASE_HOLDER)
                {
                    self.lease = None;
                }
                Ok(Outcome::Done)
            }
            Effect::Drain { pods, .. } => {
                let feature = self.live().and_then(owner_of).map(str::to_string);
                // A feature's drain waits for no pod that stays for the
                // shutdown, whatever its tier.
                let stays = |w: &WorldPod| {
                    w.nowhere
                        && w.refused
                        && crate::decide::elsewhere::applies_to(feature.as_deref())
                        && crate::decide::do_not_disrupt::pod_hold(&w.pod, self.now).is_none()
                };
                let present: Vec<Arc<Pod>> = self
                    .pods
                    .iter()
                    .filter(|w| !stays(w))
                    .map(|w| w.pod.clone())
                    .collect();
                self.rules.check(pods, &present);
                assert!(
                    self.live().is_some(),
                    "pods removed while no NodeMaintenance holds the node: {:?}",
                    pods.iter().map(|(p, _)| p.name_any()).collect::<Vec<_>>()
                );
                let mut removals = Vec::new();
                for (p, fate) in pods {
                    let uid = p.metadata.uid.clone();
                    let Some(wp) = self.pods.iter_mut().find(|w| w.pod.metadata.uid == uid) else {
                        removals.push(Removal::Gone);
                        continue;
                    };
                    assert!(
                        crate::decide::do_not_disrupt::pod_hold(&wp.pod, self.now).is_none(),
                        "{} removed ({fate:?}) while its do-not-disrupt holds",
                        wp.pod.name_any()
                    );
                    assert!(
                        !(wp.nowhere
                            && wp.refused
                            && crate::decide::elsewhere::applies_to(feature.as_deref())),
                        "{} evicted again ({fate:?}) by a reboot's drain though its PDB refused and no other node can run it",
                        wp.pod.name_any()
                    );
                    let refused = matches!(fate, Fate::Evict) && wp.blocked;
                    *self
                        .tally
                        .entry(if refused {
                            "evictions refused"
                        } else {
                            "pods removed"
                        })
                        .or_default() += 1;
                    if refused {
                        removals.push(Removal::Refused(
                            "Cannot evict pod as it would violate the pod's disruption budget (429)"
                                .into(),
                        ));
                    } else {
                        if wp.terminating.is_none() {
                            let mut pod = (*wp.pod).clone();
                            pod.metadata.deletion_timestamp = Some(Time(self.now));
                            wp.pod = Arc::new(pod);
                            wp.terminating = Some(self.rng.below(3) as u32);
                        }
                        removals.push(Removal::Accepted);
                    }
                }
                Ok(Outcome::Drained(removals))
            }
            Effect::Event { .. } => Ok(Outcome::Done),
            other => panic!("unexpected effect {other:?}"),
        }
    }

    /// A feature's maintenance says Succeeded only with every volume of
    /// an evicted (or finished) pod detached.
    fn check_volumes(&self, m: &NodeMaintenance, status: &NodeMaintenanceStatus) {
        if status.phase != Some(Phase::Succeeded)
            || m.phase() == Some(Phase::Succeeded)
            || !crate::decide::volumes::waits_for_volumes(owner_of(m))
        {
            return;
        }
        let running: Vec<String> = self
            .pods
            .iter()
            .filter(|w| {
                !matches!(
                    w.pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .flat_map(|w| w.pod.spec.iter().flat_map(|s| s.claims.clone()))
            .map(|c| format!("ns/{c}"))
            .collect();
        let left: Vec<&String> = self
            .attached
            .iter()
            .map(|(c, _)| c)
            .filter(|c| !running.contains(c))
            .collect();
        assert!(
            left.is_empty(),
            "{} says Succeeded with volumes of pods gone still attached: {left:?}",
            m.name_any()
        );
    }

    /// The node's attachments as a read of them answers.
    /// The pods whose eviction was refused, as far as the drainer was told
    /// (a refusal whose answer was lost is not known to it).
    fn note_refusals(&mut self, e: &Effect, o: &Outcome) {
        if let (Effect::Drain { pods, .. }, Outcome::Drained(removals)) = (e, o) {
            for ((p, _), r) in pods.iter().zip(removals) {
                if let Removal::Refused(_) = r
                    && let Some(w) = self
                        .pods
                        .iter_mut()
                        .find(|w| w.pod.metadata.uid == p.metadata.uid)
                {
                    w.refused = true;
                }
            }
        }
    }

    /// Which of the asked pods no other node can run.
    fn read_homes(&self, uids: &[String]) -> crate::decide::elsewhere::Homes {
        let nowhere = |uid: &String| {
            self.pods
                .iter()
                .any(|w| w.nowhere && w.pod.metadata.uid.as_ref() == Some(uid))
        };
        crate::decide::elsewhere::Homes {
            asked: uids.iter().cloned().collect(),
            homeless: uids.iter().filter(|u| nowhere(u)).cloned().collect(),
        }
    }

    fn read_volumes(&mut self) -> crate::decide::volumes::Volumes {
        use crate::decide::volumes::{Attached, Volumes};
        if self.faults_on && self.rng.chance(5) {
            *self.tally.entry("volume reads failed").or_default() += 1;
            return Volumes::Failed("listing VolumeAttachments: timed out".into());
        }
        Volumes::Read(
            self.attached
                .iter()
                .map(|(c, _)| Attached {
                    attachment: format!("va-{c}"),
                    volume: format!("pv-{c}"),
                    claim: Some(c.clone()),
                    unique: None,
                })
                .collect(),
        )
    }

    /// One pass of the node's reconcile, as `service::reconcile` runs it.
    fn pass(&mut self) {
        let mut volumes = None;
        let mut homes = None;
        for _ in 0..MAX_STEPS {
            let pods: Vec<Arc<Pod>> = self.pods.iter().map(|w| w.pod.clone()).collect();
            let nms = self.nms.clone();
            let node = self.node.clone();
            let memory = self.memory.clone();
            let book = self.rules.book.clone();
            let snapshot = Snapshot {
                node_name: NODE,
                node: node.as_ref(),
                maintenances: nms.iter().collect(),
                pods: &pods,
                drain_rules: &book,
                attempts: &memory.attempts,
                lease_renew_at: memory.lease_renew_at,
                now: self.now,
                drain_timeout: Duration::from_secs(60),
                volumes: volumes.as_ref(),
                homes: homes.as_ref(),
                conditions_paused: memory
                    .conditions_refused_until
                    .is_some_and(|t| t > self.now),
            };
            let step = decide(&snapshot);
            if matches!(step, Step::ReadVolumes { .. }) && volumes.is_none() {
                volumes = Some(self.read_volumes());
                continue;
            }
            if let Step::ReadHomes { pods: uids, .. } = &step {
                // Added to what is known, as the service's cache does: the
                // next tier's pods are asked about once the first's are
                // known to stay.
                let mut known: crate::decide::elsewhere::Homes = homes.take().unwrap_or_default();
                let read = self.read_homes(uids);
                known.asked.extend(read.asked);
                known.homeless.extend(read.homeless);
                homes = Some(known);
                continue;
            }
            self.trace
                .push(format!("step {step:?}").chars().take(160).collect());
            let mut plan = plan(&snapshot, step.clone());
            let mut follow_up = true;
            loop {
                let mut failed = false;
                let mut instead = None;
                for e in &plan.effects {
                    let fault = self.fault(e);
                    let outcome = match fault {
                        Some(Fault::Refused | Fault::Lost) => Err(format!("{fault:?}")),
                        _ => self.apply(e),
                    };
                    match (outcome, fault) {
                        (Ok(o), None) => {
                            self.memory.record(e, &o, self.now);
                            self.note_refusals(e, &o);
                            if follow_up && instead.is_none() {
                                instead = after(&snapshot, &step, &o);
                            }
                        }
                        (Ok(_), Some(_)) | (Err(_), _) => {
                            // A timeout may have happened on the server:
                            // the executor tells the memory so.
                            if matches!(fault, Some(Fault::Lost | Fault::AppliedLost)) {
                                self.memory.unanswered(e, self.now);
                            }
                            self.trace.push(format!(
                                "{} failed ({fault:?})",
                                crate::effects::describe(e)
                            ));
                            failed = true;
                            if !plan.together {
                                break;
                            }
                        }
                    }
                }
                if failed {
                    return;
                }
                match instead {
                    Some(p) => {
                        plan = p;
                        follow_up = false;
                    }
                    None => break,
                }
            }
            if let Then::Wait(_) = plan.then {
                return;
            }
        }
        panic!(
            "a pass took {MAX_STEPS} steps without waiting: {:?}",
            self.trace.iter().rev().take(6).collect::<Vec<_>>()
        );
    }

    /// What people and the rest of the cluster do in a step.
    fn settle(&mut self, people: bool) {
        // Terminating pods go; a PodDisruptionBudget relents now and then.
        for w in &mut self.pods {
            if let Some(left) = w.terminating.as_mut() {
                *left = left.saturating_sub(1);
            }
            if w.blocked && self.rng.chance(15) {
                w.blocked = false;
            }
        }
        // A pod's volume detaches a few steps after it is gone (or after
        // it finished), now and then many.
        for w in &self.pods {
            let done = matches!(
                w.pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            if w.terminating == Some(0) || done {
                for c in w.pod.spec.iter().flat_map(|s| s.claims.iter()) {
                    let key = format!("ns/{c}");
                    let steps = if self.rng.chance(10) {
                        12
                    } else {
                        self.rng.below(4) as u32
                    };
                    if let Some(v) = self
                        .attached
                        .iter_mut()
                        .find(|(k, t)| *k == key && t.is_none())
                    {
                        v.1 = Some(steps);
                    }
                }
            }
        }
        for (_, left) in &mut self.attached {
            if let Some(l) = left.as_mut() {
                *l = l.saturating_sub(1);
            }
        }
        let before = self.attached.len();
        self.attached.retain(|(_, left)| *left != Some(0));
        *self.tally.entry("volumes detached").or_default() += before - self.attached.len();
        self.pods.retain(|w| w.terminating != Some(0));
        self.rules
            .finish_some(&mut self.rng, self.pods.iter_mut().map(|w| &mut w.pod));
        if people {
            if self.nms.len() < 3 && self.rng.chance(25) {
                self.created += 1;
                let mut m = nm(&format!("m{}", self.created), 0, None);
                m.metadata.creation_timestamp = Some(Time(self.now));
                m.metadata.uid = Some(format!("uid-m{}", self.created));
                // A feature's, now and then: a person's preempts it.
                if self.rng.chance(40) {
                    m.metadata.labels =
                        Some([(OWNER_LABEL.to_string(), "RebootPolicy".to_string())].into());
                }
                m.metadata.resource_version = Some(self.bump());
                self.trace.push(format!("{} created", m.name_any()));
                self.nms.push(m);
            }
            if !self.nms.is_empty() && self.rng.chance(15) {
                let i = self.rng.below(self.nms.len() as u64) as usize;
                self.delete(i);
            }
            // A person takes a pod's do-not-disrupt off.
            if !self.pods.is_empty() && self.rng.chance(10) {
                let i = self.rng.below(self.pods.len() as u64) as usize;
                let mut pod = (*self.pods[i].pod).clone();
                if let Some(a) = pod.metadata.annotations.as_mut()
                    && a.remove(crate::api::pod::DO_NOT_DISRUPT).is_some()
                {
                    self.trace
                        .push(format!("{}: do-not-disrupt taken off", pod.name_any()));
                    *self.tally.entry("do-not-disrupt taken off").or_default() += 1;
                    self.pods[i].pod = Arc::new(pod);
                }
            }
            self.node_comes_and_goes();
        }
        // Another operator's lease expires in time.
        if self.lease.as_ref().is_some_and(|(h, until)| {
            h != crate::api::nodemaintenance::LEASE_HOLDER && *until <= self.now
        }) {
            self.lease = None;
        }
        // The process restarts now and then: its memory is gone.
        if self.faults_on && self.rng.chance(3) {
            self.trace.push("restart".into());
            self.memory = NodeMemory::default();
            for w in &mut self.pods {
                w.refused = false;
            }
            // Leases it holds are found at start (`service::run`).
            if self
                .lease
                .as_ref()
                .is_some_and(|(h, _)| h == crate::api::nodemaintenance::LEASE_HOLDER)
            {
                self.memory.lease_renew_at = Some(self.now);
            }
        }
        self.now = self
            .now
            .checked_add(SignedDuration::from_secs(1 + self.rng.below(20) as i64))
            .unwrap_or(self.now);
    }

    /// The node is deleted now and then (decommissioned, or a cloud
    /// instance gone): its pods go, and the garbage collector deletes the
    /// NodeMaintenances it owns (the finalizer owner reference). The kubelet
    /// registers it again a few steps later: a new object, schedulable.
    fn node_comes_and_goes(&mut self) {
        match self.node.as_ref() {
            Some(n) if self.rng.chance(3) => {
                let uid = n.metadata.uid.clone().unwrap_or_default();
                self.trace.push("node deleted".into());
                *self.tally.entry("nodes deleted").or_default() += 1;
                self.node = None;
                self.node_back_in = 1 + self.rng.below(4) as u32;
                self.pods.clear();
                self.attached.clear();
                let owned: Vec<usize> = (0..self.nms.len())
                    .filter(|&i| self.nms[i].owner_references().iter().any(|o| o.uid == uid))
                    .collect();
                for i in owned.into_iter().rev() {
                    self.delete(i);
                }
            }
            Some(_) => {}
            None => {
                self.node_back_in = self.node_back_in.saturating_sub(1);
                if self.node_back_in == 0 {
                    self.nodes_made += 1;
                    let mut n = node();
                    n.metadata.uid = Some(format!("uid-n1-{}", self.nodes_made));
                    n.metadata.resource_version = Some(self.bump());
                    self.node = Some(n);
                    self.admin_cordoned = false;
                    self.trace.push("node registered again".into());
                }
            }
        }
    }

    /// `kubectl delete`: with a finalizer it is marked, else it goes.
    fn delete(&mut self, i: usize) {
        let rv = self.bump();
        let m = &mut self.nms[i];
        self.trace.push(format!("{} deleted", m.name_any()));
        if m.finalizers().is_empty() {
            self.nms.remove(i);
        } else if m.metadata.deletion_timestamp.is_none() {
            m.metadata.deletion_timestamp = Some(Time(self.now));
            m.metadata.resource_version = Some(rv);
        }
    }
}

#[test]
fn random_maintenance_worlds_never_uncordon_a_held_node_and_give_every_node_back() {
    let seeds = world_seeds(WORLDS);
    let mut totals: BTreeMap<&'static str, usize> = BTreeMap::new();
    for seed in seeds {
        let mut w = MaintenanceWorld::new(seed);
        replaying(
            seed,
            &mut w,
            |w| &w.trace,
            24,
            |w| {
                for _ in 0..STEPS {
                    w.pass();
                    if w.live().is_some() {
                        *totals.entry("steps held").or_default() += 1;
                    }
                    w.settle(true);
                }
                // Faults stop; every NodeMaintenance is deleted.
                w.faults_on = false;
                for i in (0..w.nms.len()).rev() {
                    w.delete(i);
                }
                for _ in 0..SETTLE_PASSES {
                    w.pass();
                    w.settle(false);
                }
                assert!(
                    w.nms.is_empty(),
                    "left after every NodeMaintenance was deleted: {:?}",
                    w.nms
                        .iter()
                        .map(|m| (m.name_any(), m.finalizers().to_vec()))
                        .collect::<Vec<_>>()
                );
                assert!(
                    w.lease
                        .as_ref()
                        .is_none_or(|(h, _)| h != crate::api::nodemaintenance::LEASE_HOLDER),
                    "the lease is still ours"
                );
                // A node deleted at the end stays away: nothing of it to check.
                let Some(node) = w.node.clone() else {
                    return;
                };
                assert_eq!(
                    w.cordoned(),
                    w.admin_cordoned,
                    "the node's cordon is not as its person left it"
                );
                let spec = node.spec.clone().unwrap_or_default();
                // The unschedulable taint goes with the cordon (the node
                // lifecycle controller keeps it on a cordoned node).
                let ours = |t: &&Taint| {
                    t.key == DRAIN_TAINT || (t.key == UNSCHEDULABLE_TAINT && !w.admin_cordoned)
                };
                assert!(
                    spec.taints.iter().flatten().filter(ours).count() == 0,
                    "a taint of ours left: {:?}",
                    spec.taints
                );
                let ann = node.annotations();
                assert!(
                    !ann.contains_key(APPLIED_ANNOTATION) && !ann.contains_key(CORDONED_ANNOTATION),
                    "an annotation of ours left: {ann:?}"
                );
                assert!(
                    !node.labels().contains_key(EXCLUDE_REMEDIATION_LABEL),
                    "the remediation label left"
                );
            },
        );
        *totals.entry("NodeMaintenances").or_default() += w.created;
        for (k, n) in &w.tally {
            *totals.entry(k).or_default() += n;
        }
    }
    println!("{WORLDS} maintenance worlds of {STEPS} steps: {totals:?}");
    if all_worlds() {
        for what in ["steps held", "pods removed"] {
            assert!(
                totals.get(what).copied().unwrap_or(0) > WORLDS as usize,
                "too few {what} in all worlds: {totals:?}"
            );
        }
    }
}
