//! The health gate's workloads (`gates.health`), listed in the background
//! for the cluster role's passes: a pass reads the last list per gate and
//! never waits for one. Lists are made only while a node of the object
//! holds a slot (its decision may need them), at most every [`EVERY`], each
//! bounded by [`DEADLINE`]: the cost follows disruption, not the cluster's
//! size, and nothing is watched for a gate nobody waits on. A list older
//! than both counts as not known (it holds the slot, never releases it).

use std::time::Duration;

use kube::Client;
use kube::api::ListParams;

use super::background::{Answers, Ask};
use crate::api::common::{HealthGate, Workloads};
use crate::decide::health::{Health, Listed, Workload};

/// How old a list may get before it is made again.
pub const EVERY: Duration = Duration::from_secs(5);
/// How long one round of lists may take.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// The last list per gate (keyed by its workloads' JSON).
#[derive(Default)]
pub struct HealthCache(Answers<Health>);

fn key(gate: &HealthGate) -> String {
    serde_json::to_string(&gate.workloads).unwrap_or_default()
}

impl HealthCache {
    /// The last list for `gate`, and when the pass should look again;
    /// lists anew in the background when it is missing or stale.
    pub fn get(&self, client: &Client, gate: &HealthGate) -> (Health, Duration) {
        let (client, workloads) = (client.clone(), gate.workloads.clone());
        let kept = self.0.get(
            &key(gate),
            || Health::Unknown("not listed yet".into()),
            Ask {
                every: EVERY,
                ask: move || async move {
                    let listed = smol::future::or(list(&client, &workloads), async {
                        crate::runtime::sleep(DEADLINE).await;
                        Err(format!("no answer within {} s", DEADLINE.as_secs()))
                    })
                    .await;
                    listed.map(Health::Listed).unwrap_or_else(|why| {
                        log::warn!("gates.health: {why}");
                        Health::Unknown(why)
                    })
                },
                keep: |kept: &mut Health, new| *kept = new,
                kick: None,
            },
        );
        let answer = match kept.age {
            Some(age) if age > EVERY + DEADLINE => Health::Unknown(format!(
                "listing again (the last list is {} s old)",
                age.as_secs()
            )),
            _ => kept.answer,
        };
        (answer, kept.again)
    }

    /// An object's gate, if it has one and a node of it holds a slot (it
    /// may come back in this pass): the last list and when to look again.
    /// No list is made for anyone else.
    pub fn when_holding(
        &self,
        client: &Client,
        gate: Option<&HealthGate>,
        holding: bool,
    ) -> (Option<Health>, Option<Duration>) {
        gate.filter(|_| holding)
            .map(|g| self.get(client, g))
            .unzip()
    }

    /// Forget gates no object waits on any more.
    pub fn retain(&self, gates: &[&HealthGate]) {
        let keys: Vec<String> = gates.iter().map(|g| key(g)).collect();
        self.0.retain(|k| keys.iter().any(|w| w == k));
    }
}

/// Every Deployment, StatefulSet and DaemonSet the gate selects, listed a
/// page of [`PAGE`] at a time, each page read into the few fields the gate
/// needs before the next is asked for: a gate selecting 3 000 Deployments
/// (a 15.8 MB list with managedFields and pod templates) lifted the
/// cluster role from 7.5 MiB to a 163 MiB peak when listed whole, in a
/// pod whose limit is 64 MiB (where-features-meet.md, finding 10).
async fn list(client: &Client, workloads: &[Workloads]) -> Result<Vec<Workload>, String> {
    let mut out: Vec<Workload> = Vec::new();
    for w in workloads {
        // The decision refuses a selector or namespace the API cannot take
        // (`disrupt::check_pod_selectors`); checked again before any URL.
        let selector = kube::core::Selector::try_from(w.selector.clone())
            .map_err(|e| format!("a selector the API cannot take: {e}"))?
            .to_string();
        let ns = w.namespace.as_deref().filter(|n| !n.is_empty());
        if ns.is_some_and(|n| !crate::api::common::is_dns_label(n)) {
            return Err(format!("{ns:?} is not a namespace name"));
        }
        let where_ = ns.map(|n| format!(" in {n}")).unwrap_or_default();
        for (kind, plural) in [
            ("Deployment", "deployments"),
            ("StatefulSet", "statefulsets"),
            ("DaemonSet", "daemonsets"),
        ] {
            let path = match ns {
                Some(ns) => format!("/apis/apps/v1/namespaces/{ns}/{plural}"),
                None => format!("/apis/apps/v1/{plural}"),
            };
            let mut lp = ListParams::default().labels(&selector).limit(PAGE);
            loop {
                let request = kube::core::Request::new(&path)
                    .list(&lp)
                    .map_err(|e| format!("listing {kind}s {selector}{where_}: {e}"))?;
                let page: Page = client
                    .request(request)
                    .await
                    .map_err(|e| format!("listing {kind}s {selector}{where_}: {e}"))?;
                out.extend(page.items.iter().map(|o| Workload::read(kind, o)));
                match page.metadata.continue_ {
                    Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
                    _ => break,
                }
            }
        }
    }
    out.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    out.dedup_by(|a, b| (a.kind, &a.namespace, &a.name) == (b.kind, &b.namespace, &b.name));
    Ok(out)
}

/// Objects per list page.
const PAGE: u32 = 100;

/// One page of a workload list, each object read as it is parsed into
/// the few fields the gate judges by ([`Listed`]); pages are asked for one
/// after the other, so at most one page's text is held at a time.
#[derive(serde::Deserialize)]
struct Page {
    #[serde(default)]
    items: Vec<Listed>,
    #[serde(default)]
    metadata: PageMeta,
}

#[derive(serde::Deserialize, Default)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}
