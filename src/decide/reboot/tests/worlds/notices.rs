//! Notifications in the random worlds. The notifier reads every policy's
//! and plan's entries as the service does (`service/notifier.rs`): the
//! copy a pass reads (stale now and then) before it decides, the status
//! the pass wrote once the write went through, and the `through` record
//! the next status write carries. Now and then the cluster role's process
//! dies (a hand-over): a new notifier starts with nothing but the records
//! the statuses carry.
//!
//! Invariants, from the world's own count of what was told and what the
//! API server stored:
//! - told at most once: an event (object, node, event, since) is never
//!   told twice — except once more for each time a process died between
//!   telling it and a status write carrying its record (at least once,
//!   not exactly once, across such crashes);
//! - nothing stored is lost: every event an object's status held is told
//!   by the end, unless it was history when a new notifier first looked
//!   (at or before the stored record), the second `NodeReturned` of one
//!   return (Settling, then Done), or its object is gone.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::common::NotificationStatus;
use crate::decide::notify::{self, Entry, Event, Tracker};

use super::*;

/// One event as the notifier tells it: object uid, node, event, since.
type Told = (String, String, &'static str, Timestamp);

fn key(uid: &str, e: &Entry) -> Option<Told> {
    let event = e.event?;
    Some((uid.to_string(), e.node.clone(), event.as_str(), e.since))
}

/// The notifier's process memory (lost at a hand-over).
#[derive(Default)]
struct Process {
    tracker: Tracker,
    /// Per object: the record its next status write carries.
    records: BTreeMap<String, NotificationStatus>,
}

#[derive(Default)]
pub(super) struct Notices {
    process: Process,
    /// How often each event was told.
    told: BTreeMap<Told, usize>,
    /// Told before a hand-over and not covered by a stored record then:
    /// may be told once more for each such hand-over.
    again: BTreeMap<Told, usize>,
    /// Every event a stored status held, in the order stored.
    stored: Vec<Told>,
    /// Marked handled when a new notifier first looked (history).
    history: BTreeSet<Told>,
    /// Hand-overs.
    pub(super) handovers: usize,
}

impl Notices {
    /// The notifier reads `entries` of object `uid` whose stored record
    /// is `record` (as `Notifier::observe`, delivery instant).
    fn observe(&mut self, uid: &str, record: Option<&NotificationStatus>, entries: &[Entry]) {
        let through = record.and_then(|r| r.through.as_ref()).map(|t| t.0);
        let first = !self.process.records.contains_key(uid);
        let new = self.process.tracker.new_events(uid, record, entries);
        // History, by the record's own rule (not by what the tracker
        // said): what a new notifier finds at or before the stored
        // record, or everything when there is no record yet.
        if first {
            self.history.extend(
                entries
                    .iter()
                    .filter_map(|e| key(uid, e))
                    .filter(|k| record.is_none() || through.is_some_and(|t| k.3 <= t)),
            );
        }
        let rec = self
            .process
            .records
            .entry(uid.to_string())
            .or_insert_with(|| record.cloned().unwrap_or_default());
        let newest = entries
            .iter()
            .filter(|e| e.event.is_some())
            .map(|e| e.since)
            .max();
        let old = rec.through.as_ref().map(|t| t.0);
        if let Some(n) = newest.max(old) {
            rec.through = Some(Time(Timestamp::from_second(n.as_second()).unwrap_or(n)));
        }
        for e in &new {
            let Some(k) = key(uid, e) else { continue };
            let n = self.told.entry(k.clone()).or_default();
            *n += 1;
            let allowed = 1 + self.again.get(&k).copied().unwrap_or_default();
            assert!(
                *n <= allowed,
                "notified {n} times: {k:?} (told once more only for each hand-over before its record was stored)"
            );
        }
    }

    /// Events told, repeats included.
    pub(super) fn told(&self) -> usize {
        self.told.values().sum()
    }

    /// The record the pass's status write carries.
    fn record(&self, uid: &str) -> Option<NotificationStatus> {
        self.process.records.get(uid).cloned()
    }

    /// The process dies; what it told and no stored record covers may be
    /// told again by the next.
    fn hand_over(&mut self, stored: &BTreeMap<String, Option<Timestamp>>) {
        for k in self.told.keys() {
            let covered = stored
                .get(&k.0)
                .copied()
                .flatten()
                .is_some_and(|t| k.3 <= t);
            if !covered {
                *self.again.entry(k.clone()).or_default() += 1;
            }
        }
        self.process = Process::default();
        self.handovers += 1;
    }
}

fn policy_entries(p: &RebootPolicy) -> Vec<Entry> {
    p.status
        .iter()
        .flat_map(|s| s.nodes.iter().map(notify::reboot_entry))
        .collect()
}

fn plan_entries(p: &UpgradePlan) -> Vec<Entry> {
    p.status
        .iter()
        .flat_map(|s| s.nodes.iter().map(notify::upgrade_entry))
        .collect()
}

fn uid_of<K: kube::Resource>(o: &K) -> String {
    o.meta().uid.clone().unwrap_or_else(|| o.name_any())
}

impl World {
    /// A policy's pass reads `p`: the notifier looks, and the record the
    /// pass's status write carries.
    pub(super) fn notice_policy(&mut self, p: &RebootPolicy) -> Option<NotificationStatus> {
        let uid = uid_of(p);
        let record = p.status.as_ref().and_then(|s| s.notifications.as_ref());
        self.notices.observe(&uid, record, &policy_entries(p));
        self.notices.record(&uid)
    }

    /// A plan's pass reads `p`, as [`World::notice_policy`].
    pub(super) fn notice_plan(&mut self, p: &UpgradePlan) -> Option<NotificationStatus> {
        let uid = uid_of(p);
        let record = p.status.as_ref().and_then(|s| s.notifications.as_ref());
        self.notices.observe(&uid, record, &plan_entries(p));
        self.notices.record(&uid)
    }

    /// A status write reached the API server: what it stored is owed a
    /// notification; if its answer came back, the notifier reads what it
    /// wrote.
    pub(super) fn notice_written(&mut self, e: &Effect, answered: bool) {
        let (uid, entries, record) = match e {
            Effect::WritePolicyStatus { policy, .. } => {
                let Some(p) = self.policies.iter().find(|p| p.name_any() == *policy) else {
                    return;
                };
                let rec = p.status.as_ref().and_then(|s| s.notifications.clone());
                (uid_of(p), policy_entries(p), rec)
            }
            Effect::WriteUpgradeStatus { plan, .. } => {
                let Some(p) = self.plans.iter().find(|p| p.name_any() == *plan) else {
                    return;
                };
                let rec = p.status.as_ref().and_then(|s| s.notifications.clone());
                (uid_of(p), plan_entries(p), rec)
            }
            _ => return,
        };
        for k in entries.iter().filter_map(|x| key(&uid, x)) {
            if !self.notices.stored.contains(&k) {
                self.notices.stored.push(k);
            }
        }
        if answered {
            self.notices.observe(&uid, record.as_ref(), &entries);
        }
    }

    /// Now and then the cluster role's process dies; objects gone are
    /// forgotten (as `Notifier::retain`).
    pub(super) fn notifier_step(&mut self) {
        let stored: BTreeMap<String, Option<Timestamp>> = self
            .policies
            .iter()
            .map(|p| {
                (
                    uid_of(p),
                    p.status.as_ref().and_then(|s| s.notifications.as_ref()),
                )
            })
            .chain(self.plans.iter().map(|p| {
                (
                    uid_of(p),
                    p.status.as_ref().and_then(|s| s.notifications.as_ref()),
                )
            }))
            .map(|(uid, r)| (uid, r.and_then(|r| r.through.as_ref()).map(|t| t.0)))
            .collect();
        let live: Vec<String> = stored.keys().cloned().collect();
        self.notices.process.tracker.retain(&live);
        self.notices
            .process
            .records
            .retain(|uid, _| live.contains(uid));
        if self.rng.chance(4) {
            self.trace
                .push("the cluster role's process dies (hand-over)".into());
            self.notices.hand_over(&stored);
        }
    }

    /// Every event a live object's status held was told, or was history,
    /// or is the second `NodeReturned` of one return.
    pub(super) fn assert_nothing_lost(&mut self) {
        for p in self.policies.clone() {
            self.notice_policy(&p);
        }
        for p in self.plans.clone() {
            self.notice_plan(&p);
        }
        let live: BTreeSet<String> = self
            .policies
            .iter()
            .map(uid_of)
            .chain(self.plans.iter().map(uid_of))
            .collect();
        let n = &self.notices;
        let mut last: BTreeMap<(String, String), &'static str> = BTreeMap::new();
        for k in &n.stored {
            let before = last.insert((k.0.clone(), k.1.clone()), k.2);
            let returned = Event::NodeReturned.as_str();
            if !live.contains(&k.0) || n.history.contains(k) || n.told.contains_key(k) {
                continue;
            }
            assert!(
                k.2 == returned && before == Some(returned),
                "a stored event never told: {k:?}"
            );
        }
    }
}
