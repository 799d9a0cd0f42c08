//! The one interpreter of [`Effect`]s: performs each against the API
//! server, with the guard the effect carries, and reports an [`Outcome`].
//! It holds no policy — what to retry, when, and what a refusal means are
//! decided in `decide/`; this module only speaks HTTP.
//!
//! [`evict`] sends a drain's evictions and deletions; [`lease`] holds the
//! medik8s node lease and the cluster role's leader lease.

pub mod events;
pub mod evict;
pub mod gate;
pub mod host;
pub mod host_run;
pub mod http;
pub mod lease;
mod objects;
pub use objects::{JOBS_GRANT, REPLACEMENT_GRANT};
pub mod prometheus;
pub mod provider;
pub mod talos;
pub mod talos_wire;

use crate::api::node::Node;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, Resource};
use serde_json::json;

use crate::api::nodemaintenance::NodeMaintenance;
use crate::decide::{Effect, HostAction, Outcome};
use crate::error::{Error, Result};

/// The field manager of every server-side apply: one name, so our status
/// fields are ours and a field we stop sending is removed.
pub const FIELD_MANAGER: &str = "nodekeeper";

/// What performs effects: the client, and the writer Events go through.
pub struct Interpreter {
    pub client: Client,
    pub events: events::Events,
    /// Evictions and deletions in flight at once, over every drain.
    pub evictions: evict::Permits,
    /// How host commands start (directly, or in the host's mount namespace).
    pub exec: host::Exec,
    /// Where host commands keep their records on the host
    /// (`run --command-records`, see [`host_run`]).
    pub records: std::path::PathBuf,
    /// Talos's machine API on this host (`run --talos-socket`): how a
    /// Talos node reboots and upgrades.
    pub talos: talos::Machined,
    /// The cloud provider plugin (`run --provider-command`), if any.
    pub provider: Option<provider::Provider>,
    /// The cluster role's leadership: no effect starts once its lease is in
    /// doubt (always open in the node role).
    pub gate: gate::LeaderGate,
}

impl Interpreter {
    /// Perform one effect. A write whose guard no longer holds fails with
    /// the API's 409; the caller decides again on a fresh snapshot.
    pub async fn perform(&self, effect: &Effect) -> Result<Outcome> {
        // Jobs, provider calls and host commands carry no resourceVersion a
        // new leader's writes would trip: nothing starts once the lease is
        // in doubt.
        let _running = self.gate.enter()?;
        match effect {
            Effect::PatchNode {
                node,
                resource_version,
                patch,
            } => self.patch_node(node, resource_version, patch).await,
            Effect::PatchNodeStatus { node, patch } => {
                let api: Api<Node> = Api::all(self.client.clone());
                let updated = api
                    .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .map_err(Error::kube(format!(
                        "updating the lifecycle conditions of node {node}"
                    )))?;
                Ok(Outcome::NodeWritten(Box::new(updated)))
            }
            Effect::WriteStatus {
                nm,
                resource_version,
                status,
                clear,
            } => self.write_status(nm, resource_version, status, clear).await,
            Effect::SetFinalizers {
                nm,
                resource_version,
                finalizers,
                owners,
            } => {
                self.set_finalizers(nm, resource_version, finalizers, owners.as_deref())
                    .await
            }
            Effect::TakeLease { node, node_uid } => {
                match lease::acquire_node_lease(&self.client, node, node_uid.clone()).await? {
                    lease::Acquired::Held { until } => Ok(Outcome::LeaseHeld { until }),
                    lease::Acquired::HeldBy(holder) => Ok(Outcome::LeaseHeldBy(holder)),
                }
            }
            Effect::ReleaseLease { node } => {
                lease::release_node_lease(&self.client, node).await?;
                Ok(Outcome::Done)
            }
            Effect::Drain { pods, grace_period } => Ok(Outcome::Drained(
                evict::drain_pods(&self.client, pods, *grace_period, &self.evictions).await,
            )),
            Effect::WritePolicyStatus {
                policy,
                resource_version,
                status,
            } => {
                self.write_policy_status(policy, resource_version, status)
                    .await
            }
            Effect::WriteUpgradeStatus {
                plan,
                resource_version,
                status,
            } => {
                let updated = self
                    .apply_status::<crate::api::upgrade::UpgradePlan>(
                        plan,
                        resource_version,
                        status,
                    )
                    .await?;
                Ok(Outcome::UpgradePlanWritten(Box::new(updated)))
            }
            Effect::CreateJob { job } => self.create_job(job).await,
            Effect::WriteMutexStatus {
                kind,
                namespace,
                name,
                resource_version,
                status,
            } => {
                self.write_mutex_status(*kind, namespace, name, resource_version, status)
                    .await
            }
            Effect::PatchPool { name, patch } => self.patch_pool(name, patch).await,
            Effect::RunHost {
                id,
                action,
                timeout,
                ..
            } => Ok(
                match match action {
                    HostAction::Remote(argv) => host::command(argv, *timeout).await,
                    HostAction::Command(argv) => {
                        host_run::command(id, argv, *timeout, self.exec, &self.records).await
                    }
                    HostAction::TalosReboot => self
                        .talos
                        .once(id, async {
                            self.talos.reboot(*timeout).await.map(|()| String::new())
                        })
                        .await
                        .map(drop),
                    HostAction::TalosUpgrade { image, legacy } => self
                        .talos
                        .once(id, self.talos.upgrade(image, *legacy, *timeout))
                        .await
                        .map(|last| {
                            log::info!("Talos upgrade to {image}: {last}");
                        }),
                } {
                    Ok(()) => Outcome::HostRan {
                        ok: true,
                        output: String::new(),
                    },
                    Err(output) => Outcome::HostRan { ok: false, output },
                },
            ),
            Effect::CreateMaintenance { nm } => self.create_maintenance(nm).await,
            Effect::DeleteMaintenance { nm, uid } => self.delete_maintenance(nm, uid).await,
            Effect::Provider { verb, request, .. } => match &self.provider {
                Some(p) => Ok(match p.call(verb, request).await {
                    Ok(v) => Outcome::ProviderAnswered(v),
                    Err(e) => Outcome::ProviderFailed(e),
                }),
                None => Ok(Outcome::ProviderFailed(
                    "no provider plugin: start nodekeeper with --provider-command".into(),
                )),
            },
            Effect::CreateObject { kind, object } => {
                objects::create(&self.client, *kind, object).await
            }
            Effect::PatchObject {
                kind,
                namespace,
                name,
                patch,
                status,
                strategic,
            } => {
                objects::patch(
                    &self.client,
                    *kind,
                    namespace.as_deref(),
                    name,
                    patch,
                    *status,
                    *strategic,
                )
                .await
            }
            Effect::WriteObjectStatus {
                kind,
                name,
                resource_version,
                status,
            } => objects::write_status(&self.client, *kind, name, resource_version, status).await,
            Effect::DeleteObject { kind, name, uid } => {
                objects::delete(&self.client, *kind, name, uid.as_deref()).await
            }
            Effect::DeleteNode { name, uid } => {
                objects::delete_node(&self.client, name, uid.as_deref()).await
            }
            Effect::Event {
                object,
                warning,
                reason,
                note,
            } => {
                self.publish(object, *warning, reason, note).await;
                Ok(Outcome::Done)
            }
        }
    }

    /// Merge-patch a node. Taints are a list a merge patch replaces whole,
    /// so a concurrent change must not be lost: the patch carries the
    /// resourceVersion it was decided on.
    async fn patch_node(
        &self,
        node: &str,
        resource_version: &Option<String>,
        patch: &serde_json::Value,
    ) -> Result<Outcome> {
        let mut body = patch.clone();
        body["metadata"]["resourceVersion"] = json!(resource_version);
        let api: Api<Node> = Api::all(self.client.clone());
        let updated = api
            .patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(Error::kube(format!("updating node {node}")))?;
        Ok(Outcome::NodeWritten(Box::new(updated)))
    }

    /// Server-side apply of the whole status, with `clear`'s keys null (see
    /// [`Effect::WriteStatus`]).
    async fn write_status(
        &self,
        nm: &str,
        resource_version: &Option<String>,
        status: &crate::api::nodemaintenance::NodeMaintenanceStatus,
        clear: &[String],
    ) -> Result<Outcome> {
        let mut status = json!(status);
        for key in clear {
            status[key.as_str()] = serde_json::Value::Null;
        }
        let body = json!({
            "apiVersion": NodeMaintenance::api_version(&()),
            "kind": NodeMaintenance::kind(&()),
            "metadata": { "name": nm, "resourceVersion": resource_version },
            "status": status,
        });
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let updated = api
            .patch_status(
                nm,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(Error::kube(format!(
                "writing status of NodeMaintenance {nm}"
            )))?;
        Ok(Outcome::MaintenanceWritten(Box::new(updated)))
    }

    /// Server-side apply of a RebootPolicy's whole status, guarded by the
    /// resourceVersion the admissions in it were decided on.
    async fn write_policy_status(
        &self,
        policy: &str,
        resource_version: &Option<String>,
        status: &crate::api::reboot::RebootPolicyStatus,
    ) -> Result<Outcome> {
        let updated = self
            .apply_status::<crate::api::reboot::RebootPolicy>(policy, resource_version, status)
            .await?;
        Ok(Outcome::PolicyWritten(Box::new(updated)))
    }

    /// Server-side apply of a cluster-scoped feature object's whole status,
    /// guarded by the resourceVersion it was decided on.
    async fn apply_status<K>(
        &self,
        name: &str,
        resource_version: &Option<String>,
        status: &impl serde::Serialize,
    ) -> Result<K>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
    {
        let body = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": { "name": name, "resourceVersion": resource_version },
            "status": status,
        });
        let api: Api<K> = Api::all(self.client.clone());
        api.patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(Error::kube(format!(
            "writing status of {} {name}",
            K::kind(&())
        )))
    }

    /// Server-side apply of a mutex operator object's status (namespaced;
    /// untyped, as the mutex kinds are watched).
    async fn write_mutex_status(
        &self,
        kind: crate::decide::mutex::Kind,
        namespace: &str,
        name: &str,
        resource_version: &Option<String>,
        status: &serde_json::Value,
    ) -> Result<Outcome> {
        use crate::api::mutex::{MutexRule, MutexRunConfig, MutexTarget};
        use crate::decide::mutex::Kind;
        let ar = match kind {
            Kind::Rule => kube::api::ApiResource::erase::<MutexRule>(&()),
            Kind::Target => kube::api::ApiResource::erase::<MutexTarget>(&()),
            Kind::RunConfig => kube::api::ApiResource::erase::<MutexRunConfig>(&()),
        };
        let body = json!({
            "apiVersion": ar.api_version,
            "kind": ar.kind,
            "metadata": { "name": name, "namespace": namespace, "resourceVersion": resource_version },
            "status": status,
        });
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &ar);
        api.patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(Error::kube(format!(
            "writing status of {} {namespace}/{name}",
            ar.kind
        )))?;
        Ok(Outcome::Done)
    }

    /// Merge-patch a MachineConfigPool.
    async fn patch_pool(&self, name: &str, patch: &serde_json::Value) -> Result<Outcome> {
        let api: Api<kube::api::DynamicObject> =
            Api::all_with(self.client.clone(), &crate::api::mutex::pool_resource());
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(Error::kube(format!("patching MachineConfigPool {name}")))?;
        Ok(Outcome::Done)
    }

    /// Create a hook Job. A 409 is our own earlier create; a refusal the
    /// Job cannot outgrow (invalid, forbidden, no such namespace) comes
    /// back as [`Outcome::JobRefused`] for the plan to report.
    async fn create_job(&self, job: &kube::api::DynamicObject) -> Result<Outcome> {
        let ns = job.metadata.namespace.as_deref().unwrap_or("default");
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let ar = kube::api::ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&());
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &ar);
        match api.create(&PostParams::default(), job).await {
            Ok(_) => Ok(Outcome::Done),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Done),
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 404 | 422) => {
                let hint = objects::ungranted(&kube::Error::Api(s.clone()), objects::JOBS_GRANT);
                Ok(Outcome::JobRefused(format!(
                    "{} ({}){hint}",
                    s.message, s.code
                )))
            }
            Err(e) => Err(Error::kube(format!("creating Job {ns}/{name}"))(e)),
        }
    }

    async fn set_finalizers(
        &self,
        nm: &str,
        resource_version: &Option<String>,
        finalizers: &[String],
        owners: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]>,
    ) -> Result<Outcome> {
        let mut meta = json!({ "resourceVersion": resource_version, "finalizers": finalizers });
        if let Some(o) = owners {
            meta["ownerReferences"] = json!(o);
        }
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        match api
            .patch(
                nm,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": meta })),
            )
            .await
        {
            // The last finalizer of a deleting object: the server deleted
            // it and answered with the version it deleted, which still
            // lists the finalizer. Remembering that as "written" would have
            // us finish it again until the watch said it was gone (never,
            // during a shutdown).
            Ok(updated)
                if finalizers.is_empty() && updated.metadata.deletion_timestamp.is_some() =>
            {
                Ok(Outcome::MaintenanceGone {
                    name: nm.to_string(),
                    resource_version: updated.metadata.resource_version,
                })
            }
            Ok(updated) => Ok(Outcome::MaintenanceWritten(Box::new(updated))),
            // Finalizer already gone and the object with it.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Outcome::MaintenanceGone {
                name: nm.to_string(),
                resource_version: resource_version.clone(),
            }),
            Err(e) => Err(Error::kube(format!("updating NodeMaintenance {nm}"))(e)),
        }
    }

    async fn create_maintenance(&self, nm: &NodeMaintenance) -> Result<Outcome> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), nm).await {
            Ok(created) => Ok(Outcome::MaintenanceWritten(Box::new(created))),
            // Created before (a crash between create and record).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Done),
            Err(e) => Err(Error::kube(format!(
                "creating NodeMaintenance {}",
                nm.metadata.name.as_deref().unwrap_or_default()
            ))(e)),
        }
    }

    /// Delete only the object with this UID: a new one of the same name is
    /// someone else's.
    async fn delete_maintenance(&self, nm: &str, uid: &str) -> Result<Outcome> {
        let api: Api<NodeMaintenance> = Api::all(self.client.clone());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(nm, &dp).await {
            Ok(_) => Ok(Outcome::Done),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Outcome::Done),
            Err(e) => Err(Error::kube(format!("deleting NodeMaintenance {nm}"))(e)),
        }
    }

    /// An event that cannot be published must not undo the work it
    /// describes: it is logged and the plan goes on.
    async fn publish(
        &self,
        object: &k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) {
        if let Err(e) = self.events.publish(object, warning, reason, note).await {
            log::warn!(
                "publishing event {reason}: {}",
                crate::error::kube_cause(&e)
            );
        }
    }
}

/// One line per effect for debug logs, without a drain's pod bulk.
pub fn describe(effect: &Effect) -> String {
    match effect {
        Effect::Drain { pods, grace_period } => format!(
            "Drain {{ pods: {}, grace_period: {grace_period:?} }}",
            pods.len()
        ),
        Effect::WriteStatus { nm, status, .. } => format!(
            "WriteStatus {{ nm: {nm:?}, phase: {:?} }}",
            status.phase.map(|p| p.as_str())
        ),
        Effect::WritePolicyStatus { policy, status, .. } => format!(
            "WritePolicyStatus {{ policy: {policy:?}, nodes: {} }}",
            status.nodes.len()
        ),
        Effect::WriteUpgradeStatus { plan, status, .. } => format!(
            "WriteUpgradeStatus {{ plan: {plan:?}, nodes: {} }}",
            status.nodes.len()
        ),
        Effect::CreateJob { job } => format!(
            "CreateJob {{ {}/{} }}",
            job.metadata.namespace.as_deref().unwrap_or_default(),
            job.metadata.name.as_deref().unwrap_or_default()
        ),
        Effect::PatchNodeStatus { node, patch } => {
            format!("PatchNodeStatus {{ node: {node:?}, patch: {patch} }}")
        }
        Effect::PatchNode { node, patch, .. } => {
            format!("PatchNode {{ node: {node:?}, patch: {patch} }}")
        }
        Effect::SetFinalizers { nm, finalizers, .. } => {
            format!(
                "SetFinalizers {{ nm: {nm}, finalizers: {} }}",
                finalizers.join(",")
            )
        }
        Effect::TakeLease { node, .. } => format!("TakeLease {{ node: {node} }}"),
        Effect::ReleaseLease { node } => format!("ReleaseLease {{ node: {node} }}"),
        Effect::CreateMaintenance { nm } => format!(
            "CreateMaintenance {{ {} for node {} }}",
            nm.metadata.name.as_deref().unwrap_or_default(),
            nm.spec.node_name
        ),
        Effect::DeleteMaintenance { nm, .. } => format!("DeleteMaintenance {{ {nm} }}"),
        Effect::RunHost { node, action, .. } => {
            format!("RunHost {{ node: {node}, {action} }}")
        }
        Effect::WriteMutexStatus {
            name, namespace, ..
        } => {
            format!("WriteMutexStatus {{ {namespace}/{name} }}")
        }
        Effect::PatchPool { name, patch } => format!("PatchPool {{ {name}: {patch} }}"),
        Effect::Provider { verb, request, .. } => format!("Provider {{ {verb} {request} }}"),
        Effect::CreateObject { kind, object } => {
            format!("CreateObject {{ {}: {object} }}", kind.name())
        }
        Effect::PatchObject {
            kind, name, patch, ..
        } => {
            format!("PatchObject {{ {} {name}: {patch} }}", kind.name())
        }
        Effect::WriteObjectStatus {
            kind, name, status, ..
        } => {
            format!("WriteObjectStatus {{ {} {name}: {status} }}", kind.name())
        }
        Effect::DeleteObject { kind, name, .. } => {
            format!("DeleteObject {{ {} {name} }}", kind.name())
        }
        Effect::DeleteNode { name, .. } => format!("DeleteNode {{ {name} }}"),
        Effect::Event {
            reason,
            note,
            object,
            ..
        } => format!(
            "Event {{ {reason} on {}: {note} }}",
            object.name.as_deref().unwrap_or_default()
        ),
    }
}
