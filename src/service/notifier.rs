//! The cluster role's notifications (RebootPolicy and UpgradePlan
//! `notifications`, `run --notify-default`): what the passes observe in the
//! objects' status entries goes, as events ([`crate::decide::notify`]),
//! into one queue per target, each drained by its own task, so a slow or
//! dead webhook delays only its own messages and never a pass. Each
//! delivery reads the target's Secret (a `get` of that one name: the
//! cluster role may read no other), posts with [`crate::effects::http`],
//! and tries [`ATTEMPTS`] times. The outcome — counts, the last failure,
//! and up to when every entry was handled — is what the next decision
//! writes into the object's `status.notifications`; the notifier kicks
//! the scheduler for it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Client, ResourceExt};

use super::metrics;
use super::passes::Kick;
use crate::api::common::{Notification, NotificationStatus, is_node_name};
use crate::api::reboot::{RebootPolicy, RebootPolicyStatus};
use crate::api::upgrade::{UpgradePlan, UpgradePlanStatus};
use crate::decide::notify::{self, Entry, Message, Target, Tracker};

/// Tries per message, and the waits between them.
pub const ATTEMPTS: usize = 3;
const BACKOFF: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(6)];
/// One try's deadline: the Secret's read, then the POST.
const DEADLINE: Duration = Duration::from_secs(10);
/// Messages waiting per target; past it, new ones are counted as failed.
const QUEUE: usize = 256;

/// Status times are whole seconds (as the API server stores them): a
/// finer one would never equal what is read back, and the status would be
/// written again on every pass.
fn second(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

use crate::runtime::lock;

struct Config {
    client: Client,
    namespace: String,
    default: Option<String>,
    kick: Kick,
}

#[derive(Default)]
struct Object {
    status: NotificationStatus,
    pending: usize,
    newest: Option<Timestamp>,
    /// What its spec names now: a queue no live object names is freed.
    targets: Vec<Target>,
}

#[derive(Default)]
struct State {
    tracker: Tracker,
    objects: HashMap<String, Object>,
    queues: HashMap<Target, smol::channel::Sender<Job>>,
}

struct Job {
    uid: String,
    message: Message,
}

/// See the module's documentation. Inert until [`Notifier::configure`]
/// (the node role never is).
#[derive(Default)]
pub struct Notifier {
    config: OnceLock<Config>,
    state: std::sync::Arc<Mutex<State>>,
}

impl Notifier {
    pub fn configure(
        &self,
        client: Client,
        namespace: String,
        default: Option<String>,
        kick: Kick,
    ) {
        let _ = self.config.set(Config {
            client,
            namespace,
            default,
            kick,
        });
    }

    /// An object's entries, as stored or as just written: queue what is new.
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &self,
        kind: &'static str,
        uid: Option<String>,
        name: &str,
        spec: Option<&Vec<Notification>>,
        record: Option<&NotificationStatus>,
        entries: Vec<Entry>,
    ) {
        let (Some(config), Some(uid)) = (self.config.get(), uid) else {
            return;
        };
        let targets = notify::targets(spec, config.default.as_deref());
        let mut state = lock(&self.state);
        if targets.is_empty() {
            if let Some(o) = state.objects.get_mut(&uid) {
                o.targets.clear();
            }
            return;
        }
        let new = state.tracker.new_events(&uid, record, &entries);
        let object = state.objects.entry(uid.clone()).or_insert_with(|| Object {
            status: record.cloned().unwrap_or_default(),
            ..Default::default()
        });
        for e in entries.iter().filter(|e| e.event.is_some()) {
            object.newest = object.newest.max(Some(e.since));
        }
        object.targets = targets.clone();
        let mut jobs = Vec::new();
        for e in new {
            let Some(event) = e.event else { continue };
            for t in &targets {
                if t.events
                    .as_ref()
                    .is_some_and(|ev| !notify::wants(ev, event))
                {
                    continue;
                }
                let message = Message {
                    event,
                    kind,
                    name: name.to_string(),
                    entry: e.clone(),
                };
                jobs.push((t.clone(), message));
            }
        }
        for (target, message) in jobs {
            let queue = match state.queues.get(&target) {
                Some(q) => q.clone(),
                None => {
                    let q = self.start_queue(config, target.clone());
                    state.queues.insert(target.clone(), q.clone());
                    metrics::set(&metrics::NOTIFICATIONS.queues, state.queues.len());
                    q
                }
            };
            let job = Job {
                uid: uid.clone(),
                message,
            };
            let object = state.objects.entry(uid.clone()).or_default();
            match queue.try_send(job) {
                Ok(()) => object.pending += 1,
                Err(_) => {
                    let why = format!(
                        "Secret {}: {QUEUE} messages already wait for this target; one dropped",
                        target.secret
                    );
                    failed(object, why);
                }
            }
        }
        let object = state.objects.entry(uid).or_default();
        if object.pending == 0 && object.newest.is_some() {
            object.status.through = object.newest.map(second);
        }
    }

    /// A RebootPolicy's entries: `status` as just written, else as stored.
    pub fn observe_policy(&self, p: &RebootPolicy, status: Option<&RebootPolicyStatus>) {
        // No status yet is a first look too: what comes next is news.
        let entries = status
            .or(p.status.as_ref())
            .map(|st| st.nodes.iter().map(notify::reboot_entry).collect())
            .unwrap_or_default();
        let record = p.status.as_ref().and_then(|s| s.notifications.as_ref());
        let spec = p.spec.notifications.as_ref();
        self.observe(
            "RebootPolicy",
            p.uid(),
            &p.name_any(),
            spec,
            record,
            entries,
        );
    }

    /// An UpgradePlan's entries: `status` as just written, else as stored.
    pub fn observe_plan(&self, p: &UpgradePlan, status: Option<&UpgradePlanStatus>) {
        // No status yet is a first look too: what comes next is news.
        let entries = status
            .or(p.status.as_ref())
            .map(|st| st.nodes.iter().map(notify::upgrade_entry).collect())
            .unwrap_or_default();
        let record = p.status.as_ref().and_then(|s| s.notifications.as_ref());
        let spec = p.spec.notifications.as_ref();
        self.observe("UpgradePlan", p.uid(), &p.name_any(), spec, record, entries);
    }

    /// What the object's next status says of its notifications.
    pub fn status(&self, uid: Option<&str>) -> Option<NotificationStatus> {
        let state = lock(&self.state);
        state.objects.get(uid?).map(|o| o.status.clone())
    }

    /// Forget objects that are gone, and the queues no live object names
    /// (an edited template or events list, a deleted object): dropping a
    /// queue's sender ends its task once what it holds is delivered
    /// (where-features-meet.md, finding 16: one queue and task leaked per
    /// edit).
    pub fn retain(&self, live: &[String]) {
        let mut state = lock(&self.state);
        state.tracker.retain(live);
        state.objects.retain(|uid, _| live.contains(uid));
        let named: Vec<Target> = state
            .objects
            .values()
            .flat_map(|o| o.targets.iter().cloned())
            .collect();
        state.queues.retain(|t, _| named.contains(t));
        metrics::set(&metrics::NOTIFICATIONS.queues, state.queues.len());
    }

    fn start_queue(&self, config: &Config, target: Target) -> smol::channel::Sender<Job> {
        let (tx, rx) = smol::channel::bounded::<Job>(QUEUE);
        let (client, namespace, kick) = (
            config.client.clone(),
            config.namespace.clone(),
            config.kick.clone(),
        );
        let state = self.state.clone();
        crate::runtime::spawn(async move {
            while let Ok(job) = rx.recv().await {
                let outcome = deliver(&client, &namespace, &target, &job.message).await;
                let mut s = lock(&state);
                let object = s.objects.entry(job.uid.clone()).or_default();
                object.pending = object.pending.saturating_sub(1);
                match outcome {
                    Ok(Delivered::Sent) => {
                        object.status.delivered += 1;
                        metrics::inc(&metrics::NOTIFICATIONS.delivered);
                    }
                    Ok(Delivered::NotWanted) => {}
                    Err(why) => {
                        log::warn!(
                            "{} {}: notification {} of node {} not delivered: {why}",
                            job.message.kind,
                            job.message.name,
                            job.message.event.as_str(),
                            job.message.entry.node
                        );
                        failed(object, why);
                    }
                }
                if object.pending == 0 {
                    object.status.through = object.newest.map(second);
                }
                drop(s);
                kick.kick();
            }
        })
        .detach();
        tx
    }
}

fn failed(object: &mut Object, why: String) {
    object.status.failed += 1;
    object.status.last_failure = Some(why);
    object.status.last_failure_time = Some(second(Timestamp::now()));
    metrics::inc(&metrics::NOTIFICATIONS.failed);
}

enum Delivered {
    Sent,
    /// The default Secret's `events` leaves this one out.
    NotWanted,
}

/// Read the target's Secret and post, up to [`ATTEMPTS`] times. The error
/// names the Secret and the event, never the URL.
async fn deliver(
    client: &Client,
    namespace: &str,
    target: &Target,
    message: &Message,
) -> Result<Delivered, String> {
    let what = format!("Secret {namespace}/{} key {}", target.secret, target.key);
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            crate::runtime::sleep(BACKOFF[(attempt - 1).min(BACKOFF.len() - 1)]).await;
        }
        let secret = crate::runtime::timeout(DEADLINE, read_secret(client, namespace, target))
            .await
            .unwrap_or_else(|()| {
                Err((format!("no answer within {} s", DEADLINE.as_secs()), false))
            });
        let secret = match secret {
            Ok(s) => s,
            Err((why, permanent)) => {
                last = format!("{what}: {why}");
                if permanent {
                    break;
                }
                continue;
            }
        };
        let format = target
            .format
            .clone()
            .or_else(|| secret.get("format").cloned())
            .unwrap_or_else(|| "Webhook".into());
        let events: Option<Vec<String>> = target.events.clone().or_else(|| {
            secret
                .get("events")
                .map(|e| e.split(',').map(|s| s.trim().to_string()).collect())
        });
        if events.is_some_and(|ev| !notify::wants(&ev, message.event)) {
            return Ok(Delivered::NotWanted);
        }
        let template = target
            .template
            .clone()
            .or_else(|| secret.get("template").cloned());
        let Some(url) = secret.get(&target.key) else {
            last = format!("{what}: the Secret has no such key");
            break;
        };
        let body = message.body(&format, template.as_deref()).to_string();
        let ca = secret.get("ca.crt").map(|c| c.as_bytes());
        match crate::effects::http::post(url, body.as_bytes(), ca, DEADLINE).await {
            Ok(()) => return Ok(Delivered::Sent),
            Err(f) => {
                last = format!("{what}: {}", f.why);
                if f.permanent {
                    break;
                }
            }
        }
    }
    Err(format!(
        "{} for node {}: {last}",
        message.event.as_str(),
        message.entry.node
    ))
}

/// The Secret's keys, decoded; Err((why, permanent)).
async fn read_secret(
    client: &Client,
    namespace: &str,
    target: &Target,
) -> Result<HashMap<String, String>, (String, bool)> {
    // The schema checks the name; checked again before it goes in a URL.
    if !is_node_name(&target.secret) {
        return Err((format!("{:?} is not a Secret name", target.secret), true));
    }
    let resource = ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Secret".into(),
        plural: "secrets".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let secret = api.get(&target.secret).await.map_err(|e| match &e {
        kube::Error::Api(s) if s.code == 403 => (
            format!(
                "reading it: forbidden (the cluster role may read only the Secrets its manifests name: manifests --notify-secret {})",
                target.secret
            ),
            true,
        ),
        kube::Error::Api(s) if s.code == 404 => ("no such Secret".to_string(), true),
        kube::Error::Api(s) => (format!("reading it: {}", s.message), false),
        e => (
            format!("reading it: {}", crate::error::first_line(&e.to_string())),
            false,
        ),
    })?;
    let mut out = HashMap::new();
    if let Some(data) = secret.data.get("data").and_then(|d| d.as_object()) {
        for (k, v) in data {
            // Secret data is base64; ByteString's deserializer decodes it.
            if let Ok(ByteString(bytes)) = serde_json::from_value::<ByteString>(v.clone()) {
                out.insert(
                    k.clone(),
                    String::from_utf8_lossy(&bytes).trim().to_string(),
                );
            }
        }
    }
    Ok(out)
}
