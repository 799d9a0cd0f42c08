//! The background answers a rollout's gates read (Prometheus's alerts, the
//! health gate's workloads, whether the blocking-pod gates' pods are
//! listed), gathered for one RebootPolicy or UpgradePlan pass, with when
//! to look again. Both features read them the same way; this is that way.

use std::time::Duration;

use super::context::Context;
use crate::api::common::Gates;
use crate::decide::disrupt::Alerts;
use crate::decide::earliest;
use crate::decide::health::Health;

/// What an object's gates see right now.
pub struct GateAnswers {
    /// Prometheus's last answer for the gate's URL, if it has one.
    pub alerts: Option<Alerts>,
    /// The health gate's workloads, asked only while the object holds a
    /// node (nothing to wait for otherwise).
    pub health: Option<Health>,
    /// A blocking-pod gate whose pods are not listed yet.
    pub unlisted: Option<String>,
    /// When to look again: alerts and workloads change without an event
    /// that wakes the pass.
    pub again: Option<Duration>,
}

/// The answers `gates` read, for an object that `holding` a node or not.
pub fn answers(ctx: &Context, gates: &Gates, holding: bool) -> GateAnswers {
    let prometheus = gates.prometheus.as_ref();
    let (alerts, again) = prometheus.map(|g| ctx.alerts.get(&g.url)).unzip();
    let gate = gates.health.as_ref();
    let (health, again_health) = ctx.health.when_holding(&ctx.effects.client, gate, holding);
    GateAnswers {
        alerts,
        health,
        unlisted: ctx.pods.first_unlisted(&gates.blocking_pods),
        again: earliest(again, again_health),
    }
}
