//! The exposition text of `/metrics`: every counter, histogram and gauge
//! in Prometheus's text format. Gauges come from the stores, so they are
//! what this process sees, not what it remembers.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use kube::runtime::reflector::Store;

use super::*;
use crate::api::nodemaintenance::NodeMaintenance;
use crate::api::reboot::RebootPolicy;

/// The cluster-wide gauges (see [`CLUSTER_GAUGES`]).
fn cluster_gauges(
    metric: &mut impl FnMut(&str, &str, &str, &[(String, u64)]),
    nms: &Store<NodeMaintenance>,
    policies: &Store<RebootPolicy>,
) {
    let mut phases: Vec<(String, u64)> = ["Running", "Succeeded", "Failed"]
        .iter()
        .map(|p| (format!("{{phase=\"{p}\"}}"), 0))
        .collect();
    for nm in nms.state() {
        let phase = nm
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| format!("{{phase=\"{}\"}}", p.as_str()));
        if let Some(slot) = phase.and_then(|p| phases.iter_mut().find(|(l, _)| *l == p)) {
            slot.1 += 1;
        }
    }
    metric(
        "nodekeeper_nodemaintenances",
        "gauge",
        "NodeMaintenance objects this agent sees, by phase.",
        &phases,
    );
    let not_returned: Vec<(String, u64)> = policies
        .state()
        .iter()
        .flat_map(|p| {
            let policy = kube::ResourceExt::name_any(p.as_ref());
            p.status
                .iter()
                .flat_map(|s| s.nodes.iter())
                .filter(|e| e.reason.as_deref() == Some(crate::decide::reboot::NOT_RETURNED))
                .map(move |e| (format!("{{policy=\"{policy}\",node=\"{}\"}}", e.name), 1))
                .collect::<Vec<_>>()
        })
        .collect();
    metric(
        "nodekeeper_reboot_not_returned_nodes",
        "gauge",
        "1 per rebooted node past its return deadline (returnTimeoutSeconds), per RebootPolicy; gone once it is back.",
        &not_returned,
    );
    let per_policy = |f: fn(&crate::api::reboot::RebootPolicyStatus) -> i32| -> Vec<(String, u64)> {
        policies
            .state()
            .iter()
            .map(|p| {
                let v = p.status.as_ref().map_or(0, f).max(0) as u64;
                (
                    format!("{{policy=\"{}\"}}", kube::ResourceExt::name_any(p.as_ref())),
                    v,
                )
            })
            .collect()
    };
    metric(
        "nodekeeper_reboot_needed_nodes",
        "gauge",
        "Nodes that need a reboot and are not admitted yet, per RebootPolicy.",
        &per_policy(|s| s.needing),
    );
    metric(
        "nodekeeper_rebooting_nodes",
        "gauge",
        "Nodes admitted for a reboot and not yet settled, per RebootPolicy.",
        &per_policy(|s| s.rebooting),
    );
}

/// The exposition text. Gauges come from the stores, so they are what this
/// agent sees, not what it remembers.
pub(super) fn render((nms, policies): &Stores) -> String {
    let mut out = String::with_capacity(2048);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    process_metrics(&mut metric);
    traffic_metrics(&mut metric);
    watched_gauges(&mut metric, nms, policies);
    if CLUSTER_GAUGES.load(Ordering::SeqCst) {
        cluster_gauges(&mut metric, nms, policies);
    }
    reboot_metrics(&mut metric);
    histograms(&mut out);
    out
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Which nodekeeper runs, whether it is ready, and how much work it did.
fn process_metrics(metric: &mut impl FnMut(&str, &str, &str, &[(String, u64)])) {
    let c = &COUNTERS;
    metric(
        "nodekeeper_build_info",
        "gauge",
        "Always 1; the version label says which nodekeeper runs.",
        &[(format!("{{version=\"{}\"}}", env!("CARGO_PKG_VERSION")), 1)],
    );
    let node_label = match ROLE.get() {
        Some(Role::Node(n)) => format!("{{node=\"{n}\"}}"),
        _ => String::new(),
    };
    metric(
        "nodekeeper_ready",
        "gauge",
        "1 once every watch has listed once (a node agent's carries its node).",
        &[(node_label, u64::from(READY.load(Ordering::SeqCst)))],
    );
    metric(
        "nodekeeper_reconciles_total",
        "counter",
        "Node reconciles run.",
        &[(String::new(), load(&c.reconciles))],
    );
    metric(
        "nodekeeper_reconcile_errors_total",
        "counter",
        "Node reconciles that ended in an error (retried).",
        &[(String::new(), load(&c.reconcile_errors))],
    );
    metric(
        "nodekeeper_cluster_passes_total",
        "counter",
        "Passes of the cluster role's scheduler over every RebootPolicy, UpgradePlan and mutex object.",
        &[(String::new(), load(&c.cluster_passes))],
    );
    let errors: Vec<(String, u64)> = ERROR_LABELS
        .iter()
        .zip(&c.errors)
        .map(|(l, n)| (format!("{{kind=\"{l}\"}}"), load(n)))
        .collect();
    metric(
        "nodekeeper_errors_total",
        "counter",
        "Errors of node reconciles and of per-object decisions, by kind.",
        &errors,
    );
}

/// What it asked of others and did to pods: API requests, Events,
/// provider calls, evictions.
fn traffic_metrics(metric: &mut impl FnMut(&str, &str, &str, &[(String, u64)])) {
    let c = &COUNTERS;
    let requests: Vec<(String, u64)> = crate::service::requests::REQUESTS
        .snapshot()
        .into_iter()
        .map(|((verb, resource, code), n)| {
            (
                format!("{{verb=\"{verb}\",resource=\"{resource}\",code=\"{code}\"}}"),
                n,
            )
        })
        .collect();
    metric(
        "nodekeeper_api_requests_total",
        "counter",
        "Requests to the API server, by verb, resource and answer (code 0: no answer).",
        &requests,
    );
    let events: Vec<(String, u64)> = crate::effects::events::PUBLISHED
        .snapshot()
        .into_iter()
        .map(|((kind, reason, type_), n)| {
            (
                format!("{{kind=\"{kind}\",reason=\"{reason}\",type=\"{type_}\"}}"),
                n,
            )
        })
        .collect();
    metric(
        "nodekeeper_events_total",
        "counter",
        "Events written, by the kind they regard, reason and type: every feature's milestones and failures (RebootVerified, UpgradeFailed, JoinTimeout, ...).",
        &events,
    );
    let calls: Vec<(String, u64)> = crate::effects::provider::CALLS
        .snapshot()
        .into_iter()
        .map(|((verb, result), n)| (format!("{{verb=\"{verb}\",result=\"{result}\"}}"), n))
        .collect();
    metric(
        "nodekeeper_provider_calls_total",
        "counter",
        "Calls of the provider plugin (node replacement), by verb and result.",
        &calls,
    );
    metric(
        "nodekeeper_pod_evictions_total",
        "counter",
        "Evictions the API accepted.",
        &[(String::new(), load(&c.evictions))],
    );
    metric(
        "nodekeeper_pod_deletions_total",
        "counter",
        "Unmanaged or finished pods deleted by a drain.",
        &[(String::new(), load(&c.deletions))],
    );
    metric(
        "nodekeeper_pod_eviction_refusals_total",
        "counter",
        "Evictions or deletions the API refused (mostly PodDisruptionBudgets); retried.",
        &[(String::new(), load(&c.refusals))],
    );
}

/// What its watch caches hold, whether it leads, and drains past their
/// deadline.
fn watched_gauges(
    metric: &mut impl FnMut(&str, &str, &str, &[(String, u64)]),
    nms: &Store<NodeMaintenance>,
    policies: &Store<RebootPolicy>,
) {
    let mut watched = vec![
        ("{kind=\"nodemaintenances\"}".to_string(), nms.len() as u64),
        (
            "{kind=\"rebootpolicies\"}".to_string(),
            policies.len() as u64,
        ),
    ];
    if let Some(w) = WATCHED.get() {
        watched.extend([
            ("{kind=\"nodes\"}".to_string(), w.nodes.len() as u64),
            ("{kind=\"pods\"}".to_string(), w.pods.held() as u64),
            ("{kind=\"jobs\"}".to_string(), w.jobs.len() as u64),
        ]);
    }
    metric(
        "nodekeeper_watched_objects",
        "gauge",
        "Objects held in this process's watch caches, by kind (most of its memory in a big cluster).",
        &watched,
    );
    let role = ROLE.get();
    if role == Some(&Role::Cluster) {
        metric(
            "nodekeeper_leader",
            "gauge",
            "1 while this cluster-role replica holds the leader Lease, else 0.",
            &[(
                String::new(),
                u64::from(CLUSTER_GAUGES.load(Ordering::SeqCst)),
            )],
        );
    }
    // A drain past its deadline: each maintenance by its node, from the
    // agent of that node or, for every node, from the leader (alerts take
    // the max over both).
    let own = match role {
        Some(Role::Node(n)) => Some(n.as_str()),
        _ => None,
    };
    if own.is_some() || CLUSTER_GAUGES.load(Ordering::SeqCst) {
        let overdue: Vec<(String, u64)> = nms
            .state()
            .iter()
            .filter(|m| own.is_none_or(|n| m.spec.node_name == n))
            .filter(|m| m.phase() == Some(crate::api::nodemaintenance::Phase::Running))
            .filter(|m| {
                m.condition("Drained")
                    .is_some_and(|c| c.reason == crate::decide::maintenance::REASON_DRAIN_TIMEOUT)
            })
            .map(|m| {
                (
                    format!(
                        "{{node=\"{}\",nodemaintenance=\"{}\"}}",
                        m.spec.node_name,
                        kube::ResourceExt::name_any(m.as_ref())
                    ),
                    1,
                )
            })
            .collect();
        metric(
            "nodekeeper_maintenance_drain_overdue",
            "gauge",
            "1 per NodeMaintenance still draining past its drain deadline, by node.",
            &overdue,
        );
    }
}

/// Reboots admitted, verified, failed and refused; notifications.
fn reboot_metrics(metric: &mut impl FnMut(&str, &str, &str, &[(String, u64)])) {
    let r = &REBOOTS;
    for (name, help, c) in [
        (
            "nodekeeper_reboot_admissions_total",
            "Nodes admitted for a reboot.",
            &r.admitted,
        ),
        (
            "nodekeeper_reboots_verified_total",
            "Reboots verified (new boot ID, Ready).",
            &r.verified,
        ),
        (
            "nodekeeper_reboots_failed_total",
            "Admitted nodes given back without a reboot (drain skipped, command failed).",
            &r.failed,
        ),
        (
            "nodekeeper_reboot_not_returned_total",
            "Rebooted nodes that missed their return deadline.",
            &r.not_returned,
        ),
    ] {
        metric(name, "counter", help, &[(String::new(), load(c))]);
    }
    let n = &NOTIFICATIONS;
    metric(
        "nodekeeper_notifications_total",
        "counter",
        "Notifications of RebootPolicies and UpgradePlans: delivered, or failed after their retries.",
        &[
            ("{result=\"delivered\"}".to_string(), load(&n.delivered)),
            ("{result=\"failed\"}".to_string(), load(&n.failed)),
        ],
    );
    metric(
        "nodekeeper_notification_queues",
        "gauge",
        "Delivery queues (one task each) for the notification targets live objects name now.",
        &[(String::new(), load(&n.queues))],
    );
    let refused: Vec<(String, u64)> = REFUSAL_REASONS
        .iter()
        .zip(&r.refused)
        .map(|(reason, c)| (format!("{{reason=\"{reason}\"}}"), load(c)))
        .collect();
    metric(
        "nodekeeper_reboot_admissions_refused_total",
        "counter",
        "Times a node needing a reboot started waiting, by reason.",
        &refused,
    );
}

/// The two histograms: reboot durations and the work's durations.
fn histograms(out: &mut String) {
    let r = &REBOOTS;
    let mut cumulative = 0;
    let mut buckets: Vec<(String, u64)> = Vec::new();
    for (i, c) in r.duration_buckets.iter().enumerate() {
        cumulative += load(c);
        let le = DURATION_BUCKETS
            .get(i)
            .map_or("+Inf".to_string(), |b| b.to_string());
        buckets.push((format!("_bucket{{le=\"{le}\"}}"), cumulative));
    }
    buckets.push(("_sum".into(), load(&r.duration_sum_ms) / 1000));
    buckets.push(("_count".into(), cumulative));
    let _ = writeln!(
        out,
        "# HELP nodekeeper_reboot_duration_seconds Admission to verified reboot.\n# TYPE nodekeeper_reboot_duration_seconds histogram"
    );
    for (suffix, v) in buckets {
        let _ = writeln!(out, "nodekeeper_reboot_duration_seconds{suffix} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP nodekeeper_work_duration_seconds How long node reconciles, cluster passes and replacement passes take.\n# TYPE nodekeeper_work_duration_seconds histogram"
    );
    for (k, name) in TIMED.iter().enumerate() {
        let mut cumulative = 0;
        for (i, c) in WORK[k].iter().enumerate() {
            cumulative += load(c);
            let le = WORK_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "nodekeeper_work_duration_seconds_bucket{{kind=\"{name}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = load(&WORK_SUM_US[k]) as f64 / 1e6;
        let _ = writeln!(
            out,
            "nodekeeper_work_duration_seconds_sum{{kind=\"{name}\"}} {sum}\nnodekeeper_work_duration_seconds_count{{kind=\"{name}\"}} {cumulative}"
        );
    }
}
