//! Building blocks every disruption feature shares, one Rust type each, so
//! RebootPolicy, UpgradePlan and replacement speak the same language:
//! node names, the drain options an owner hands to the NodeMaintenance it
//! takes a node with, and the API shapes of budgets ([`Budget`]), windows
//! ([`Window`]), gates ([`Gates`]) and drain settings ([`DrainSpec`]). Their
//! arithmetic is pure code in `decide/` (`budget.rs`, `window.rs`); the
//! schema's CEL rules refuse what is checkable without other objects.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Is `name` a name a Node can have: a lowercase RFC 1123 subdomain, as
/// the API server validates Node names (and the CRD's CEL rule checks
/// `spec.nodeName`)? Any label length: Node names are subdomains, not DNS
/// labels.
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A DNS-1123 label (a namespace's name): at most 63 lowercase letters,
/// digits and '-', starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_node_name(name)
}

/// What a drain does once its deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Escalation {
    /// Keep trying and report what blocks it (NodeMaintenance's default).
    #[default]
    Wait,
    /// Delete what eviction could not move, PodDisruptionBudgets
    /// notwithstanding.
    Force,
    /// Give the node back undrained: the maintenance fails, and its owner
    /// skips the node and reports.
    Skip,
}

impl Escalation {
    pub fn parse(s: &str) -> Option<Escalation> {
        match s.trim() {
            "Wait" => Some(Escalation::Wait),
            "Force" => Some(Escalation::Force),
            "Skip" => Some(Escalation::Skip),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Escalation::Wait => "Wait",
            Escalation::Force => "Force",
            Escalation::Skip => "Skip",
        }
    }
}

/// How one NodeMaintenance drains: its deadline and what happens after it,
/// the grace period sent with each eviction (`None`: each pod's own), and
/// which pods it drains (`None`: all that kubectl drain would).
#[derive(Debug, Clone, PartialEq)]
pub struct DrainOptions {
    pub timeout: Duration,
    pub on_timeout: Escalation,
    pub grace_period: Option<i64>,
    pub pod_selector: Option<LabelSelector>,
}

/// A count-or-percent: a whole number ≥ 0, or `N%` with N in 0–100. Plain
/// OpenAPI rather than CEL: `pattern` applies to the string form only and
/// `minimum` to the number form, and neither costs CEL budget (a CEL regex
/// on an int-or-string, which cannot carry maxLength, exceeds it).
fn count_or_percent(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "minimum": 0,
        "maxLength": 4,
        "pattern": "^(100|[1-9]?[0-9])%$",
        "description": "a whole number of nodes (0 or more) or a percentage such as 25%"
    })
}

/// Weekdays as kured and system-upgrade-controller accept them.
fn days(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 7,
        "items": {
            "type": "string",
            "maxLength": 9,
            "x-kubernetes-validations": [{
                "rule": "self.matches('^(?i)(su|sun|sunday|mo|mon|monday|tu|tue|tues|tuesday|we|wed|wednesday|th|thu|thur|thurs|thursday|fr|fri|friday|sa|sat|saturday|[0-6])$')",
                "message": "a day must be sun..sat, sunday..saturday, su..sa or 0-6 (0 = Sunday)"
            }]
        }
    })
}

/// How many selected nodes may be unavailable at once. **Every** unavailable
/// node counts — NotReady, cordoned, in any NodeMaintenance — not only the
/// ones a feature disrupts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// Nodes (count) or share of the selected nodes (percent, rounded down,
    /// at least 1 when above 0%) that may be unavailable at once. 0 admits
    /// nothing. Default 1.
    #[serde(default = "one")]
    #[schemars(schema_with = "count_or_percent")]
    pub max_unavailable: IntOrString,
    /// Tighter limits per topology domain: nodes sharing the value of the
    /// label `key` (e.g. `topology.kubernetes.io/zone`) form a domain, and
    /// `maxUnavailable` applies within it (percent of the domain's size).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub per_topology: Vec<TopologyBudget>,
    /// Control-plane nodes (label `node-role.kubernetes.io/control-plane`)
    /// unavailable at once. Default 1.
    #[serde(default = "one_i32")]
    #[schemars(range(min = 0, max = 100))]
    pub max_control_plane: i32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_unavailable: one(),
            per_topology: Vec::new(),
            max_control_plane: 1,
        }
    }
}

fn one() -> IntOrString {
    IntOrString::Int(1)
}

fn one_i32() -> i32 {
    1
}

/// A budget within each domain of one topology label.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyBudget {
    /// The node label whose values form the domains.
    #[schemars(length(min = 1, max = 317))]
    pub key: String,
    /// Unavailable nodes allowed per domain (count or percent of it).
    #[schemars(schema_with = "count_or_percent")]
    pub max_unavailable: IntOrString,
}

/// CEL: `HH:MM`, 24-hour.
const TIME_RULE: &str = "self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')";
const TIME_MESSAGE: &str = "must be a 24-hour time HH:MM, e.g. 02:30";
/// CEL: the syntax of an IANA time zone name (whether the zone exists is
/// checked against the time zone database and reported in status).
const ZONE_RULE: &str = "self.matches('^(UTC|[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2})$')";
const ZONE_MESSAGE: &str = "must be an IANA time zone name such as UTC or Europe/Berlin";

/// When disruptions may start: on these days, from `start` to `end` in
/// `timeZone`, or at each time `schedule` (cron) names for `duration`. A
/// window whose end is not after its start wraps midnight (it belongs to
/// the day it starts on). Work admitted inside a window finishes after it
/// closes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(WINDOW_RULE).message(WINDOW_MESSAGE))]
pub struct Window {
    /// Days the window starts on (default: every day).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "days")]
    pub days: Vec<String>,
    /// Days of the month the window starts on: 1 to 31, or counted from
    /// the month's end (-1 its last day, -2 the one before). With `days`,
    /// a day must be both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "days_of_month")]
    pub days_of_month: Vec<i32>,
    /// Which of the month's weekdays `days` names: 1 the first, 2 the
    /// second, ..., -1 the last (`days: [tue]`, `weeksOfMonth: [2]`: the
    /// second Tuesday).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "weeks_of_month")]
    pub weeks_of_month: Vec<i32>,
    /// Opening time, HH:MM.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[x_kube(validation = Rule::new(TIME_RULE).message(TIME_MESSAGE))]
    #[schemars(length(max = 5))]
    pub start: String,
    /// Closing time, HH:MM (exclusive); not after `start` means the next day.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[x_kube(validation = Rule::new(TIME_RULE).message(TIME_MESSAGE))]
    #[schemars(length(max = 5))]
    pub end: String,
    /// Instead of days, `start` and `end`: a cron schedule (minute, hour,
    /// day of month, month, day of week; or @daily, @weekly, @monthly,
    /// @yearly, @hourly) of the window's openings, in `timeZone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub schedule: Option<String>,
    /// How long each opening of `schedule` lasts (a Go duration such as
    /// `90m` or `3h`, at most 168h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub duration: Option<String>,
    /// IANA time zone of `start` and `end` (default UTC); daylight saving
    /// time is followed.
    #[serde(default = "utc")]
    #[x_kube(validation = Rule::new(ZONE_RULE).message(ZONE_MESSAGE))]
    #[schemars(length(max = 64))]
    pub time_zone: String,
    /// Dates on which the window stays closed, whole days in `timeZone`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub blackouts: Vec<Blackout>,
}

/// CEL: a window is days with start and end, or a schedule with a duration.
const WINDOW_RULE: &str = "has(self.schedule) ? (has(self.duration) && !has(self.start) && !has(self.end) && !has(self.days) && !has(self.daysOfMonth) && !has(self.weeksOfMonth)) : (has(self.start) && has(self.end) && !has(self.duration))";
const WINDOW_MESSAGE: &str =
    "a window has start and end (with days, daysOfMonth, weeksOfMonth), or schedule and duration";

/// A date, or a range of dates, on which a window stays closed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Blackout {
    /// The first day, YYYY-MM-DD.
    #[x_kube(validation = Rule::new(DATE_RULE).message(DATE_MESSAGE))]
    #[schemars(length(max = 10))]
    pub start: String,
    /// The last day, YYYY-MM-DD (default: `start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DATE_RULE).message(DATE_MESSAGE))]
    #[schemars(length(max = 10))]
    pub end: Option<String>,
}

/// CEL: `YYYY-MM-DD` (whether the day exists is checked when parsed).
const DATE_RULE: &str = "self.matches('^[0-9]{4}-[01][0-9]-[0-3][0-9]$')";
const DATE_MESSAGE: &str = "must be a date YYYY-MM-DD, e.g. 2026-12-24";

fn days_of_month(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 31,
        "items": {
            "type": "integer",
            "x-kubernetes-validations": [{
                "rule": "(self >= 1 && self <= 31) || (self >= -31 && self <= -1)",
                "message": "a day of the month is 1 to 31, or -1 (the last) to -31"
            }]
        }
    })
}

fn weeks_of_month(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 5,
        "items": {
            "type": "integer",
            "x-kubernetes-validations": [{
                "rule": "(self >= 1 && self <= 5) || (self >= -5 && self <= -1)",
                "message": "a week of the month is 1 to 5 (the first to the fifth of that weekday), or -1 (the last) to -5"
            }]
        }
    })
}

fn utc() -> String {
    "UTC".into()
}

/// Conditions checked before a node is admitted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Gates {
    /// No disruption while pods matching any of these run on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub blocking_pods: Vec<BlockingPods>,
    /// Seconds a node keeps its slot after it came back (Ready with the
    /// new boot), before the next node is admitted in its place.
    #[serde(default)]
    #[schemars(range(min = 0, max = 86400))]
    pub settle_seconds: i32,
    /// Admit nothing while any selected node other than those waiting for
    /// this feature is NotReady.
    #[serde(default)]
    pub require_ready: bool,
    /// Admit nothing while Prometheus reports a matching alert (kured's
    /// `--prometheus-url`, `--alert-filter-regexp`, `--alert-firing-only`).
    /// With `health`, a node that came back also keeps its slot while one
    /// fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusGate>,
    /// After a node came back (Ready with its new boot), it keeps its slot
    /// until the cluster is healthy again, not merely the node: the node
    /// Ready and schedulable, the workloads named here fully available, no
    /// matching alert (`prometheus`), for at least `settleSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthGate>,
}

/// Labels a feature puts on the nodes it works on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeLabels {
    /// Set when the node is taken (before its drain), removed when it is
    /// given back (kured's `--pre-reboot-node-labels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 16))]
    pub during: BTreeMap<String, String>,
    /// Set when the node is done with successfully (kured's
    /// `--post-reboot-node-labels`, SUC's `postCompleteLabels`); in an
    /// UpgradePlan `{version}` in a value is replaced by the version.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 16))]
    pub after: BTreeMap<String, String>,
}

impl NodeLabels {
    pub fn is_empty(&self) -> bool {
        self.during.is_empty() && self.after.is_empty()
    }
}

/// What must be healthy again before a node that came back gives its slot
/// to the next node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthGate {
    /// Workloads that must be fully available: every Deployment,
    /// StatefulSet and DaemonSet these select has its controller's view
    /// current and its updated, ready and available replicas equal to the
    /// desired count (as `kubectl rollout status` reads them).
    #[schemars(length(min = 1, max = 16))]
    pub workloads: Vec<Workloads>,
    /// Seconds from the node's return within which the gate must be met;
    /// past it `onTimeout` applies. Default 600.
    #[serde(default = "health_timeout")]
    #[schemars(range(min = 10, max = 86400))]
    pub timeout_seconds: i32,
    /// `Pause` (default): the node keeps its slot, so no further node is
    /// taken, and the status reports `HealthTimeout` until the workloads
    /// recover. `Continue`: the slot is given back, `HealthTimeout`
    /// reported on the node's entry and as an event.
    #[serde(default = "pause")]
    #[x_kube(validation = Rule::new("self in ['Pause', 'Continue']").message("gates.health.onTimeout must be Pause or Continue"))]
    pub on_timeout: String,
}

fn health_timeout() -> i32 {
    600
}

fn pause() -> String {
    "Pause".into()
}

/// Workloads selected by label, in one namespace or all.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Workloads {
    /// Only in this namespace (default: every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: Option<String>,
    /// Which Deployments, StatefulSets and DaemonSets.
    pub selector: LabelSelector,
}

/// CEL: an http:// URL with a host and an optional path, nothing else.
pub const PROMETHEUS_URL_RULE: &str =
    "self.matches('^http://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$')";

/// Alerts in Prometheus that hold admissions.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusGate {
    /// Prometheus's address, e.g. `http://prometheus.monitoring:9090`
    /// (plain http; its `/api/v1/alerts` is asked every 15 s).
    #[x_kube(validation = Rule::new(PROMETHEUS_URL_RULE).message("gates.prometheus.url must be an http:// URL with a host, an optional port and path, e.g. http://prometheus.monitoring:9090 (https is not supported)"))]
    #[schemars(length(max = 512))]
    pub url: String,
    /// Only alerts whose name matches this regular expression (anywhere in
    /// the name, as kured's; `^…$` for the whole name) hold admissions
    /// (default: every alert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub alerts: Option<String>,
    /// Alerts whose name matches this regular expression (anywhere in the
    /// name) never hold admissions (kured's `--alert-filter-regexp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub ignore_alerts: Option<String>,
    /// Only firing alerts hold admissions, not pending ones (kured's
    /// `--alert-firing-only`).
    #[serde(default)]
    pub firing_only: bool,
}

/// Pods that block a disruption of the node they run on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlockingPods {
    /// Only pods in this namespace (default: every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: Option<String>,
    /// Which pods block.
    pub selector: LabelSelector,
}

/// How a feature's NodeMaintenances drain.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Seconds the drain may take (default 600).
    #[serde(default = "drain_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i32,
    /// After the timeout: `Wait` keeps trying and reports what blocks it,
    /// `Force` deletes what is left ignoring PodDisruptionBudgets, `Skip`
    /// gives the node back undisrupted and reports (default Wait).
    #[serde(default = "wait")]
    #[x_kube(validation = Rule::new("self in ['Wait', 'Force', 'Skip']").message("onTimeout must be Wait, Force or Skip"))]
    pub on_timeout: String,
    /// Seconds each evicted pod gets to stop (0–86400); default: each
    /// pod's own terminationGracePeriodSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub grace_period_seconds: Option<i64>,
    /// Only pods matching this are drained; others stay on the node
    /// (default: every pod kubectl drain would move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            timeout_seconds: drain_timeout(),
            on_timeout: wait(),
            grace_period_seconds: None,
            pod_selector: None,
        }
    }
}

fn drain_timeout() -> i32 {
    600
}

fn wait() -> String {
    "Wait".into()
}

/// CEL: a template names only the placeholders [`NOTIFY_PLACEHOLDERS`]
/// knows (each removed, then no `{word}` may be left).
pub const TEMPLATE_RULE: &str = "!self.replace('{event}', '').replace('{node}', '').replace('{kind}', '').replace('{name}', '').replace('{phase}', '').replace('{reason}', '').replace('{message}', '').replace('{version}', '').replace('{text}', '').matches('[{][A-Za-z_]+[}]')";

/// What a notification template may name.
pub const NOTIFY_PLACEHOLDERS: [&str; 9] = [
    "event", "node", "kind", "name", "phase", "reason", "message", "version", "text",
];

/// Where to tell people about the nodes a RebootPolicy or UpgradePlan
/// works on (kured's `--notify-url`), and what.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// The Secret, in nodekeeper's own namespace, whose key holds the
    /// webhook's URL (`http://` or `https://`; it carries a token, so it is
    /// never written in the object). The cluster role may read only the
    /// Secrets its manifests name (`manifests --notify-secret NAME`, Helm
    /// `notifications.secrets`). An optional `ca.crt` key in the same
    /// Secret is the CA bundle an `https://` URL's certificate is checked
    /// against instead of the system's.
    pub url_from: SecretKey,
    /// The body: `Webhook` (default; JSON with every field of the event),
    /// `Slack` (a Slack incoming webhook's `{"text": …}`) or `Teams` (a
    /// Teams workflow webhook's message with one Adaptive Card).
    #[serde(default = "webhook")]
    #[x_kube(validation = Rule::new("self in ['Webhook', 'Slack', 'Teams']").message("notifications[].format must be Webhook, Slack or Teams"))]
    pub format: String,
    /// Which events are sent (empty: all): `DrainStarted`, `RebootIssued`,
    /// `UpgradeIssued`, `NodeReturned`, `Failed`, `NotReturned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 6))]
    #[x_kube(validation = Rule::new("self.all(e, e in ['DrainStarted', 'RebootIssued', 'UpgradeIssued', 'NodeReturned', 'Failed', 'NotReturned'])").message("notifications[].events may name DrainStarted, RebootIssued, UpgradeIssued, NodeReturned, Failed and NotReturned"))]
    pub events: Vec<String>,
    /// The message's text, with `{event}`, `{node}`, `{kind}`, `{name}`
    /// (the object's), `{phase}`, `{reason}`, `{message}`, `{version}` and
    /// `{text}` (the default sentence) replaced. Default: `{text}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(TEMPLATE_RULE).message("notifications[].template may name only {event}, {node}, {kind}, {name}, {phase}, {reason}, {message}, {version} and {text}"))]
    pub template: Option<String>,
}

fn webhook() -> String {
    "Webhook".into()
}

/// A key of a Secret in nodekeeper's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKey {
    /// The Secret's name.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// The key (default `url`).
    #[serde(default = "url_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn url_key() -> String {
    "url".into()
}

/// How an object's notifications fared (this cluster role's deliveries).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationStatus {
    /// Notifications delivered (answered 2xx).
    #[serde(default)]
    pub delivered: i64,
    /// Notifications given up on after their retries.
    #[serde(default)]
    pub failed: i64,
    /// Every node entry that entered its phase at or before this time has
    /// been notified (or given up on): a new leader sends only what is
    /// later, so nothing is sent twice and a hand-over loses nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The last failure, one line: which Secret, which event, why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_the_api_servers_subdomains() {
        for ok in [
            "worker-1",
            "ip-10-0-0-1.ec2.internal",
            "a",
            &"x".repeat(253),
        ] {
            assert!(is_node_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Worker",
            "-a",
            "a-",
            "a..b",
            "a_b",
            " a",
            &"x".repeat(254),
        ] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn escalations_parse_their_names_only() {
        for e in [Escalation::Wait, Escalation::Force, Escalation::Skip] {
            assert_eq!(Escalation::parse(e.as_str()), Some(e));
        }
        assert_eq!(Escalation::parse("force"), None);
    }
}
