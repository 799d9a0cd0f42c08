//! Kubernetes Events (events.k8s.io/v1), the lines `kubectl describe`
//! shows under an object: one Event per object, reason and note, and a
//! repeat of the same within [`SERIES_WINDOW`] counted as a series on it.
//!
//! Why not kube's `Recorder`: it remembers every Event it wrote, as the
//! whole object, for six minutes after the last repeat, and prunes only when
//! it publishes again. Its key holds the object's resourceVersion, so every
//! drain adds entries that never repeat; `just bench-drain-soak` showed an
//! agent's RSS growing with every drain. Here the memory of recent Events
//! is [`Recent`]: at most [`RECENT_CAP`] small entries, pruned on each
//! publish, keyed without resourceVersion (a repeat on a newer version of
//! the same object is still a repeat).

use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// A repeat within this long of the last is counted on the same Event
/// (client-go's and kube's six minutes).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// The most Events remembered for series at once. A node agent writes a
/// handful per maintenance; a cluster role in a large rollout more. Past
/// the cap the least recently written is forgotten: its next repeat starts
/// a new Event, which costs one object, not correctness.
pub const RECENT_CAP: usize = 128;

/// What makes two Events the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// The object: its UID where it has one, else kind/namespace/name.
    pub regarding: String,
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

impl Key {
    pub fn new(object: &ObjectReference, warning: bool, reason: &str, note: &str) -> Key {
        let regarding = match &object.uid {
            Some(uid) if !uid.is_empty() => uid.clone(),
            _ => format!(
                "{}/{}/{}",
                object.kind.as_deref().unwrap_or_default(),
                object.namespace.as_deref().unwrap_or_default(),
                object.name.as_deref().unwrap_or_default()
            ),
        };
        Key {
            regarding,
            warning,
            reason: reason.to_string(),
            note: note.to_string(),
        }
    }
}

/// One Event written: where it is, how often it was seen, and when last.
#[derive(Clone, Debug, PartialEq)]
pub struct Written {
    pub key: Key,
    pub namespace: String,
    pub name: String,
    pub count: i32,
    pub last: Timestamp,
}

/// What to do for one publish.
#[derive(Debug, PartialEq)]
pub enum Write {
    /// A new Event.
    Create,
    /// A repeat: patch the series of this Event to `count`.
    Repeat {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// The Events written recently, bounded in number and age.
#[derive(Debug, Default)]
pub struct Recent {
    entries: Vec<Written>,
}

impl Recent {
    /// Forget what is older than the window, then say whether `key` is a
    /// repeat.
    pub fn plan(&mut self, key: &Key, now: Timestamp) -> Write {
        self.entries
            .retain(|e| now.duration_since(e.last) < SERIES_WINDOW);
        match self.entries.iter().find(|e| &e.key == key) {
            Some(e) => Write::Repeat {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                count: e.count + 1,
            },
            None => Write::Create,
        }
    }

    /// Remember a write that succeeded, evicting the least recent past the
    /// cap.
    pub fn remember(&mut self, written: Written) {
        self.entries.retain(|e| e.key != written.key);
        if self.entries.len() >= RECENT_CAP
            && let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last)
                .map(|(i, _)| i)
        {
            self.entries.swap_remove(oldest);
        }
        self.entries.push(written);
    }

    /// Forget an Event the API server no longer has (expired by its TTL).
    pub fn forget(&mut self, key: &Key) {
        self.entries.retain(|e| &e.key != key);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Writes Events as one reporting controller and instance.
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

/// (regarding kind, reason, type) → Events written (repeats included),
/// for `/metrics`: every feature's milestones and failures are Events, so
/// this is how each one is counted (reboots verified, upgrades failed,
/// mutex runs, nodes replaced) without a counter per feature.
pub static PUBLISHED: crate::counts::Counts<(String, String, &'static str)> =
    crate::counts::Counts::new();

impl Events {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Events {
        Events {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            recent: Mutex::new(Recent::default()),
        }
    }

    /// Write an Event about `object`, or count a repeat on the last one.
    /// Cluster-scoped objects' Events go to `default`, as kubectl expects.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        self.write(object, warning, reason, note).await?;
        PUBLISHED.add((
            object.kind.clone().unwrap_or_default(),
            reason.to_string(),
            if warning { "Warning" } else { "Normal" },
        ));
        Ok(())
    }

    async fn write(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let key = Key::new(object, warning, reason, note);
        let now = Timestamp::now();
        let plan = self.recent().plan(&key, now);
        if let Write::Repeat {
            namespace,
            name,
            count,
        } = plan
        {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let patch = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.recent().remember(Written {
                        key,
                        namespace,
                        name,
                        count,
                        last: now,
                    });
                    return Ok(());
                }
                // Expired on the server (its event TTL): write a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => self.recent().forget(&key),
                Err(e) => return Err(e),
            }
        }
        let namespace = object
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let name = format!(
            "{}.{:x}",
            object.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let event = Event {
            action: Some(reason.to_string()),
            reason: Some(reason.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(object.clone()),
            note: Some(truncate_note(note)),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..Default::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        self.recent().remember(Written {
            key,
            namespace,
            name,
            count: 1,
            last: now,
        });
        Ok(())
    }

    /// The lock is never held across an await; a panic while holding it
    /// leaves the entries whole, so a poisoned lock is still usable.
    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// events.k8s.io refuses a note over 1 KiB, and the Event with it: a
/// RebootFailed naming five PDB blockers or a ReconcileFailed carrying a
/// long API error was lost. Cut at a character boundary, marked.
pub fn truncate_note(note: &str) -> String {
    const MAX: usize = 1024;
    const MARK: &str = " …";
    if note.len() <= MAX {
        return note.to_string();
    }
    let mut end = MAX - MARK.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(uid: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("NodeMaintenance".into()),
            name: Some("nm".into()),
            uid: Some(uid.into()),
            resource_version: Some("1".into()),
            ..Default::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn written(key: &Key, count: i32, last: Timestamp) -> Written {
        Written {
            key: key.clone(),
            namespace: "default".into(),
            name: "nm.1".into(),
            count,
            last,
        }
    }

    #[test]
    fn a_repeat_within_the_window_counts_on_the_same_event() {
        let mut recent = Recent::default();
        let key = Key::new(&object("u1"), false, "Drained", "done");
        assert_eq!(recent.plan(&key, at(0)), Write::Create);
        recent.remember(written(&key, 1, at(0)));
        // A newer resourceVersion of the same object is the same object.
        let mut newer = object("u1");
        newer.resource_version = Some("2".into());
        let again = Key::new(&newer, false, "Drained", "done");
        assert_eq!(
            recent.plan(&again, at(300)),
            Write::Repeat {
                namespace: "default".into(),
                name: "nm.1".into(),
                count: 2
            }
        );
    }

    #[test]
    fn another_note_object_or_type_is_another_event() {
        let mut recent = Recent::default();
        let key = Key::new(&object("u1"), false, "Drained", "done");
        recent.remember(written(&key, 1, at(0)));
        for other in [
            Key::new(&object("u1"), false, "Drained", "other"),
            Key::new(&object("u2"), false, "Drained", "done"),
            Key::new(&object("u1"), true, "Drained", "done"),
        ] {
            assert_eq!(recent.plan(&other, at(1)), Write::Create);
        }
    }

    #[test]
    fn entries_older_than_the_window_are_forgotten() {
        let mut recent = Recent::default();
        let key = Key::new(&object("u1"), false, "Drained", "done");
        recent.remember(written(&key, 3, at(0)));
        assert_eq!(recent.plan(&key, at(360)), Write::Create);
        assert!(recent.is_empty());
    }

    #[test]
    fn the_memory_is_capped_and_the_least_recent_goes_first() {
        let mut recent = Recent::default();
        for i in 0..(RECENT_CAP as i64 + 50) {
            let key = Key::new(&object(&format!("u{i}")), false, "Drained", "done");
            recent.remember(written(&key, 1, at(i)));
        }
        assert_eq!(recent.len(), RECENT_CAP);
        let first = Key::new(&object("u0"), false, "Drained", "done");
        let last = Key::new(
            &object(&format!("u{}", RECENT_CAP + 49)),
            false,
            "Drained",
            "done",
        );
        let now = at(RECENT_CAP as i64 + 50);
        assert_eq!(recent.plan(&first, now), Write::Create);
        assert!(matches!(recent.plan(&last, now), Write::Repeat { .. }));
    }

    #[test]
    fn remembering_a_repeat_replaces_its_entry() {
        let mut recent = Recent::default();
        let key = Key::new(&object("u1"), false, "Drained", "done");
        recent.remember(written(&key, 1, at(0)));
        recent.remember(written(&key, 2, at(10)));
        assert_eq!(recent.len(), 1);
    }

    #[test]
    fn objects_without_uid_are_told_apart_by_kind_namespace_and_name() {
        let mut a = object("");
        a.uid = None;
        let mut b = a.clone();
        b.name = Some("other".into());
        assert_ne!(
            Key::new(&a, false, "R", "n").regarding,
            Key::new(&b, false, "R", "n").regarding
        );
    }

    #[test]
    fn notes_over_one_kib_are_cut_at_a_character_boundary() {
        use super::truncate_note;
        assert_eq!(truncate_note("short"), "short");
        let long = "é".repeat(700);
        let cut = truncate_note(&long);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with(" …"));
        assert!(cut.starts_with("éé"));
    }
}
