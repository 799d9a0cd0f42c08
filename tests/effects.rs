//! The interpreter against the real API server: effects that features use
//! to take and give back a node carry their guards, and a repeated effect
//! (a crash between performing and recording) is harmless.

use crate::support;

use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, OWNER_LABEL};
use nodekeeper::decide::{Effect, Outcome};
use support::{TestEnv, block_on, install_crds};

#[test]
fn taking_and_giving_back_a_node_through_an_owned_maintenance_is_guarded_and_idempotent() {
    block_on(async {
        install_crds();
        let env = TestEnv::new("effects").await;
        let effects = support::interpreter(
            env.client.clone(),
            nodekeeper::effects::talos::Machined::new(support::scratch().join("no-machined.sock")),
        );
        let name = format!("{}-owned", env.id);
        let mut nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                // No such node: nothing acts on it but this test.
                node_name: format!("{}-nowhere", env.id),
                reason: Some("EffectsTest weekly".into()),
            },
        );
        // Owned by a kind no feature has: a RebootPolicy-owned maintenance
        // whose policy does not exist is an orphan, and a cluster role of
        // another test in the lane gave it back between this test's steps
        // ("a stale delete removed it", seen once in the gate).
        nm.metadata.labels = Some([(OWNER_LABEL.to_string(), "EffectsTest".to_string())].into());
        let create = Effect::CreateMaintenance {
            nm: Box::new(nm.clone()),
        };
        let created = match effects.perform(&create).await {
            Ok(Outcome::MaintenanceWritten(created)) => created,
            other => panic!("creating the owned maintenance: {other:?}"),
        };
        // Performed again (as after a crash before recording it): no error.
        assert!(matches!(effects.perform(&create).await, Ok(Outcome::Done)));

        let api: Api<NodeMaintenance> = Api::all(env.client.clone());
        // A delete guarded by another UID leaves the object alone.
        let stale = Effect::DeleteMaintenance {
            nm: name.clone(),
            uid: "00000000-0000-0000-0000-000000000000".into(),
        };
        assert!(matches!(effects.perform(&stale).await, Ok(Outcome::Done)));
        assert!(
            api.get_opt(&name).await.ok().flatten().is_some(),
            "a stale delete removed it"
        );

        let delete = Effect::DeleteMaintenance {
            nm: name.clone(),
            uid: created.uid().unwrap_or_default(),
        };
        assert!(matches!(effects.perform(&delete).await, Ok(Outcome::Done)));
        assert!(
            api.get_opt(&name).await.ok().flatten().is_none(),
            "not deleted"
        );
        // Again, once it is gone: harmless.
        assert!(matches!(effects.perform(&delete).await, Ok(Outcome::Done)));
    })
}

/// Events as `kubectl describe` reads them: a repeat on a newer version of
/// the same object counts on the first Event's series; another note is
/// another Event.
#[test]
fn a_repeated_event_is_one_event_with_a_series_count() {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
    use kube::api::ListParams;
    block_on(async {
        let env = TestEnv::new("events").await;
        let events =
            nodekeeper::effects::events::Events::new(env.client.clone(), "nodekeeper-test", None);
        let uid = format!("{}-uid", env.id);
        let mut object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some(env.ns.clone()),
            name: Some("subject".into()),
            uid: Some(uid.clone()),
            resource_version: Some("1".into()),
            ..Default::default()
        };
        for rv in ["1", "2", "3"] {
            object.resource_version = Some(rv.into());
            events
                .publish(&object, false, "Tested", "the same note")
                .await
                .expect("publishing a repeat");
        }
        events
            .publish(&object, true, "Tested", "another note")
            .await
            .expect("publishing another note");
        let api: Api<CoreEvent> = Api::namespaced(env.client.clone(), &env.ns);
        let lp = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
        let mut seen: Vec<(String, String, usize)> = api
            .list(&lp)
            .await
            .expect("listing events")
            .items
            .into_iter()
            .map(|e| {
                let count = support::event_count(&e);
                (
                    e.type_.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                    count,
                )
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                ("Normal".into(), "the same note".into(), 3),
                ("Warning".into(), "another note".into(), 1),
            ]
        );
    });
}
