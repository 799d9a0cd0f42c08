//! The kinds replacement keeps besides NodeVersions: JoiningNodes (their
//! components stamped on their node) and AutoscalingStrategies (their
//! Deployment brought in line, each strategy on its own).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use crate::decide::replace::{self};
use crate::decide::{Effect, Outcome, earliest};
use crate::error::Result;
use crate::service::context::Context;
use crate::service::executor::{self, After};
use crate::service::failing::Subject;
use crate::service::watch::typed;

use super::*;

/// JoiningNodes for the nodes this role sees.
pub(super) async fn joining(
    ctx: &Context,
    r: &Replace,
    now: Timestamp,
    expect: &mut Expect,
    wake: &mut Option<Duration>,
) -> Result<bool> {
    let all: Vec<Arc<JoiningNode>> = typed(&r.stores.joining);
    // A scoped role leaves other nodes' JoiningNodes (and their deadlines)
    // to the role that sees them.
    let mine: Vec<Arc<JoiningNode>> = all
        .into_iter()
        .filter(|j| {
            !matches!(
                ctx.scope,
                crate::service::roles::Scope::AllNodes { selector: Some(_) }
            ) || j
                .spec
                .name
                .as_deref()
                .is_some_and(|n| ctx.node(n).is_some())
        })
        .collect();
    let (effects, w) = replace::lifecycle_joining(&mine, &|n| ctx.node(n), now);
    *wake = earliest(*wake, w);
    let acted = !effects.is_empty();
    let plan = crate::decide::Plan::steps(effects);
    executor::execute(ctx, "replace", plan, |e, outcome| {
        if let (Effect::PatchObject { name, .. }, Outcome::ObjectWritten { .. }) = (e, outcome) {
            log::info!("JoiningNode {name}: had no deadline; given one (48 h from its creation)");
            expect.written_by(outcome);
        }
        if let Effect::DeleteObject { kind, name, .. } = e {
            log::info!(
                "JoiningNode {name}: components stamped on its node (or its deadline passed); deleted"
            );
            expect.gone.push((Some(*kind), name.clone()));
        }
        After::Go
    })
    .await?;
    Ok(acted)
}

/// How often a strategy whose Deployment does not exist looks for it.
const MISSING_DEPLOYMENT_LOOK: Duration = Duration::from_secs(300);

/// ScalingGroups whose NodeVersion does not exist: reported on them.
pub(super) async fn groups(
    ctx: &Context,
    r: &Replace,
    now: Timestamp,
    expect: &mut Expect,
) -> Result<bool> {
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    if groups.is_empty() {
        return Ok(false);
    }
    let versions: Vec<String> = r
        .stores
        .versions
        .state()
        .iter()
        .map(|v| v.name_any())
        .collect();
    let effects = replace::unfollowed_groups(&groups, &versions, now);
    let acted = effects
        .iter()
        .any(|e| matches!(e, Effect::WriteObjectStatus { .. }));
    let plan = crate::decide::Plan::steps(effects);
    executor::execute(ctx, "replace", plan, |e, outcome| {
        if let (Effect::WriteObjectStatus { name, .. }, Outcome::ObjectWritten { .. }) =
            (e, outcome)
        {
            log::info!("ScalingGroup {name}: the NodeVersion it names is reported");
            expect.written_by(outcome);
        }
        After::Go
    })
    .await?;
    Ok(acted)
}

/// AutoscalingStrategies: read the Deployment when the strategy or the
/// groups changed since the last look, and bring it in line.
pub(super) async fn strategies(
    ctx: &Context,
    r: &Replace,
    expect: &mut Expect,
    wake: &mut Option<Duration>,
) -> Result<bool> {
    let strategies: Vec<Arc<AutoscalingStrategy>> = typed(&r.stores.strategies);
    if strategies.is_empty() {
        return Ok(false);
    }
    let groups: Vec<Arc<ScalingGroup>> = typed(&r.stores.groups);
    let groups_rv: String = groups
        .iter()
        .map(|g| g.resource_version().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(",");
    let mut acted = false;
    for st in &strategies {
        let seen = format!("{}/{groups_rv}", st.resource_version().unwrap_or_default());
        if let Some((checked, again)) = lock(&r.strategy_checked).get(&st.name_any())
            && *checked == seen
        {
            // A missing Deployment is looked for again now and then (the
            // role does not watch Deployments); otherwise only on change.
            match again {
                Some(t) if Instant::now() >= *t => {}
                Some(t) => {
                    *wake = earliest(*wake, Some(t.saturating_duration_since(Instant::now())));
                    continue;
                }
                None => continue,
            }
        }
        // Each strategy on its own: one whose Deployment cannot be read
        // (a bad name, a failed GET) is reported on it and backed off.
        let (groups, expect, did) = (&groups, &mut *expect, &mut acted);
        let subject = Subject::typed(st.as_ref());
        let retry =
            crate::service::contain::contain_in(ctx, &r.failing, &subject, |_| async move {
                strategy(ctx, r, st, groups, seen, expect, did).await
            })
            .await;
        *wake = earliest(*wake, retry);
    }
    Ok(acted)
}

/// Bring one strategy's Deployment in line (see [`strategies`]).
async fn strategy(
    ctx: &Context,
    r: &Replace,
    st: &AutoscalingStrategy,
    groups: &[Arc<ScalingGroup>],
    seen: String,
    expect: &mut Expect,
    acted: &mut bool,
) -> Result<Option<Duration>> {
    let (ns, name) = (&st.spec.deployment_namespace, &st.spec.deployment_name);
    // Names from a spec reach a URL only once they are names.
    if !crate::api::common::is_dns_label(ns) {
        return Err(crate::error::Error::Invalid(format!(
            "spec.deploymentNamespace {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        )));
    }
    if !crate::api::common::is_node_name(name) {
        return Err(crate::error::Error::Invalid(format!(
            "spec.deploymentName {name:?} is not a Deployment name (a DNS subdomain: lowercase letters, digits, '-' and '.')"
        )));
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.effects.client.clone(), ns, &Kind::Deployment.resource());
    let deployment = api
        .get_opt(name)
        .await
        .map_err(crate::error::Error::kube(format!(
            "reading Deployment {ns}/{name}"
        )))?;
    let value = deployment.map(|d| serde_json::to_value(d).unwrap_or_default());
    let effects = replace::strategy(st, groups, value.as_ref(), Timestamp::now());
    if effects.is_empty() {
        let again = value
            .is_none()
            .then(|| Instant::now() + MISSING_DEPLOYMENT_LOOK);
        lock(&r.strategy_checked).insert(st.name_any(), (seen, again));
        return Ok(again.map(|_| MISSING_DEPLOYMENT_LOOK));
    }
    for e in &effects {
        if let Effect::PatchObject { name, .. } = e {
            log::info!(
                "AutoscalingStrategy {}: Deployment {name} to {} replica(s)",
                st.name_any(),
                if st.spec.enabled { 1 } else { 0 }
            );
        }
    }
    let plan = crate::decide::Plan::steps(effects);
    executor::execute(ctx, "replace", plan, |e, outcome| {
        if matches!(e, Effect::WriteObjectStatus { .. }) {
            expect.written_by(outcome);
        }
        After::Go
    })
    .await?;
    *acted = true;
    Ok(None)
}
