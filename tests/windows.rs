//! Calendar windows on the real control plane and the real clock: two
//! RebootPolicies whose scheduled windows open at the same instant, named
//! in two zones with odd offsets (Asia/Kathmandu, +05:45; America/St_Johns,
//! -03:30), so a zone read wrongly opens hours off. Before the opening each
//! node waits, its status naming the instant; the reboot's NodeMaintenance
//! is created at or after it, as an independent watch of NodeMaintenances
//! records. Daylight saving transitions are the unit tests' (a real clock
//! does not pass one on demand).

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use nodekeeper::api::reboot::{RebootPhase, RebootPolicy, RebootPolicySpec};
use nodekeeper::runtime::Latch;
use serde_json::json;
use smol::stream::StreamExt;
use support::machines::*;
use support::{GROUP_LABEL, TestEnv, block_on, install_crds, wait_for};

/// A policy for node `node` alone whose window opens at `at` (a whole
/// minute) for one minute, written as a daily schedule in `zone`.
async fn policy(env: &TestEnv, fleet: &Fleet, node: &str, zone: &str, at: Timestamp) -> String {
    let local = at.to_zoned(TimeZone::get(zone).expect("a zone"));
    let schedule = format!("{} {} * * *", local.minute(), local.hour());
    let name = format!("{}-{}", env.id, node.rsplit('-').next().unwrap_or(node));
    let spec: RebootPolicySpec = serde_json::from_value(json!({
        "nodeSelector": {"matchLabels": {GROUP_LABEL: env.id, "kubernetes.io/hostname": node}},
        "reboot": {"command": fleet.reboot_command(), "remoteCommand": fleet.reboot_command()},
        "detect": {"periodSeconds": 5},
        "windows": [{"schedule": schedule, "duration": "1m", "timeZone": zone}],
    }))
    .expect("a policy spec");
    Api::<RebootPolicy>::all(env.client.clone())
        .create(&PostParams::default(), &RebootPolicy::new(&name, spec))
        .await
        .expect("creating the RebootPolicy");
    name
}

/// When each node's NodeMaintenance was first seen, by an independent
/// watch started before any could exist (until `stop` opens).
fn watch_maintenances(
    client: kube::Client,
    stop: Latch,
) -> Arc<Mutex<BTreeMap<String, Timestamp>>> {
    let seen: Arc<Mutex<BTreeMap<String, Timestamp>>> = Arc::default();
    let record = seen.clone();
    std::thread::spawn(move || {
        block_on(async move {
            let api: Api<NodeMaintenance> = Api::all(client);
            let watch = async {
                let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
                while let Some(ev) = events.next().await {
                    if let Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) = ev {
                        let at = m
                            .metadata
                            .creation_timestamp
                            .as_ref()
                            .map_or_else(Timestamp::now, |t| t.0);
                        let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
                        seen.entry(m.spec.node_name.clone()).or_insert(at);
                    }
                }
            };
            smol::future::or(watch, async { stop.wait().await }).await;
        })
    });
    seen
}

#[test]
fn scheduled_windows_in_two_zones_open_at_their_instant() {
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("win-zones").await;
        let names = nodes(&mut env, 2).await;
        let fleet = Fleet::new(env.client.clone(), None);
        (env, names, fleet)
    });
    let (a, b) = (&names[0], &names[1]);
    let stop = Latch::default();
    let seen = watch_maintenances(env.client.clone(), stop.clone());
    // The next whole minute at least 40 s away.
    let now = Timestamp::now();
    let minute = now.as_second().div_euclid(60) * 60 + 60;
    let mut opens = Timestamp::from_second(minute).expect("a time");
    if opens.duration_since(now) < SignedDuration::from_secs(40) {
        opens = opens
            .checked_add(SignedDuration::from_secs(60))
            .expect("a time");
    }
    let (pa, pb) = block_on(async {
        let pa = policy(&env, &fleet, a, "Asia/Kathmandu", opens).await;
        let pb = policy(&env, &fleet, b, "America/St_Johns", opens).await;
        for n in [a, b] {
            annotate(&env.client, n, "nodekeeper.io/reboot-needed", Some("now")).await;
        }
        (pa, pb)
    });
    let _cluster = cluster_role(&env, &[]);
    // Before the opening: both wait for the window, naming its instant.
    let policies: Api<RebootPolicy> = Api::all(env.client.clone());
    let says = format!("the next opens at {opens}");
    for (p, n) in [(&pa, a), (&pb, b)] {
        block_on(wait_for(
            &format!("{n} waiting for {opens}"),
            LONG,
            || async {
                let e = policies.get(p).await.ok()?.entry(n)?.clone();
                (e.phase == RebootPhase::Waiting
                    && e.message.as_deref().is_some_and(|m| m.contains(&says)))
                .then_some(())
            },
        ));
    }
    assert!(Timestamp::now() < opens, "the set-up took past the opening");
    // After it, both are rebooted; no maintenance was created before it.
    fleet.serve(&names, Duration::from_secs(150), || {
        block_on(settled(&env.client, &names))
    });
    stop.open();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for n in [a, b] {
        let at = seen.get(n.as_str()).copied();
        assert!(
            at.is_some_and(|t| t >= opens),
            "{n}: maintenance first seen at {at:?}, the window opens at {opens}"
        );
        assert_eq!(fleet.commands(n), 1, "{n} rebooted once");
    }
}
