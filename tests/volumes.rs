//! Volumes before power on the real control plane: a reboot's command
//! waits until the volumes of the pods its drain evicted are detached, and
//! not for the volume of a pod that stays. The test plays the attach/detach
//! controller (the test control plane runs without it): it writes the
//! VolumeAttachments, their `status.attached` and the node's
//! `status.volumesAttached` as that controller and a CSI attacher do, and
//! takes them away in their order (the node's entry first, the attachment
//! when the driver has detached). One volume is not CSI (a Fibre Channel
//! disk, attached by the in-tree plugin): the node lists it and no
//! VolumeAttachment exists, so only `volumesAttached` can hold the reboot.
//! Whether the command ran is the simulated machine's own record, not
//! nodekeeper's status.

use crate::support;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use nodekeeper::api::nodemaintenance::NodeMaintenance;
use serde_json::json;
use support::machines::*;
use support::{TestEnv, block_on, install_crds, wait_for};

const DRIVER: &str = "csi.nodekeeper.test";

/// A CSI volume bound to claim `ns/claim`, attached to `node`: its
/// PersistentVolume, its VolumeAttachment (attached), named `<id>-<claim>`.
async fn attach(env: &TestEnv, node: &str, claim: &str) -> String {
    let name = format!("{}-{claim}", env.id);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": env.ns, "name": claim},
            "csi": {"driver": DRIVER, "volumeHandle": name},
        }
    }))
    .expect("a PersistentVolume");
    Api::<PersistentVolume>::all(env.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("creating the PersistentVolume");
    let vas: Api<VolumeAttachment> = Api::all(env.client.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": name}},
    }))
    .expect("a VolumeAttachment");
    vas.create(&PostParams::default(), &va)
        .await
        .expect("creating the VolumeAttachment");
    vas.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"attached": true}})),
    )
    .await
    .expect("marking it attached");
    name
}

/// A Fibre Channel disk's name in `volumesAttached`, as the in-tree `fc`
/// plugin gives it (`<wwn>-lun-<lun>`); it has no VolumeAttachment.
const FC_DISK: &str = "kubernetes.io/fc/50060e801049cfd1-lun-0";

/// The node's `status.volumesAttached`, as the attach/detach controller
/// writes it: one entry per CSI volume in `volumes`, and the Fibre Channel
/// disk when `fc`.
async fn node_lists(env: &TestEnv, node: &str, volumes: &[&str], fc: bool) {
    let mut entries: Vec<_> = volumes
        .iter()
        .map(|v| json!({"name": format!("kubernetes.io/csi/{DRIVER}^{v}"), "devicePath": ""}))
        .collect();
    if fc {
        entries.push(json!({"name": FC_DISK, "devicePath": "/dev/sdb"}));
    }
    Api::<Node>::all(env.client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesAttached": entries}})),
        )
        .await
        .expect("writing the node's attached volumes");
}

/// The driver has detached `volume`: its attachment goes.
async fn detached(env: &TestEnv, volume: &str) {
    Api::<VolumeAttachment>::all(env.client.clone())
        .delete(volume, &DeleteParams::default())
        .await
        .expect("deleting the VolumeAttachment");
}

/// How nodekeeper's message names a claim's volume.
fn claim(env: &TestEnv, name: &str) -> String {
    format!("claim {}/{name} ", env.ns)
}

/// The reboot's NodeMaintenance on `node` says it waits for these volumes
/// and not for those in `not` (by the message nodekeeper writes, which only
/// says when to look); meanwhile the machine's own record shows no reboot
/// command.
async fn waiting_for(fleet: &Fleet, node: &str, want: &[&str], not: &[&str]) {
    let nms: Api<NodeMaintenance> = Api::all(fleet.client.clone());
    wait_for(
        "the reboot's maintenance waiting for volumes",
        LONG,
        || async {
            assert_eq!(
                fleet.commands(node),
                0,
                "rebooted with volumes of evicted pods attached"
            );
            let list = nms.list(&Default::default()).await.ok()?;
            let m = list.items.into_iter().find(|m| m.spec.node_name == node)?;
            let c = m.condition("VolumesDetached")?;
            let ok = c.status == "False"
                && want.iter().all(|x| c.message.contains(x))
                && not.iter().all(|x| !c.message.contains(x));
            ok.then_some(())
        },
    )
    .await;
}

#[test]
fn a_reboot_waits_for_the_evicted_pods_volumes_to_detach_and_not_for_those_that_stay() {
    install_crds();
    let (env, names, fleet) = block_on(async {
        let mut env = TestEnv::new("vol-detach").await;
        let names = nodes(&mut env, 2).await;
        let fleet = Fleet::new(env.client.clone(), None);
        (env, names, fleet)
    });
    let a = &names[0];
    let (data, cache, logs) = block_on(async {
        let data = attach(&env, a, "data").await;
        let cache = attach(&env, a, "cache").await;
        let logs = attach(&env, a, "logs").await;
        node_lists(&env, a, &[&data, &cache, &logs], true).await;
        // A log shipper the drain leaves on the node (a DrainRule's skip
        // label), mounting claim "logs": its volume stays attached.
        let shipper: Pod = serde_json::from_value(json!({
            "metadata": {"name": "shipper", "labels": {"nodekeeper.io/drain": "skip"}},
            "spec": {
                "nodeName": a,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                "volumes": [{"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}}],
            }
        }))
        .expect("a pod");
        Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .create(&PostParams::default(), &shipper)
            .await
            .expect("creating the shipper pod");
        (data, cache, logs)
    });
    block_on(create_policy(&env, &fleet, json!({})));
    let cluster = cluster_role(&env, &[]);
    block_on(annotate(
        &env.client,
        a,
        "nodekeeper.io/reboot-needed",
        Some("now"),
    ));

    let [c_data, c_cache, c_logs] = ["data", "cache", "logs"].map(|x| claim(&env, x));
    // Drained, the reboot waits for data, cache and the disk, not for logs.
    block_on(waiting_for(
        &fleet,
        a,
        &[&c_data, &c_cache, FC_DISK],
        &[&c_logs],
    ));
    assert_eq!(
        fleet.commands(a),
        0,
        "no reboot with three volumes attached"
    );
    // The controller takes data and cache off the node's list; the driver
    // detaches data only. nodekeeper looks again and still waits: cache's
    // attachment and the disk hold the reboot.
    block_on(async {
        node_lists(&env, a, &[&logs], true).await;
        detached(&env, &data).await;
        waiting_for(&fleet, a, &[&c_cache, FC_DISK], &[&c_data, &c_logs]).await;
    });
    // The driver detaches cache: the disk alone, known only from the
    // node's list, holds the reboot.
    block_on(async {
        detached(&env, &cache).await;
        waiting_for(&fleet, a, &[FC_DISK], &[&c_data, &c_cache, &c_logs]).await;
    });
    assert_eq!(
        fleet.commands(a),
        0,
        "no reboot while the Fibre Channel disk is attached"
    );
    block_on(node_lists(&env, a, &[&logs], false));
    fleet.serve(&names[..1], LONG, || {
        block_on(settled(&env.client, &names[..1]))
    });
    assert_eq!(
        fleet.commands(a),
        1,
        "rebooted once, with the shipper's volume still attached\n{}",
        cluster.log_text()
    );
    // The shipper's attachment was there all along.
    let still = block_on(async {
        Api::<VolumeAttachment>::all(env.client.clone())
            .get_opt(&logs)
            .await
            .expect("reading the shipper's attachment")
    });
    assert!(still.is_some());
    block_on(async {
        let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
        for v in [&data, &cache, &logs] {
            let _ = Api::<VolumeAttachment>::all(env.client.clone())
                .delete(v, &DeleteParams::default())
                .await;
            let _ = pvs.delete(v, &DeleteParams::default()).await;
        }
        wait_for("nothing in maintenance", LONG, || async {
            (maintenances_on(&env.client, a).await == 0).then_some(())
        })
        .await;
    });
}
