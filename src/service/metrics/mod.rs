//! The agent's observability: Prometheus text metrics on `/metrics`,
//! liveness on `/healthz` and readiness (every watch has listed once) on
//! `/readyz`, served on `run --metrics-address` (loopback by default).
//!
//! This module holds what is counted (process-global atomics, so the code
//! that counts needs no handle) and the liveness rule; `exposition.rs`
//! writes the text, `server.rs` answers HTTP.

mod exposition;
mod server;

pub use server::serve;

/// The stores `/metrics` reads its gauges from.
type Stores = (
    Store<crate::api::nodemaintenance::NodeMaintenance>,
    Store<crate::api::reboot::RebootPolicy>,
);

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kube::runtime::reflector::Store;

use crate::decide::drain::{Fate, Removal};
use crate::error::{Error, Result};

/// The default address: loopback, so a host-network agent exposes nothing on
/// the node's network unless asked to.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9477";

/// Counters, monotonic since start-up.
pub struct Counters {
    pub reconciles: AtomicU64,
    pub reconcile_errors: AtomicU64,
    pub evictions: AtomicU64,
    pub deletions: AtomicU64,
    /// Evictions the API refused (PDB 429s and other errors).
    pub refusals: AtomicU64,
    /// Passes of the cluster role's scheduler (`cluster.rs`).
    pub cluster_passes: AtomicU64,
    /// Errors by [`Error::metric_label`], in [`ERROR_LABELS`] order.
    pub errors: [AtomicU64; 8],
}

pub static COUNTERS: Counters = Counters {
    reconciles: AtomicU64::new(0),
    reconcile_errors: AtomicU64::new(0),
    evictions: AtomicU64::new(0),
    deletions: AtomicU64::new(0),
    refusals: AtomicU64::new(0),
    cluster_passes: AtomicU64::new(0),
    errors: [const { AtomicU64::new(0) }; 8],
};

/// Every [`Error::metric_label`], in the order [`Counters::errors`] counts them.
pub const ERROR_LABELS: [&str; 8] = [
    "no_credentials",
    "unreachable",
    "node_not_found",
    "crds_missing",
    "kube",
    "io",
    "invalid",
    "lost_lease",
];

/// Count one error by its label.
pub fn count_error(err: &Error) {
    let label = err.metric_label();
    if let Some(i) = ERROR_LABELS.iter().position(|l| *l == label) {
        inc(&COUNTERS.errors[i]);
    }
}

/// Reboot counters (cluster role), monotonic since start-up.
pub struct Reboots {
    pub admitted: AtomicU64,
    pub verified: AtomicU64,
    pub failed: AtomicU64,
    pub not_returned: AtomicU64,
    /// Admissions newly refused, per reason in [`REFUSAL_REASONS`] order.
    pub refused: [AtomicU64; 9],
    /// Reboot durations (admission to verified): per bucket of
    /// [`DURATION_BUCKETS`] (not cumulative), then +Inf; and their sum in ms.
    pub duration_buckets: [AtomicU64; 9],
    pub duration_sum_ms: AtomicU64,
}

pub static REBOOTS: Reboots = Reboots {
    admitted: AtomicU64::new(0),
    verified: AtomicU64::new(0),
    failed: AtomicU64::new(0),
    not_returned: AtomicU64::new(0),
    refused: [const { AtomicU64::new(0) }; 9],
    duration_buckets: [const { AtomicU64::new(0) }; 9],
    duration_sum_ms: AtomicU64::new(0),
};

/// Notifications (cluster role): counts monotonic since start-up, and
/// the delivery queues (one task each) alive now.
pub struct Notifications {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
    pub queues: AtomicU64,
}

pub static NOTIFICATIONS: Notifications = Notifications {
    delivered: AtomicU64::new(0),
    failed: AtomicU64::new(0),
    queues: AtomicU64::new(0),
};

/// The reasons an admission waits, as the status reports them.
pub const REFUSAL_REASONS: [&str; 9] = [
    "Budget",
    "Window",
    "BlockingPod",
    "NotReady",
    "Paused",
    "InMaintenance",
    "Gate",
    "InvalidSpec",
    "Unknown",
];
/// What a duration histogram times.
#[derive(Clone, Copy)]
pub enum Timed {
    /// One node reconcile (the node controller).
    NodeReconcile = 0,
    /// One pass of the cluster role's scheduler.
    ClusterPass = 1,
    /// One replacement pass.
    ReplacementPass = 2,
}

const TIMED: [&str; 3] = ["node_reconcile", "cluster_pass", "replacement_pass"];
/// Upper bounds (seconds) of the work-duration histogram.
const WORK_BUCKETS: [f64; 8] = [0.005, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0];
/// Per [`Timed`]: counts per bucket of [`WORK_BUCKETS`] (not cumulative),
/// then +Inf; and the sum in microseconds.
static WORK: [[AtomicU64; 9]; 3] = [const { [const { AtomicU64::new(0) }; 9] }; 3];
static WORK_SUM_US: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Record how long one piece of work took.
pub fn observe_work(what: Timed, took: Duration) {
    let secs = took.as_secs_f64();
    let i = WORK_BUCKETS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(WORK_BUCKETS.len());
    inc(&WORK[what as usize][i]);
    WORK_SUM_US[what as usize].fetch_add(took.as_micros() as u64, Ordering::Relaxed);
}

/// Upper bounds (seconds) of the reboot-duration histogram.
pub const DURATION_BUCKETS: [f64; 8] = [30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0];

/// Count an admission newly refused for `reason`.
pub fn refused(reason: &str) {
    let i = REFUSAL_REASONS
        .iter()
        .position(|r| *r == reason)
        .unwrap_or(REFUSAL_REASONS.len() - 1);
    inc(&REBOOTS.refused[i]);
}

/// Record one verified reboot's duration.
pub fn observe_reboot_seconds(secs: f64) {
    let i = DURATION_BUCKETS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(DURATION_BUCKETS.len());
    inc(&REBOOTS.duration_buckets[i]);
    REBOOTS
        .duration_sum_ms
        .fetch_add((secs * 1000.0) as u64, Ordering::Relaxed);
}

static READY: AtomicBool = AtomicBool::new(false);

/// Whether this process exports the cluster-wide gauges (NodeMaintenances
/// by phase, per-policy reboot counts): only the leading cluster role does,
/// so a `sum()` over every node agent and standby is not N times too high.
static CLUSTER_GAUGES: AtomicBool = AtomicBool::new(false);

/// Export the cluster-wide gauges from now on (the cluster role, once it
/// leads).
pub fn export_cluster_gauges() {
    CLUSTER_GAUGES.store(true, Ordering::SeqCst);
}

/// Which role this process runs, for the labels and gauges that depend on
/// it: the node role's node (its per-node gauges carry `node`, so an alert
/// names the node without relabelling), or the cluster role (it reports
/// `nodekeeper_leader`).
static ROLE: std::sync::OnceLock<Role> = std::sync::OnceLock::new();

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Node(String),
    Cluster,
}

/// Set once at start-up.
pub fn set_role(role: Role) {
    let _ = ROLE.set(role);
}

/// The loop reconciles its anchor node at least this often, busy or not.
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// `/healthz` fails once the loop has made no progress for this long: three
/// missed heartbeats, so a slow API server is not mistaken for a wedge.
pub const WEDGED_AFTER: Duration = Duration::from_secs(90);

/// Milliseconds since [`EPOCH`] at the loop's last progress; 0 until the
/// loop starts (a standby replica waiting for leadership is healthy).
static LAST_PROGRESS_MS: AtomicU64 = AtomicU64::new(0);
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn now_ms() -> u64 {
    // +1 so that the first progress is never the "not started" 0.
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

/// The loop made progress (a reconcile finished, or the loop started).
pub fn progress() {
    LAST_PROGRESS_MS.store(now_ms(), Ordering::SeqCst);
}

/// A scheduler task's pass in progress, for the watchdog: dropped when the
/// pass ends. Node reconciles (a 30 s heartbeat) kept `/healthz` green
/// while the cluster scheduler or the replacement task was wedged.
pub struct Busy(&'static str);

static BUSY: std::sync::Mutex<Vec<(&'static str, u64, Duration)>> =
    std::sync::Mutex::new(Vec::new());

fn busy() -> std::sync::MutexGuard<'static, Vec<(&'static str, u64, Duration)>> {
    BUSY.lock().unwrap_or_else(|p| p.into_inner())
}

impl Busy {
    /// `task` starts a pass that may take up to `limit`.
    pub fn start(task: &'static str, limit: Duration) -> Busy {
        let mut b = busy();
        b.retain(|(t, ..)| *t != task);
        b.push((task, now_ms(), limit));
        Busy(task)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        busy().retain(|(t, ..)| *t != self.0);
    }
}

/// The first task whose pass has run past its limit, said in one line.
pub fn wedged_task(now_ms: u64) -> Option<String> {
    busy().iter().find_map(|(task, since, limit)| {
        let ran = Duration::from_millis(now_ms.saturating_sub(*since));
        (ran > *limit).then(|| {
            format!(
                "the {task} has been in one pass for {} s (limit {} s)\n",
                ran.as_secs(),
                limit.as_secs()
            )
        })
    })
}

/// The watchdog's verdict: `Err` says for how long the loop has been stuck.
pub fn liveness(now_ms: u64, last_progress_ms: u64) -> std::result::Result<(), String> {
    if last_progress_ms == 0 {
        return Ok(());
    }
    let idle = Duration::from_millis(now_ms.saturating_sub(last_progress_ms));
    if idle > WEDGED_AFTER {
        Err(format!(
            "the reconcile loop has made no progress for {} s (limit {} s)\n",
            idle.as_secs(),
            WEDGED_AFTER.as_secs()
        ))
    } else {
        Ok(())
    }
}

/// Count one occurrence.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Set a gauge.
pub fn set(g: &AtomicU64, value: usize) {
    g.store(value as u64, Ordering::Relaxed);
}

/// Count a drain's answers: accepted evictions and deletions, refusals.
pub fn count_removals(pods: &[(std::sync::Arc<crate::api::pod::Pod>, Fate)], removals: &[Removal]) {
    for ((_, fate), removal) in pods.iter().zip(removals) {
        match (fate, removal) {
            (Fate::Delete(_), Removal::Accepted) => inc(&COUNTERS.deletions),
            (_, Removal::Accepted) => inc(&COUNTERS.evictions),
            (_, Removal::Refused(_)) => inc(&COUNTERS.refusals),
            (_, Removal::Gone) => {}
        }
    }
}

/// The stores whose sizes `/metrics` reports (`nodekeeper_watched_objects`):
/// what this process holds in memory, which is most of its footprint in a
/// big cluster. Registered once the watches are built.
pub struct Watched {
    pub nodes: Store<crate::api::node::Node>,
    pub pods: std::sync::Arc<crate::service::pod_watches::PodWatches>,
    pub jobs: Store<kube::api::DynamicObject>,
}

static WATCHED: std::sync::OnceLock<Watched> = std::sync::OnceLock::new();

/// Report these stores' sizes from now on.
pub fn watch_sizes(stores: Watched) {
    let _ = WATCHED.set(stores);
}

/// Called once every store has its first full list.
pub fn set_ready() {
    READY.store(true, Ordering::SeqCst);
}

/// Parse `--metrics-address`: `HOST:PORT`, `:PORT` (all interfaces) or
/// `off`.
pub fn parse_address(s: &str) -> Result<Option<SocketAddr>> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse().map(Some).map_err(|_| {
        Error::Invalid(format!(
            "--metrics-address {s:?} is not HOST:PORT, :PORT or off (e.g. 127.0.0.1:9477)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::exposition::render;
    use super::server::route;
    use super::*;
    use crate::api::nodemaintenance::NodeMaintenance;
    use crate::api::reboot::RebootPolicy;

    #[test]
    fn addresses_parse_with_and_without_host() {
        assert_eq!(
            parse_address(":9477").ok().flatten(),
            "0.0.0.0:9477".parse().ok()
        );
        assert_eq!(
            parse_address("127.0.0.1:0").ok().flatten(),
            "127.0.0.1:0".parse().ok()
        );
        assert!(matches!(parse_address("off"), Ok(None)));
        let err = parse_address("localhost").err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("HOST:PORT") && e.contains("localhost")),
            "{err:?}"
        );
    }

    #[test]
    fn metrics_render_in_prometheus_text_format() {
        let stores = (
            kube::runtime::reflector::store::<NodeMaintenance>().0,
            kube::runtime::reflector::store::<RebootPolicy>().0,
        );
        observe_reboot_seconds(45.0);
        observe_work(Timed::ClusterPass, Duration::from_millis(30));
        let text = render(&stores);
        assert!(
            !text.contains("nodekeeper_nodemaintenances{"),
            "cluster-wide gauges only once the cluster role leads"
        );
        assert!(text.contains(
            "nodekeeper_work_duration_seconds_bucket{kind=\"cluster_pass\",le=\"0.05\"} 1"
        ));
        assert!(text.contains("nodekeeper_work_duration_seconds_count{kind=\"cluster_pass\"} 1"));
        export_cluster_gauges();
        let text = render(&stores);
        for line in text.lines() {
            assert!(
                line.starts_with("# HELP nodekeeper_")
                    || line.starts_with("# TYPE nodekeeper_")
                    || line.starts_with("nodekeeper_"),
                "{line}"
            );
        }
        assert!(text.contains("nodekeeper_nodemaintenances{phase=\"Running\"} 0"));
        assert!(text.contains("# TYPE nodekeeper_pod_evictions_total counter"));
        assert!(text.contains("nodekeeper_reboot_duration_seconds_bucket{le=\"30\"} 0"));
        assert!(text.contains("nodekeeper_reboot_duration_seconds_bucket{le=\"60\"} 1"));
        assert!(text.contains("nodekeeper_reboot_duration_seconds_bucket{le=\"+Inf\"} 1"));
    }

    #[test]
    fn health_fails_only_when_the_loop_stops_making_progress() {
        assert!(liveness(1_000_000, 0).is_ok(), "not started: healthy");
        {
            let _pass = Busy::start("test task", Duration::from_secs(5));
            let now = now_ms();
            assert_eq!(wedged_task(now), None);
            let late = wedged_task(now + 6_000).unwrap_or_default();
            assert!(
                late.contains("test task") && late.contains("limit 5 s"),
                "{late}"
            );
        }
        assert_eq!(wedged_task(now_ms() + 600_000), None, "ended: not wedged");
        assert!(liveness(100_000, 100_000 - 89_000).is_ok());
        let wedged = liveness(200_000, 200_000 - 91_000);
        assert!(
            wedged
                .as_ref()
                .is_err_and(|e| e.contains("no progress for 91 s")),
            "{wedged:?}"
        );
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        let store = (
            kube::runtime::reflector::store::<NodeMaintenance>().0,
            kube::runtime::reflector::store::<RebootPolicy>().0,
        );
        assert_eq!(route("GET", "/nope", &store).0, "404 Not Found");
        assert_eq!(
            route("POST", "/metrics", &store).0,
            "405 Method Not Allowed"
        );
        assert_eq!(route("GET", "/healthz", &store).0, "200 OK");
    }
}
