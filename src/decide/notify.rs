//! Notifications, pure: which event a node's entry in a RebootPolicy's or
//! UpgradePlan's status stands for, which of those the notifier has not
//! seen yet ([`Tracker`]), and the text and body each target gets.
//!
//! Events come from the status entries the cluster role writes, never from
//! the effects that led to them: an entry's phase and `since` say what
//! happened and when, whoever wrote it (this process or the leader before
//! it), so a hand-over neither repeats nor loses a notification (the
//! object's `status.notifications.through` says up to when every entry
//! was handled). Delivery is the service's (`service/notifier.rs`).

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::api::common::{Notification, NotificationStatus};
use crate::api::reboot::{NodeReboot, RebootPhase};
use crate::api::upgrade::{NodeUpgrade, UpgradePhase};

/// What a notification tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    DrainStarted,
    RebootIssued,
    UpgradeIssued,
    NodeReturned,
    Failed,
    NotReturned,
}

impl Event {
    pub const ALL: [Event; 6] = [
        Event::DrainStarted,
        Event::RebootIssued,
        Event::UpgradeIssued,
        Event::NodeReturned,
        Event::Failed,
        Event::NotReturned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::DrainStarted => "DrainStarted",
            Event::RebootIssued => "RebootIssued",
            Event::UpgradeIssued => "UpgradeIssued",
            Event::NodeReturned => "NodeReturned",
            Event::Failed => "Failed",
            Event::NotReturned => "NotReturned",
        }
    }

    pub fn parse(s: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == s.trim())
    }
}

/// One node's entry as the notifier reads it, from either API.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub node: String,
    pub phase: &'static str,
    pub since: Timestamp,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub version: Option<String>,
    pub event: Option<Event>,
}

/// The reboot entry's event: a drain begun, a reboot issued, a node back
/// (settling or done), failed, or past its return deadline (the entry
/// stays Rebooting/Verifying with reason `NotReturned`).
pub fn reboot_entry(e: &NodeReboot) -> Entry {
    let late = e.reason.as_deref() == Some(super::reboot::NOT_RETURNED);
    let event = match e.phase {
        RebootPhase::Draining => Some(Event::DrainStarted),
        RebootPhase::Rebooting | RebootPhase::Verifying if late => Some(Event::NotReturned),
        RebootPhase::Rebooting => Some(Event::RebootIssued),
        RebootPhase::Settling | RebootPhase::Done => Some(Event::NodeReturned),
        RebootPhase::Failed => Some(Event::Failed),
        _ => None,
    };
    Entry {
        node: e.name.clone(),
        phase: e.phase.as_str(),
        since: e.since.0,
        reason: e.reason.clone(),
        message: e.message.clone(),
        version: None,
        event,
    }
}

/// The upgrade entry's event; a node not at the version or not Ready by
/// its deadline is `NotReturned`.
pub fn upgrade_entry(e: &NodeUpgrade) -> Entry {
    let event = match e.phase {
        UpgradePhase::Draining => Some(Event::DrainStarted),
        UpgradePhase::Upgrading => Some(Event::UpgradeIssued),
        UpgradePhase::PostHooks | UpgradePhase::Settling | UpgradePhase::Done => {
            Some(Event::NodeReturned)
        }
        UpgradePhase::Failed
            if matches!(
                e.reason.as_deref(),
                Some(
                    super::upgrade::FAILED_UPGRADE_TIMEOUT | super::upgrade::FAILED_VERIFY_TIMEOUT
                )
            ) =>
        {
            Some(Event::NotReturned)
        }
        UpgradePhase::Failed => Some(Event::Failed),
        _ => None,
    };
    Entry {
        node: e.name.clone(),
        phase: e.phase.as_str(),
        since: e.since.0,
        reason: e.reason.clone(),
        message: e.message.clone(),
        version: e.version.clone(),
        event,
    }
}

/// How many (event, since) pairs are remembered per node: enough for a
/// store that lags our own writes by a few phases.
const REMEMBERED: usize = 8;

/// What the notifier has seen, per object (by UID) and node.
#[derive(Default, Debug)]
pub struct Tracker {
    objects: HashMap<String, HashMap<String, Vec<(Event, Timestamp)>>>,
}

impl Tracker {
    /// The entries whose event is new. An object seen for the first time
    /// counts entries at or before its status's record (`through`) as
    /// handled; with no record at all, every entry (its notifications were
    /// just added: its history is not news); with a record that has no
    /// `through` yet, none (nothing was told, so everything is news: the
    /// first event's status write may have gone through unanswered just
    /// before a hand-over). A node's entry older than the newest seen is a
    /// store behind our own writes; `NodeReturned` is told once however
    /// many phases say it (Settling, then Done).
    pub fn new_events(
        &mut self,
        uid: &str,
        record: Option<&NotificationStatus>,
        entries: &[Entry],
    ) -> Vec<Entry> {
        let first = !self.objects.contains_key(uid);
        let handled = |since: Timestamp| match record {
            None => true,
            Some(r) => r.through.as_ref().is_some_and(|t| since <= t.0),
        };
        let nodes = self.objects.entry(uid.to_string()).or_default();
        let mut out = Vec::new();
        for e in entries {
            let Some(event) = e.event else { continue };
            let seen = nodes.entry(e.node.clone()).or_default();
            let old = first && handled(e.since);
            let newest = seen.iter().map(|(_, t)| *t).max();
            let stale = newest.is_some_and(|t| e.since < t);
            let known = seen.contains(&(event, e.since));
            let repeat = event == Event::NodeReturned
                && seen.iter().max_by_key(|(_, t)| *t).map(|(ev, _)| *ev)
                    == Some(Event::NodeReturned);
            if !known && !stale {
                seen.push((event, e.since));
                if seen.len() > REMEMBERED {
                    seen.remove(0);
                }
                if !old && !repeat {
                    out.push(e.clone());
                }
            }
        }
        out
    }

    /// Forget objects that are gone (or no longer notify).
    pub fn retain(&mut self, live: &[String]) {
        self.objects.retain(|uid, _| live.contains(uid));
    }
}

/// Everything a message may say.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub event: Event,
    /// `RebootPolicy` or `UpgradePlan`.
    pub kind: &'static str,
    pub name: String,
    pub entry: Entry,
}

impl Message {
    /// The default sentence.
    pub fn sentence(&self) -> String {
        let (node, obj) = (&self.entry.node, format!("{} {}", self.kind, self.name));
        let why = self.entry.message.as_deref().unwrap_or("no message");
        match self.event {
            Event::DrainStarted => format!("draining node {node} ({obj})"),
            Event::RebootIssued => format!("rebooting node {node} ({obj})"),
            Event::UpgradeIssued => match &self.entry.version {
                Some(v) => format!("upgrading node {node} to {v} ({obj})"),
                None => format!("upgrading node {node} ({obj})"),
            },
            Event::NodeReturned => format!("node {node} is back ({obj})"),
            Event::Failed => format!("node {node} failed: {why} ({obj})"),
            Event::NotReturned => format!("node {node} did not come back: {why} ({obj})"),
        }
    }

    /// The template with its placeholders filled (default: the sentence).
    /// The schema refuses unknown placeholders; one that got past it (an
    /// object stored before the rule) is left as it is.
    pub fn text(&self, template: Option<&str>) -> String {
        let Some(t) = template.filter(|t| !t.is_empty()) else {
            return self.sentence();
        };
        let e = &self.entry;
        let or_empty = |v: &Option<String>| v.clone().unwrap_or_default();
        [
            ("{event}", self.event.as_str().to_string()),
            ("{node}", e.node.clone()),
            ("{kind}", self.kind.to_string()),
            ("{name}", self.name.clone()),
            ("{phase}", e.phase.to_string()),
            ("{reason}", or_empty(&e.reason)),
            ("{message}", or_empty(&e.message)),
            ("{version}", or_empty(&e.version)),
            ("{text}", self.sentence()),
        ]
        .iter()
        .fold(t.to_string(), |acc, (k, v)| acc.replace(k, v))
    }

    /// The request body for a target's format (`Webhook`, `Slack`, `Teams`).
    pub fn body(&self, format: &str, template: Option<&str>) -> Value {
        let text = self.text(template);
        match format {
            "Slack" => json!({ "text": text }),
            // A Teams workflow webhook ("when a webhook request is
            // received") posts the Adaptive Cards among the attachments.
            "Teams" => json!({
                "type": "message",
                "attachments": [{
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "content": {
                        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                        "type": "AdaptiveCard",
                        "version": "1.4",
                        "body": [{ "type": "TextBlock", "text": text, "wrap": true }],
                    },
                }],
            }),
            _ => {
                let e = &self.entry;
                json!({
                    "event": self.event.as_str(),
                    "kind": self.kind,
                    "name": self.name,
                    "node": e.node,
                    "phase": e.phase,
                    "since": e.since.to_string(),
                    "reason": e.reason,
                    "message": e.message,
                    "version": e.version,
                    "text": text,
                })
            }
        }
    }
}

/// Does this target want this event (no list: every event)?
pub fn wants(events: &[String], event: Event) -> bool {
    events.is_empty() || events.iter().any(|e| Event::parse(e) == Some(event))
}

/// A target as the notifier delivers to it: the Secret's key with the URL,
/// and, for the cluster-wide default, `None` fields read from the Secret's
/// `format`, `events` and `template` keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub secret: String,
    pub key: String,
    pub format: Option<String>,
    pub events: Option<Vec<String>>,
    pub template: Option<String>,
}

/// An object's targets: its own list, else the default Secret's.
pub fn targets(spec: Option<&Vec<Notification>>, default: Option<&str>) -> Vec<Target> {
    match spec {
        Some(list) => list
            .iter()
            .map(|n| Target {
                secret: n.url_from.name.clone(),
                key: n.url_from.key.clone(),
                format: Some(n.format.clone()),
                events: Some(n.events.clone()),
                template: n.template.clone(),
            })
            .collect(),
        None => default
            .map(|s| Target {
                secret: s.to_string(),
                key: "url".into(),
                format: None,
                events: None,
                template: None,
            })
            .into_iter()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::common::TEMPLATE_RULE;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn entry(node: &str, event: Option<Event>, since: i64) -> Entry {
        Entry {
            node: node.into(),
            phase: "Draining",
            since: at(since),
            reason: None,
            message: Some("the drain timed out".into()),
            version: Some("1.2.3".into()),
            event,
        }
    }

    fn events(out: &[Entry]) -> Vec<(String, Option<Event>)> {
        out.iter().map(|e| (e.node.clone(), e.event)).collect()
    }

    #[test]
    fn a_first_look_without_a_record_is_history_and_later_changes_are_news() {
        let mut t = Tracker::default();
        let old = [entry("a", Some(Event::NodeReturned), 1)];
        assert!(t.new_events("uid", None, &old).is_empty());
        let now = [
            entry("a", Some(Event::NodeReturned), 1),
            entry("b", Some(Event::DrainStarted), 5),
        ];
        assert_eq!(
            events(&t.new_events("uid", None, &now)),
            vec![("b".into(), Some(Event::DrainStarted))]
        );
        // The same entries again: nothing new.
        assert!(t.new_events("uid", None, &now).is_empty());
    }

    #[test]
    fn a_new_leader_sends_what_is_later_than_the_record() {
        let mut t = Tracker::default();
        let now = [
            entry("a", Some(Event::NodeReturned), 1),
            entry("b", Some(Event::RebootIssued), 7),
        ];
        let record = NotificationStatus {
            through: Some(Time(at(5))),
            ..Default::default()
        };
        assert_eq!(
            events(&t.new_events("uid", Some(&record), &now)),
            vec![("b".into(), Some(Event::RebootIssued))]
        );
    }

    /// A record without `through`: nothing was told yet, so a new leader
    /// tells what it finds (the first event's status write went through
    /// unanswered, then the leader died: found by the random worlds).
    #[test]
    fn a_record_with_nothing_told_yet_makes_everything_news() {
        let mut t = Tracker::default();
        let now = [entry("b", Some(Event::DrainStarted), 7)];
        let record = NotificationStatus::default();
        assert_eq!(
            events(&t.new_events("uid", Some(&record), &now)),
            vec![("b".into(), Some(Event::DrainStarted))]
        );
    }

    #[test]
    fn a_store_behind_our_writes_and_a_second_return_are_not_news() {
        let mut t = Tracker::default();
        assert!(t.new_events("u", None, &[]).is_empty());
        let drain = [entry("a", Some(Event::DrainStarted), 1)];
        let reboot = [entry("a", Some(Event::RebootIssued), 3)];
        assert_eq!(t.new_events("u", None, &drain).len(), 1);
        assert_eq!(t.new_events("u", None, &reboot).len(), 1);
        // The store shows the drain again: older than what we saw.
        assert!(t.new_events("u", None, &drain).is_empty());
        // NotReturned keeps the phase's since: a new event at the same time.
        let late = [entry("a", Some(Event::NotReturned), 3)];
        assert_eq!(t.new_events("u", None, &late).len(), 1);
        assert!(t.new_events("u", None, &reboot).is_empty());
        let back = [entry("a", Some(Event::NodeReturned), 9)];
        assert_eq!(t.new_events("u", None, &back).len(), 1);
        let done = [entry("a", Some(Event::NodeReturned), 12)];
        assert!(t.new_events("u", None, &done).is_empty());
        // The next reboot of the node is news again.
        let next = [entry("a", Some(Event::DrainStarted), 40)];
        assert_eq!(t.new_events("u", None, &next).len(), 1);
        // Phases without an event (Pending, Waiting, Verifying) are not told.
        assert!(t.new_events("u", None, &[entry("b", None, 50)]).is_empty());
    }

    #[test]
    fn entries_map_to_events_by_phase_and_reason() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let r = |phase, reason: Option<&str>| NodeReboot {
            name: "a".into(),
            phase,
            since: Time(at(0)),
            boot_id_before: None,
            need: None,
            message: None,
            reason: reason.map(str::to_string),
        };
        let ev = |e: &NodeReboot| reboot_entry(e).event;
        assert_eq!(ev(&r(RebootPhase::Waiting, Some("Budget"))), None);
        assert_eq!(
            ev(&r(RebootPhase::Draining, None)),
            Some(Event::DrainStarted)
        );
        assert_eq!(
            ev(&r(RebootPhase::Rebooting, None)),
            Some(Event::RebootIssued)
        );
        assert_eq!(ev(&r(RebootPhase::Verifying, None)), None);
        let late = r(RebootPhase::Verifying, Some("NotReturned"));
        assert_eq!(ev(&late), Some(Event::NotReturned));
        assert_eq!(
            ev(&r(RebootPhase::Settling, None)),
            Some(Event::NodeReturned)
        );
        assert_eq!(ev(&r(RebootPhase::Failed, None)), Some(Event::Failed));
    }

    #[test]
    fn templates_are_filled_and_each_format_has_its_shape() {
        let m = Message {
            event: Event::Failed,
            kind: "UpgradePlan",
            name: "os".into(),
            entry: entry("n1", Some(Event::Failed), 0),
        };
        assert_eq!(
            m.text(None),
            "node n1 failed: the drain timed out (UpgradePlan os)"
        );
        assert_eq!(
            m.text(Some(
                "[{event}] {kind}/{name} {node} {version}: {message} {unknown}"
            )),
            "[Failed] UpgradePlan/os n1 1.2.3: the drain timed out {unknown}"
        );
        assert_eq!(m.body("Slack", Some("{node}")), json!({"text": "n1"}));
        let teams = m.body("Teams", None);
        assert_eq!(
            teams["attachments"][0]["content"]["body"][0]["text"],
            "node n1 failed: the drain timed out (UpgradePlan os)"
        );
        let hook = m.body("Webhook", None);
        assert_eq!(hook["event"], "Failed");
        assert_eq!(hook["node"], "n1");
        assert_eq!(hook["version"], "1.2.3");
    }

    /// The CEL rule's list and the code's are the same list.
    #[test]
    fn the_schema_rule_names_every_placeholder_the_code_fills() {
        for p in crate::api::common::NOTIFY_PLACEHOLDERS {
            assert!(TEMPLATE_RULE.contains(&format!("'{{{p}}}'")), "{p}");
        }
        assert_eq!(TEMPLATE_RULE.matches(".replace(").count(), 9);
    }

    #[test]
    fn targets_come_from_the_spec_or_the_default() {
        assert!(targets(None, None).is_empty());
        let d = targets(None, Some("ops"));
        assert_eq!(d[0].secret, "ops");
        assert_eq!(d[0].format, None);
        assert!(targets(Some(&vec![]), Some("ops")).is_empty());
        assert!(wants(&[], Event::Failed));
        assert!(wants(&["Failed".into()], Event::Failed));
        assert!(!wants(&["Failed".into()], Event::DrainStarted));
    }
}
