//! The interpreter against the real API server: effects that features use
//! to take and give back a node carry their guards, and a repeated effect
//! (a crash between performing and recording) is harmless.

mod support;

use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, ResourceExt};
use nodekeeper::api::nodemaintenance::{NodeMaintenance, NodeMaintenanceSpec, OWNER_LABEL};
use nodekeeper::decide::{Effect, Outcome};
use nodekeeper::effects::Interpreter;
use support::{TestEnv, block_on, install_crds};

#[test]
fn taking_and_giving_back_a_node_through_an_owned_maintenance_is_guarded_and_idempotent() {
    block_on(async {
        install_crds();
        let env = TestEnv::new("effects").await;
        let effects = Interpreter {
            client: env.client.clone(),
            recorder: Recorder::new(
                env.client.clone(),
                Reporter {
                    controller: "nodekeeper-test".into(),
                    instance: None,
                },
            ),
            evictions_in_flight: nodekeeper::effects::evict::HTTP2_IN_FLIGHT,
            exec: nodekeeper::effects::host::Exec::Direct,
            provider: None,
        };
        let name = format!("{}-owned", env.id);
        let mut nm = NodeMaintenance::new(
            &name,
            NodeMaintenanceSpec {
                // No such node: nothing acts on it but this test.
                node_name: format!("{}-nowhere", env.id),
                reason: Some("RebootPolicy weekly".into()),
            },
        );
        nm.metadata.labels = Some([(OWNER_LABEL.to_string(), "RebootPolicy".to_string())].into());
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
