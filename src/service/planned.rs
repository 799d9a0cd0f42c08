//! The cluster role's `MaintenancePlanned` pass (KEP-5683): after the
//! features decided, each node says whether one of them waits to disrupt
//! it (`decide::node_conditions::planned`). Runs last in the scheduler's
//! pass, on the records the features just wrote; a record written in this
//! pass shows in the next one (the write kicks it).
//!
//! Best effort, as the other lifecycle conditions: a refused write is
//! logged and that node is left alone for `REFUSED_PAUSE`; no feature
//! waits for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use super::context::Context;
use super::watch::typed;
use crate::api::constellation::NodeVersion;
use crate::decide::node_conditions::planned;
use crate::decide::{Effect, Outcome};
use crate::runtime::lock;

/// How long a node whose write was refused is left alone.
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// Publish what the features plan. `versions`: the NodeVersions, where
/// replacement runs. Returns when a paused node may be tried again.
pub async fn pass(ctx: &Context, versions: Option<&Store<DynamicObject>>) -> Option<Duration> {
    let versions: Vec<Arc<NodeVersion>> = versions.map(typed).unwrap_or_default();
    let wanted = planned::planned(&ctx.policies(), &ctx.plans(), &versions);
    let started = Instant::now();
    let effects = {
        let mut refused = lock(&ctx.planned_refused);
        refused.retain(|_, until| *until > started);
        let skip = |n: &str| refused.contains_key(n);
        planned::effects(&ctx.all_nodes(), &wanted, &skip, Timestamp::now())
    };
    // Each node's write is a plan of its own: one refused never holds up
    // the others. The executor reports a refused conditions write as
    // `StatusRefused` (and logs it).
    for effect in effects {
        let Effect::PatchNodeStatus { node, .. } = &effect else {
            continue;
        };
        let node = node.clone();
        let who = format!("MaintenancePlanned of node {node}");
        let plan = crate::decide::Plan::steps(vec![effect]);
        let done = super::executor::execute(ctx, &who, plan, |_, outcome| {
            if matches!(outcome, Outcome::StatusRefused) {
                lock(&ctx.planned_refused).insert(node.clone(), Instant::now() + REFUSED_PAUSE);
            }
            super::executor::After::Go
        })
        .await;
        if let Err(e) = done {
            log::warn!("{who}: {e}; tried again in {} s", REFUSED_PAUSE.as_secs());
            lock(&ctx.planned_refused).insert(node, Instant::now() + REFUSED_PAUSE);
        }
    }
    let refused = lock(&ctx.planned_refused);
    refused
        .values()
        .min()
        .map(|until| until.saturating_duration_since(Instant::now()))
}
